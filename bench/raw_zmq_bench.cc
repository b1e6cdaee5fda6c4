// raw_zmq_bench: the baseline for the push/pull benchmark. Plain ZeroMQ between
// two processes (this one forks a receiver) over tcp://127.0.0.1, with
// zero-copy sends of a preallocated buffer (zmq_msg_init_data, no-op free).
//
// Modes, for every message size:
//   stream      PUSH -> PULL, the sender never waits; one repeat ends with a
//               marker the receiver acknowledges on a back channel, so the
//               time covers delivery of every byte.
//   sequential  DEALER -> ROUTER, one message, then wait for a 1-byte ack.
//   handoff     as sequential, but each next message is sent by a second
//               thread that the receiving one wakes through a condition
//               variable: one thread hand-off per message, as a Tessera
//               worker has between its delivery thread and the waiting
//               caller. Not run by default; it measures what that hand-off
//               costs on this machine.
//   inflight8   DEALER -> ROUTER, 8 un-acknowledged messages outstanding.
// Each repeat lasts at least --min_seconds and --min_messages; the result of
// a (size, mode) is the median MB/s (1 MB = 1e6 bytes of payload) of
// --repeats repeats after one warm-up repeat.
//
// --receiver_work accumulate makes the receiver add each payload into a row
// of floats before acking, the work a Tessera server does for a push;
// --receiver_work copy makes it copy each payload into the next of 8
// buffers, the work a Tessera worker's Pull does with each reply.
// --keep_allocations_mapped gives both processes the allocator settings of
// Tessera's binaries (large blocks from an untrimmed heap, so that libzmq's
// receive buffers do not fault in again for every message).
//
// Around every repeat the sender probes how close the two CPUs are
// (bench/cpu_pair_probe.h): probe_ns[r] is measured before repeat r, the
// last entry after the last repeat; -1 where the probe cannot run.
//
// Output: a human-readable line per (size, mode) on stderr, and one JSON
// object on stdout (or in --json FILE):
//   {"sizes":[...],"results":[{"size":4096,"mode":"stream","median_mbps":...,"mbps":[...],
//                              "probe_ns":[...]}]}
// Exit status 0 on success, 1 on any failure (with one line saying why).
#include <signal.h>
#include <malloc.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/cpu_pair_probe.h"
#include "common/memory.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMarker = 'M';  // end of a stream repeat (a 1-byte message)
constexpr char kQuit = 'Q';    // the receiver exits
constexpr int kInflight = 8;

struct Flags {
  std::vector<size_t> sizes = {4096, 1 << 20, 16 << 20};
  std::vector<std::string> modes = {"stream", "sequential", "inflight8"};
  int repeats = 5;
  double min_seconds = 0.5;
  uint64_t min_messages = 20;
  std::string json_path;
  std::string receiver_work = "none";
  bool keep_allocations_mapped = false;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "raw_zmq_bench: %s: %s\n", what.c_str(), zmq_strerror(zmq_errno()));
  std::exit(1);
}

void Check(int rc, const char* what) {
  if (rc < 0) Die(what);
}

void NoFree(void*, void*) {}

// Sends `size` bytes of `buffer` without copying them.
void SendZeroCopy(void* socket, char* buffer, size_t size, int flags = 0) {
  zmq_msg_t msg;
  Check(zmq_msg_init_data(&msg, buffer, size, NoFree, nullptr), "zmq_msg_init_data");
  if (zmq_msg_send(&msg, socket, flags) < 0) {
    zmq_msg_close(&msg);
    Die("zmq_msg_send");
  }
}

void SendSmall(void* socket, char byte, int flags = 0) { Check(zmq_send(socket, &byte, 1, flags), "zmq_send"); }

// What the receiver does with a payload before it frees (and acks) it: the
// work a Tessera process must do with the bytes, which a plain ZeroMQ
// receiver skips. Each shows how much of a gap between raw ZeroMQ and
// Tessera is that work itself.
// - accumulate: adds the payload as floats into a row of the same size, as
//   a Tessera server does for a push to an ACCUMULATE table;
// - copy: copies the payload into the next of kInflight buffers of its size,
//   in turn, as a Tessera worker's Pull copies each reply into the caller's
//   buffer (the push/pull driver pulls into one buffer per request in
//   flight).
enum class ReceiverWork { kNone, kAccumulate, kCopy };

class PayloadWork {
 public:
  explicit PayloadWork(ReceiverWork work) : work_(work) {}

  void Do(const void* data, size_t size) {
    if (work_ == ReceiverWork::kAccumulate) {
      const size_t n = size / sizeof(float);
      if (row_.size() < n) row_.resize(n, 0.0f);
      const float* g = static_cast<const float*>(data);
      float* row = row_.data();
      for (size_t i = 0; i < n; ++i) row[i] += g[i];
    } else if (work_ == ReceiverWork::kCopy) {
      if (copies_.empty()) copies_.resize(kInflight);
      std::vector<char>& to = copies_[next_copy_++ % copies_.size()];
      if (to.size() < size) to.resize(size);
      std::memcpy(to.data(), data, size);
    }
  }

 private:
  const ReceiverWork work_;
  std::vector<float> row_;                 // accumulate
  std::vector<std::vector<char>> copies_;  // copy
  size_t next_copy_ = 0;
};

// Receives one frame; returns its size and, for 1-byte frames, its byte.
// With `work`, does it with the payload first.
size_t Receive(void* socket, char* first_byte = nullptr, PayloadWork* work = nullptr) {
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  if (zmq_msg_recv(&msg, socket, 0) < 0) Die("zmq_msg_recv");
  const size_t size = zmq_msg_size(&msg);
  if (first_byte && size > 0) *first_byte = *static_cast<char*>(zmq_msg_data(&msg));
  if (work && size > 1) work->Do(zmq_msg_data(&msg), size);
  zmq_msg_close(&msg);
  return size;
}

std::string LastEndpoint(void* socket) {
  char endpoint[256];
  size_t len = sizeof(endpoint);
  Check(zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, endpoint, &len), "ZMQ_LAST_ENDPOINT");
  return std::string(endpoint);
}

void* BoundSocket(void* ctx, int type, int rcvhwm = 1000) {
  void* s = zmq_socket(ctx, type);
  if (!s) Die("zmq_socket");
  int linger = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_setsockopt(s, ZMQ_RCVHWM, &rcvhwm, sizeof(rcvhwm));
  Check(zmq_bind(s, "tcp://127.0.0.1:*"), "zmq_bind");
  return s;
}

// Messages a stream channel may queue on each side: about 64 MiB, so that a
// repeat's closing marker is never stuck behind gigabytes of queued data.
int StreamHwm(size_t size) { return static_cast<int>(std::clamp<size_t>((64u << 20) / size, 4, 1000)); }

// The receiving process: one PULL per message size (stream data, its
// receive queue bounded by StreamHwm), a PUSH (stream acks) and a ROUTER
// (request/ack). Writes its endpoints, one per line, to `report_fd`: the
// PULLs in the order of `sizes`, then the PUSH, then the ROUTER.
int RunReceiver(const std::vector<size_t>& sizes, ReceiverWork work, int report_fd) {
  PayloadWork payload_work(work);
  PayloadWork* payload = work == ReceiverWork::kNone ? nullptr : &payload_work;
  void* ctx = zmq_ctx_new();
  std::vector<void*> pulls;
  for (size_t size : sizes) pulls.push_back(BoundSocket(ctx, ZMQ_PULL, StreamHwm(size)));
  void* back = BoundSocket(ctx, ZMQ_PUSH);
  void* router = BoundSocket(ctx, ZMQ_ROUTER);
  std::string endpoints;
  for (void* pull : pulls) endpoints += LastEndpoint(pull) + "\n";
  endpoints += LastEndpoint(back) + "\n" + LastEndpoint(router) + "\n";
  if (write(report_fd, endpoints.data(), endpoints.size()) != static_cast<ssize_t>(endpoints.size())) {
    std::perror("raw_zmq_bench receiver: write");
    return 1;
  }
  close(report_fd);

  std::vector<zmq_pollitem_t> items;
  for (void* pull : pulls) items.push_back({pull, 0, ZMQ_POLLIN, 0});
  items.push_back({router, 0, ZMQ_POLLIN, 0});
  for (bool quit = false; !quit;) {
    Check(zmq_poll(items.data(), static_cast<int>(items.size()), -1), "zmq_poll");
    for (size_t i = 0; i < pulls.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      char byte = 0;
      if (Receive(pulls[i], &byte, payload) == 1) {
        if (byte == kQuit) quit = true;
        if (byte == kMarker) SendSmall(back, kMarker);
      }
    }
    if (items.back().revents & ZMQ_POLLIN) {
      // [identity][payload] -> [identity][ack]
      zmq_msg_t identity;
      zmq_msg_init(&identity);
      if (zmq_msg_recv(&identity, router, 0) < 0) Die("router recv");
      Receive(router, nullptr, payload);
      if (zmq_msg_send(&identity, router, ZMQ_SNDMORE) < 0) Die("router send");
      SendSmall(router, 'A');
    }
  }
  for (void* pull : pulls) zmq_close(pull);
  zmq_close(back);
  zmq_close(router);
  zmq_ctx_term(ctx);
  return 0;
}

class Sender {
 public:
  // `endpoints` as written by RunReceiver for the same `sizes`.
  Sender(const std::vector<size_t>& sizes, const std::vector<std::string>& endpoints)
      : buffer_(*std::max_element(sizes.begin(), sizes.end()), 'x') {
    ctx_ = zmq_ctx_new();
    for (size_t i = 0; i < sizes.size(); ++i) {
      void* push = Connected(ZMQ_PUSH, endpoints[i], StreamHwm(sizes[i]));
      int linger_ms = 2000;  // the final quit message must get out
      zmq_setsockopt(push, ZMQ_LINGER, &linger_ms, sizeof(linger_ms));
      pushes_.push_back(push);
    }
    back_ = Connected(ZMQ_PULL, endpoints[sizes.size()]);
    dealer_ = Connected(ZMQ_DEALER, endpoints[sizes.size() + 1]);
  }
  ~Sender() {
    SendSmall(pushes_[0], kQuit);
    for (void* push : pushes_) zmq_close(push);
    zmq_close(back_);
    zmq_close(dealer_);
    zmq_ctx_term(ctx_);
  }

  // One repeat of `mode` with messages of sizes[size_index]; returns MB/s of payload.
  double Repeat(const std::string& mode, size_t size_index, size_t size, double min_seconds,
                uint64_t min_messages) {
    const Clock::time_point start = Clock::now();
    const auto keep_going = [&](uint64_t sent) {
      return sent < min_messages ||
             std::chrono::duration<double>(Clock::now() - start).count() < min_seconds;
    };
    uint64_t messages = 0;
    if (mode == "stream") {
      void* push = pushes_[size_index];
      while (keep_going(messages)) {
        SendZeroCopy(push, buffer_.data(), size);
        ++messages;
      }
      SendSmall(push, kMarker);
      Receive(back_);
    } else if (mode == "handoff") {
      // The receiving thread (this one) wakes the sending one for every next
      // message. The two never use the DEALER at once: each send happens
      // after the ack it follows was received, and the condition variable's
      // mutex orders them.
      std::mutex mu;
      std::condition_variable cv;
      uint64_t go = 1;  // sends the sending thread has been asked for
      bool stop = false;
      std::thread sending([&] {
        for (uint64_t done = 0;;) {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return go != done || stop; });
          if (stop) return;
          done = go;
          lock.unlock();
          SendZeroCopy(dealer_, buffer_.data(), size);
        }
      });
      cv.notify_all();
      for (uint64_t sent = 1;; ++sent) {
        Receive(dealer_);
        ++messages;
        std::lock_guard lock(mu);
        if (!keep_going(sent)) {
          stop = true;
        } else {
          ++go;
        }
        cv.notify_all();
        if (stop) break;
      }
      sending.join();
    } else {
      const int window = mode == "sequential" ? 1 : kInflight;
      int outstanding = 0;
      uint64_t sent = 0;
      while (outstanding < window && keep_going(sent)) {
        SendZeroCopy(dealer_, buffer_.data(), size);
        ++sent;
        ++outstanding;
      }
      while (outstanding > 0) {
        Receive(dealer_);
        --outstanding;
        ++messages;
        if (keep_going(sent)) {
          SendZeroCopy(dealer_, buffer_.data(), size);
          ++sent;
          ++outstanding;
        }
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return static_cast<double>(messages) * static_cast<double>(size) / seconds / 1e6;
  }

 private:
  void* Connected(int type, const std::string& endpoint, int sndhwm = 1000) {
    void* s = zmq_socket(ctx_, type);
    if (!s) Die("zmq_socket");
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(s, ZMQ_SNDHWM, &sndhwm, sizeof(sndhwm));
    Check(zmq_connect(s, endpoint.c_str()), "zmq_connect");
    return s;
  }

  std::vector<char> buffer_;
  void* ctx_;
  std::vector<void*> pushes_;  // one stream channel per size
  void* back_;
  void* dealer_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

int Run(const Flags& flags) {
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("raw_zmq_bench: pipe");
    return 1;
  }
  const pid_t child = fork();
  if (child < 0) {
    std::perror("raw_zmq_bench: fork");
    return 1;
  }
  if (child == 0) {
    close(fds[0]);
    const ReceiverWork work = flags.receiver_work == "accumulate" ? ReceiverWork::kAccumulate
                              : flags.receiver_work == "copy"     ? ReceiverWork::kCopy
                                                                  : ReceiverWork::kNone;
    _exit(RunReceiver(flags.sizes, work, fds[1]));
  }
  close(fds[1]);
  std::string text;
  char chunk[512];
  for (ssize_t n; (n = read(fds[0], chunk, sizeof(chunk))) > 0;) text.append(chunk, static_cast<size_t>(n));
  close(fds[0]);
  std::vector<std::string> endpoints;
  for (size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    endpoints.push_back(text.substr(pos, nl - pos));
  }
  if (endpoints.size() != flags.sizes.size() + 2) {
    std::fprintf(stderr, "raw_zmq_bench: the receiver did not report its endpoints\n");
    kill(child, SIGKILL);
    return 1;
  }

  std::string json = "{\"sizes\":[";
  for (size_t i = 0; i < flags.sizes.size(); ++i) json += (i ? "," : "") + std::to_string(flags.sizes[i]);
  json += "],\"results\":[";
  bool first = true;
  {
    Sender sender(flags.sizes, endpoints);
    for (size_t i = 0; i < flags.sizes.size(); ++i) {
      const size_t size = flags.sizes[i];
      for (const std::string& mode : flags.modes) {
        sender.Repeat(mode, i, size, std::min(0.1, flags.min_seconds), std::min<uint64_t>(5, flags.min_messages));
        std::vector<double> mbps;
        std::vector<double> probe_ns;  // before each repeat, and after the last
        for (int r = 0; r < flags.repeats; ++r) {
          probe_ns.push_back(tessera::bench::ProbeRoundTripNs("raw_zmq_bench"));
          mbps.push_back(sender.Repeat(mode, i, size, flags.min_seconds, flags.min_messages));
        }
        probe_ns.push_back(tessera::bench::ProbeRoundTripNs("raw_zmq_bench"));
        const double median = Median(mbps);
        std::fprintf(stderr, "raw zmq  size %9zu  %-10s  median %9.1f MB/s\n", size, mode.c_str(), median);
        char item[256];
        std::snprintf(item, sizeof(item), "%s{\"size\":%zu,\"mode\":\"%s\",\"median_mbps\":%.1f,\"mbps\":[",
                      first ? "" : ",", size, mode.c_str(), median);
        json += item;
        for (size_t i = 0; i < mbps.size(); ++i) {
          std::snprintf(item, sizeof(item), "%s%.1f", i ? "," : "", mbps[i]);
          json += item;
        }
        json += "],\"probe_ns\":[";
        for (size_t i = 0; i < probe_ns.size(); ++i) {
          std::snprintf(item, sizeof(item), "%s%.1f", i ? "," : "", probe_ns[i]);
          json += item;
        }
        json += "]}";
        first = false;
      }
    }
  }
  json += "]}\n";
  int status = 0;
  if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "raw_zmq_bench: the receiver process failed\n");
    return 1;
  }
  if (flags.json_path.empty()) {
    std::fputs(json.c_str(), stdout);
  } else {
    std::ofstream out(flags.json_path);
    out << json;
    if (!out) {
      std::fprintf(stderr, "raw_zmq_bench: cannot write %s\n", flags.json_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"raw_zmq_bench: ZeroMQ TCP loopback throughput between two processes (the baseline of "
               "bench/run_push_pull.sh)"};
  app.option_defaults()->always_capture_default();
  app.add_option("--sizes", flags.sizes, "message sizes in bytes")->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--modes", flags.modes, "stream, sequential, inflight8, handoff (not by default)")
      ->delimiter(',')
      ->check(CLI::IsMember({"stream", "sequential", "inflight8", "handoff"}));
  app.add_option("--repeats", flags.repeats, "measured repeats per size and mode")->check(CLI::PositiveNumber);
  app.add_option("--min_seconds,--min-seconds", flags.min_seconds, "minimum duration of one repeat")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--min_messages,--min-messages", flags.min_messages, "minimum messages of one repeat")
      ->check(CLI::PositiveNumber);
  app.add_option("--receiver_work,--receiver-work", flags.receiver_work,
                 "what the receiver does with each payload: none; accumulate (add it as floats into a row, "
                 "like a Tessera server applying a push); or copy (into the next of 8 buffers, like a Tessera "
                 "worker's Pull into the caller's buffer)")
      ->check(CLI::IsMember({"none", "accumulate", "copy"}));
  app.add_flag("--keep_allocations_mapped,--keep-allocations-mapped", flags.keep_allocations_mapped,
               "in both processes, keep large malloc blocks in one untrimmed heap (M_MMAP_THRESHOLD 64 MiB, "
               "M_TRIM_THRESHOLD 1 GiB, M_ARENA_MAX 1), as Tessera's binaries do (common/memory.h)");
  app.add_option("--json", flags.json_path, "write the JSON result here instead of stdout");
  CLI11_PARSE(app, argc, argv);
  if (flags.keep_allocations_mapped && !tessera::KeepLargeAllocationsMapped()) {
    std::fprintf(stderr, "raw_zmq_bench: mallopt refused the allocator settings\n");
    return 1;
  }
  return Run(flags);
}

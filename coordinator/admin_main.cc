// tessera-admin: an operator's requests to a running job's coordinator.
//
//   tessera-admin drain --coordinator ADDR --server RANK [--wait] [--timeout S]
//
// drain: asks the coordinator to drain server RANK (docs/design.md,
// "Draining a server"): its shard copies move to the other servers one at a
// time, then it is removed from the job and told to stop (it exits 0). The
// request is idempotent: asking again reports progress. Without --wait it
// prints the coordinator's answer and exits; with --wait it prints each
// change of state until the server is removed.
//
// Exit status: 0 the drain was started (or, with --wait, finished); 1 the
// coordinator refused it (its reason is printed); 2 bad flags; 3 no answer
// from the coordinator; 4 --wait ran out of time (the last state is printed).
// The reply comes back to this process's own endpoint (--bind), which the
// coordinator must be able to reach. With CURVE authentication on, give the
// job's key file with --job_keys, as the job's processes are given it.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/message.h"
#include "transport/transport_factory.h"

namespace {

// Replies the transport delivered, for the main thread to wait on.
class Inbox {
 public:
  void Put(tessera::Message m) {
    std::lock_guard lock(mu_);
    messages_.push_back(std::move(m));
    cv_.notify_all();
  }
  // The first reply to `request_id` within `timeout`, or nothing.
  std::optional<tessera::Message> Wait(uint64_t request_id, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      for (auto it = messages_.begin(); it != messages_.end(); ++it) {
        if (it->header.request_id() == request_id) {
          tessera::Message m = std::move(*it);
          messages_.erase(it);
          return m;
        }
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<tessera::Message> messages_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera-admin: requests to a running job's coordinator."};
  app.require_subcommand(1);
  std::string coordinator, bind = "tcp://127.0.0.1:0";
  uint32_t rank = 0;
  bool wait = false;
  double timeout = 600, answer_timeout = 10, poll = 1;
  CLI::App* drain = app.add_subcommand(
      "drain",
      "Drain server RANK and remove it from the job: its shard copies move to the other servers one at a time "
      "(training goes on), then it is told to stop. Asking again reports progress.");
  drain->add_option("--coordinator", coordinator, "The job's coordinator address, e.g. tcp://10.0.0.1:5000")
      ->required();
  drain->add_option("--server", rank, "Rank of the server to drain")->required();
  drain->add_flag("--wait", wait, "Wait until the server is removed, printing each change");
  drain->add_option("--timeout", timeout, "Seconds --wait waits at most")->capture_default_str()
      ->check(CLI::PositiveNumber);
  drain->add_option("--answer-timeout", answer_timeout, "Seconds to wait for the coordinator to answer")
      ->capture_default_str()->check(CLI::PositiveNumber);
  drain->add_option("--poll", poll, "Seconds between progress requests with --wait")->capture_default_str()
      ->check(CLI::PositiveNumber);
  drain->add_option("--bind", bind,
                    "This process's endpoint, where the coordinator sends its answer (tcp://HOST:PORT, port 0 = any)")
      ->capture_default_str();
  tessera::TransportChoice choice;  // plain ZeroMQ: a few small messages
  choice.shm = false;
  drain->add_option("--job_keys,--job-keys", choice.job_keys,
                    "The job's key file (RUN/job.keys) where the job authenticates (docs/security.md)");
  CLI11_PARSE(app, argc, argv);
  tessera::InitLogging("admin", false);

  tessera::ZmqTransport::Options options;
  options.bind = bind;
  auto transport = tessera::MakeTransport(std::move(options), choice);
  if (!transport.ok()) {
    std::fprintf(stderr, "tessera-admin: cannot create a transport at %s: %s\n", bind.c_str(),
                 std::string(transport.status().message()).c_str());
    return 2;
  }
  Inbox inbox;
  if (absl::Status s = (*transport)->Start([&inbox](tessera::Message m) { inbox.Put(std::move(m)); }); !s.ok()) {
    std::fprintf(stderr, "tessera-admin: cannot listen at %s: %s\n", bind.c_str(), std::string(s.message()).c_str());
    return 2;
  }
  uint64_t next_request = 1;
  // One request, sent again each second until answered or answer_timeout passes.
  auto ask = [&]() -> std::optional<tessera::Message> {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::duration<double>(answer_timeout);
    while (std::chrono::steady_clock::now() < give_up) {
      const uint64_t id = next_request++;
      tessera::Message m;
      m.header.set_request_id(id);
      m.header.mutable_drain_request()->set_server_rank(rank);
      if (absl::Status s = (*transport)->Send(coordinator, std::move(m)); !s.ok()) {
        std::fprintf(stderr, "tessera-admin: cannot send to %s: %s\n", coordinator.c_str(),
                     std::string(s.message()).c_str());
        return std::nullopt;
      }
      if (auto reply = inbox.Wait(id, std::chrono::milliseconds(1000))) return reply;
    }
    return std::nullopt;
  };
  const auto start = std::chrono::steady_clock::now();
  std::string last_state;
  while (true) {
    std::optional<tessera::Message> reply = ask();
    if (!reply) {
      std::fprintf(stderr,
                   "tessera-admin: no answer from the coordinator at %s within %.0f s (is the job running, and can "
                   "the coordinator reach %s?)\n",
                   coordinator.c_str(), answer_timeout, (*transport)->address().c_str());
      return 3;
    }
    const tessera::proto::Envelope& h = reply->header;
    if (h.has_error()) {
      std::fprintf(stderr, "tessera-admin: the coordinator refused to drain server %u: %s\n", rank,
                   h.error().message().c_str());
      return 1;
    }
    if (!h.has_drain_reply()) {
      std::fprintf(stderr, "tessera-admin: unexpected answer from the coordinator: %s\n", h.ShortDebugString().c_str());
      return 1;
    }
    const tessera::proto::DrainReply& d = h.drain_reply();
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (d.state() != last_state) {
      std::printf("[%6.1f s] %s\n", elapsed, d.state().c_str());
      std::fflush(stdout);
      last_state = d.state();
    }
    if (d.removed() || !wait) return 0;
    if (elapsed >= timeout) {
      std::fprintf(stderr, "tessera-admin: server %u is not drained after %.0f s; last: %s\n", rank, timeout,
                   last_state.c_str());
      return 4;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(poll));
  }
}

#pragma once
// The transport flags of every binary that makes a transport (servers, the
// coordinator, worker programs through worker/worker_flags.h, benches), in
// one place: add them to a CLI11 app; once the app has parsed, choice() is
// the TransportChoice (transport/transport_factory.h) they name, checked.
// Header-only; programs link CLI11 themselves.
//
//   --transport zmq|rdma|auto        TransportChoice::kind
//   --rdma_required 1|0              rdma_required
//   --rdma_pool_bytes N, --rdma_max_pinned_bytes N
//   --shm 1|0, --shm_min_frame_bytes N, --shm_ring_bytes N,
//   --shm_cross_memory 1|0, --shm_min_lend_bytes N
//   --coalesce 1|0, --coalesce_max_message_bytes N,
//   --coalesce_max_batch_bytes N, --coalesce_max_delay_us N
//   --host_id TEXT, --job_keys FILE, --faults SPEC
// Each also with dashes (--shm-ring-bytes). 1|0 settings take true|false
// too. The defaults are TransportChoice{}'s (`--help` shows them): nothing
// here writes a default of its own. A bad value fails the parse with a
// CLI::ValidationError naming the flag (reported like any other bad flag).
//
// These settings were environment variables once (TESSERA_SHM, ...);
// nothing reads those any more. WarnAboutOldTransportVariables, called from
// main only, logs one line per such variable still set, naming the flag
// that replaces it: a job script that sets one learns that it does nothing.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/logging.h"
#include "transport/transport_factory.h"

namespace tessera {

class TransportFlags {
 public:
  // What a flag holds: its value is parsed as this.
  enum class Type { kTransport, kSwitch, kCount, kText };
  struct Flag {
    const char* name;          // with underscores, e.g. "--shm_ring_bytes"; AddTo adds the dashed one too
    const char* old_variable;  // the environment variable that set it before
    Type type;
    std::string TransportFlags::*value;
    const char* help;
  };

  // Every flag, in --help order.
  static const std::vector<Flag>& Flags() {
    static const std::vector<Flag> flags = {
        {"--transport", "TESSERA_TRANSPORT", Type::kTransport, &TransportFlags::transport_,
         "zmq: ZeroMQ (tcp:// or ipc:// by --bind); rdma or auto: RDMA verbs where this process can use a device, "
         "else ZeroMQ over tcp"},
        {"--rdma_required", "TESSERA_RDMA_REQUIRED", Type::kSwitch, &TransportFlags::rdma_required_,
         "1: with --transport rdma or auto, fail instead of falling back to ZeroMQ"},
        {"--rdma_pool_bytes", "TESSERA_RDMA_POOL_BYTES", Type::kCount, &TransportFlags::rdma_pool_bytes_,
         "RDMA: bytes of registered buffers per process"},
        {"--rdma_max_pinned_bytes", "TESSERA_RDMA_MAX_PINNED_BYTES", Type::kCount,
         &TransportFlags::rdma_max_pinned_bytes_, "RDMA: most bytes pinned at once"},
        {"--shm", "TESSERA_SHM", Type::kSwitch, &TransportFlags::shm_,
         "1: large frames to processes of this host go through shared memory"},
        {"--shm_min_frame_bytes", "TESSERA_SHM_MIN_FRAME_BYTES", Type::kCount, &TransportFlags::shm_min_frame_bytes_,
         "shared memory: smaller frames go over the socket"},
        {"--shm_ring_bytes", "TESSERA_SHM_RING_BYTES", Type::kCount, &TransportFlags::shm_ring_bytes_,
         "shared memory: ring per destination, a power of two of at least 1 MiB"},
        {"--shm_cross_memory", "TESSERA_SHM_CROSS_MEMORY", Type::kSwitch, &TransportFlags::shm_cross_memory_,
         "shared memory: 1: lend large pull values to a peer of this host, which reads them in place"},
        {"--shm_min_lend_bytes", "TESSERA_SHM_MIN_LEND_BYTES", Type::kCount, &TransportFlags::shm_min_lend_bytes_,
         "shared memory: only frames at least this big are lent"},
        {"--coalesce", "TESSERA_COALESCE", Type::kSwitch, &TransportFlags::coalesce_,
         "1: small messages to one peer made close together go as one"},
        {"--coalesce_max_message_bytes", "TESSERA_COALESCE_MAX_MESSAGE_BYTES", Type::kCount,
         &TransportFlags::coalesce_max_message_bytes_, "coalescing: the largest message held for a batch"},
        {"--coalesce_max_batch_bytes", "TESSERA_COALESCE_MAX_BATCH_BYTES", Type::kCount,
         &TransportFlags::coalesce_max_batch_bytes_, "coalescing: the largest batch"},
        {"--coalesce_max_delay_us", "TESSERA_COALESCE_MAX_DELAY_US", Type::kCount,
         &TransportFlags::coalesce_max_delay_us_,
         "coalescing: microseconds a held message waits at most (up to a minute)"},
        {"--host_id", "TESSERA_HOST_ID", Type::kText, &TransportFlags::host_id_,
         "joins this host's identity for shared memory: processes given different ids never take each other for "
         "one host (the launcher gives the host's name)"},
        {"--job_keys", "TESSERA_JOB_KEYS", Type::kText, &TransportFlags::job_keys_,
         "the job's key file (tessera-keys): only its holders get in (docs/security.md); empty: no authentication"},
        {"--faults", "TESSERA_FAULTS", Type::kText, &TransportFlags::faults_,
         "message faults for experiments, e.g. seed=1,drop=0.01 (docs/fault_injection.md); empty: none"},
    };
    return flags;
  }

  // The values of TransportChoice{}; or of `d`, whose settings without a
  // flag (hold_requests, ShmTransport's stuck_ms, ...) Parse() keeps.
  TransportFlags() : TransportFlags(TransportChoice{}) {}
  explicit TransportFlags(const TransportChoice& d)
      : transport_(d.kind == TransportChoice::Kind::kZmq    ? "zmq"
                   : d.kind == TransportChoice::Kind::kRdma ? "rdma"
                                                            : "auto"),
        rdma_required_(Switch(d.rdma_required)),
        rdma_pool_bytes_(absl::StrCat(d.rdma_pool_bytes)),
        rdma_max_pinned_bytes_(absl::StrCat(d.rdma_max_pinned_bytes)),
        shm_(Switch(d.shm)),
        shm_min_frame_bytes_(absl::StrCat(d.shm_options.min_frame_bytes)),
        shm_ring_bytes_(absl::StrCat(d.shm_options.ring_bytes)),
        shm_cross_memory_(Switch(d.shm_options.cross_memory)),
        shm_min_lend_bytes_(absl::StrCat(d.shm_options.min_lend_bytes)),
        coalesce_(Switch(d.coalesce.enabled)),
        coalesce_max_message_bytes_(absl::StrCat(d.coalesce.max_message_bytes)),
        coalesce_max_batch_bytes_(absl::StrCat(d.coalesce.max_batch_bytes)),
        coalesce_max_delay_us_(absl::StrCat(d.coalesce.max_delay.count())),
        host_id_(d.host_id),
        job_keys_(d.job_keys),
        faults_(d.faults),
        base_(d),
        choice_(d) {}
  // The flags hold pointers into this object.
  TransportFlags(const TransportFlags&) = delete;
  TransportFlags& operator=(const TransportFlags&) = delete;

  // Adds the flags to `app`; once it has parsed, choice() holds them (a bad
  // value throws CLI::ValidationError from the parse, naming the flag).
  // Uses the app's final callback: a program must not set its own.
  void AddTo(CLI::App& app) {
    for (const Flag& f : Flags()) {
      const std::string dashed = absl::StrReplaceAll(f.name + 2, {{"_", "-"}});
      const std::string names = dashed == f.name + 2 ? std::string(f.name) : absl::StrCat(f.name, ",--", dashed);
      const char* type = f.type == Type::kCount ? "N" : f.type == Type::kSwitch ? "1|0" : "TEXT";
      app.add_option(names, this->*f.value, f.help)->capture_default_str()->type_name(type);
    }
    app.final_callback([this] {
      absl::StatusOr<TransportChoice> c = Parse();
      if (!c.ok()) throw CLI::ValidationError(std::string(c.status().message()));
      choice_ = std::move(*c);
    });
  }

  // The settings given (after a parse), checked; the defaults before.
  const TransportChoice& choice() const { return choice_; }

  // The values as given, parsed and checked (ValidateTransportChoice): an
  // InvalidArgument naming the flag otherwise.
  absl::StatusOr<TransportChoice> Parse() const {
    TransportChoice c = base_;
    const std::string& kind = transport_;
    if (kind == "zmq") {
      c.kind = TransportChoice::Kind::kZmq;
    } else if (kind == "rdma") {
      c.kind = TransportChoice::Kind::kRdma;
    } else if (kind == "auto") {
      c.kind = TransportChoice::Kind::kAuto;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--transport ", kind, ": expected zmq, rdma or auto"));
    }
    uint64_t delay_us = 0;
    absl::Status s;  // the first error
    s.Update(SwitchOf(&TransportFlags::rdma_required_, &c.rdma_required));
    s.Update(CountOf(&TransportFlags::rdma_pool_bytes_, &c.rdma_pool_bytes));
    s.Update(CountOf(&TransportFlags::rdma_max_pinned_bytes_, &c.rdma_max_pinned_bytes));
    s.Update(SwitchOf(&TransportFlags::shm_, &c.shm));
    s.Update(CountOf(&TransportFlags::shm_min_frame_bytes_, &c.shm_options.min_frame_bytes));
    s.Update(CountOf(&TransportFlags::shm_ring_bytes_, &c.shm_options.ring_bytes));
    s.Update(SwitchOf(&TransportFlags::shm_cross_memory_, &c.shm_options.cross_memory));
    s.Update(CountOf(&TransportFlags::shm_min_lend_bytes_, &c.shm_options.min_lend_bytes));
    s.Update(SwitchOf(&TransportFlags::coalesce_, &c.coalesce.enabled));
    s.Update(CountOf(&TransportFlags::coalesce_max_message_bytes_, &c.coalesce.max_message_bytes));
    s.Update(CountOf(&TransportFlags::coalesce_max_batch_bytes_, &c.coalesce.max_batch_bytes));
    s.Update(CountOf(&TransportFlags::coalesce_max_delay_us_, &delay_us));
    if (!s.ok()) return s;
    if (delay_us > 60'000'000) {
      return absl::InvalidArgumentError(
          absl::StrCat("--coalesce_max_delay_us ", delay_us, ": at most 60000000 (a minute)"));
    }
    c.coalesce.max_delay = std::chrono::microseconds(delay_us);
    c.host_id = host_id_;
    c.job_keys = job_keys_;
    c.faults = faults_;
    if (s = ValidateTransportChoice(c); !s.ok()) return s;
    return c;
  }

  // One line per old variable set in `environment` (a null-terminated
  // array of NAME=VALUE, like environ), naming the flag that replaces it;
  // `more` adds a program's own (variable, flag) pairs.
  static std::vector<std::string> OldVariableWarnings(
      const char* const* environment, const std::vector<std::pair<std::string, std::string>>& more = {}) {
    std::vector<std::pair<std::string, std::string>> old;
    for (const Flag& f : Flags()) old.emplace_back(f.old_variable, f.name);
    old.insert(old.end(), more.begin(), more.end());
    std::vector<std::string> lines;
    for (const auto& [variable, flag] : old) {
      const std::string prefix = variable + "=";
      for (const char* const* e = environment; e != nullptr && *e != nullptr; ++e) {
        if (std::string_view(*e).substr(0, prefix.size()) == prefix) {
          lines.push_back(absl::StrCat(variable, " is set but no longer read: the flag ", flag,
                                       " replaces it (docs/launcher.md, \"The process contract\")"));
          break;
        }
      }
    }
    return lines;
  }

 private:
  static std::string Switch(bool on) { return on ? "1" : "0"; }

  static const char* NameOf(std::string TransportFlags::*value) {
    for (const Flag& f : Flags()) {
      if (f.value == value) return f.name;
    }
    return "?";
  }
  absl::Status SwitchOf(std::string TransportFlags::*value, bool* out) const {
    const std::string& v = this->*value;
    if (v == "1" || v == "true") {
      *out = true;
    } else if (v == "0" || v == "false") {
      *out = false;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(NameOf(value), " ", v, ": expected 1 or 0 (or true, false)"));
    }
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status CountOf(std::string TransportFlags::*value, T* out) const {
    const std::string& v = this->*value;
    uint64_t n = 0;
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || !absl::SimpleAtoi(v, &n) || n == 0) {
      return absl::InvalidArgumentError(absl::StrCat(NameOf(value), " ", v, ": expected a positive integer"));
    }
    *out = static_cast<T>(n);
    return absl::OkStatus();
  }

  std::string transport_, rdma_required_, rdma_pool_bytes_, rdma_max_pinned_bytes_, shm_, shm_min_frame_bytes_,
      shm_ring_bytes_, shm_cross_memory_, shm_min_lend_bytes_, coalesce_, coalesce_max_message_bytes_,
      coalesce_max_batch_bytes_, coalesce_max_delay_us_, host_id_, job_keys_, faults_;
  TransportChoice base_;    // what the flags start from
  TransportChoice choice_;  // after a parse: base_ with the flags' values
};

// For main only (after InitLogging): logs a warning for each old transport
// environment variable still set (TransportFlags::OldVariableWarnings). The
// one place outside the launcher that looks at the environment, and only to
// say that it is not read.
inline void WarnAboutOldTransportVariables(const std::vector<std::pair<std::string, std::string>>& more = {}) {
  for (const std::string& line : TransportFlags::OldVariableWarnings(environ, more)) TLOG_WARN("{}", line);
}

}  // namespace tessera

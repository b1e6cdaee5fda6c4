#pragma once
// SessionCore: a server's or worker's side of the coordinator protocol as a
// pure state machine (register, wait for the job to assemble, heartbeats and
// the coordinator's lease, barriers, the done report, the end of the job).
// No sockets, threads, locks or clocks: time comes in as `now` (a monotonic
// count of nanoseconds, common/clock.h). The CoordinatorSession shell
// (node/coordinator_session.h) locks around it, hands what it returns to the
// transport, and waits on it with condition variables; tests drive it
// message by message with a fake time.
//
// Promises:
// - Every envelope it produces carries sender_id = self's node id (0 before
//   the RegisterReply) and a fresh request id with kSessionRequestBit (a
//   done report sent again keeps its id).
// - Handle() consumes RegisterReply, JobReady, HeartbeatAck, BarrierRelease,
//   Shutdown, and Ack/Error replies whose request id has kSessionRequestBit;
//   nothing else. Each consumed message refreshes last_heard().
// - Registration: after StartJoin(now, deadline), Tick sends a
//   RegisterRequest (role, requested rank) at once and every register_retry
//   until the RegisterReply; then, until the JobReady, again every
//   4 * register_retry with the assigned rank (the coordinator answers a
//   repeat with the same reply and, once the job runs, the JobReady again).
//   Nothing goes at or after the deadline, after a registration error, or
//   after the end. A RegisterReply that comes after the join failed (an
//   error, or the deadline passed unregistered) is ignored.
// - Heartbeats: once registered, one at once and then every
//   heartbeat_interval(): the option, or the RegisterReply's
//   heartbeat_interval_ms when that is shorter. Each carries Envelope.epoch =
//   map_epoch() (raised by the JobReady's map and set_map_epoch, never
//   lowered) and is filled by the heartbeat filler, if one is set.
// - The coordinator's lease: when a heartbeat falls due and nothing was heard
//   for `lease`, the node is silent: silent_since() says since when it has
//   heard nothing, and heartbeats go on as before (a coordinator that was
//   only cut off, paused or restarted hears them and answers; a standby
//   that took over is looked up by the shell). The next message consumed
//   ends the silence. Only when nothing was heard for `give_up` (at least
//   `lease`) does the job end, with Unavailable("lost the coordinator at ADDR
//   NOTE: no answer for N s") (ADDR and NOTE: set_coordinator,
//   set_coordinator_note). So a node outlives any failover shorter than
//   give_up.
// - Rejoining (StartRejoin, for a server the coordinator declared lost while
//   it was only cut off): registration starts again, for the rank the node
//   had, as in a join; the coordinator makes it a new node (a new node id,
//   the next incarnation) and sends the JobReady again. Heartbeats pause
//   until the new RegisterReply.
// - Shutdown ends the job: OK, or Aborted("job failed: REASON").
// - The end is final: ended() is set once and never changes; Tick sends
//   nothing after it.
// - A barrier request (Barrier) is sent again, the same request, every
//   register_retry until it is released or refused (the coordinator sends
//   a lost release again for the same request).
// - A done report (ReportDone) is sent again every register_retry, with the
//   same request id, until the coordinator answers it, the job ends, or its
//   deadline.
// - Coordinator errors become statuses with the error's code and the message
//   "coordinator: MESSAGE". An error before registration is the
//   registration's (register_error()), except Unavailable: a refusal for
//   now (a replacement whose predecessor's lease has not run out yet), so
//   registration goes on every register_retry until the deadline, and a join
//   that runs out of time says the last refusal.
// Thread safety: none; the shell serializes calls.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/message.h"
#include "node/timing_defaults.h"

namespace tessera {

struct SessionCoreOptions {
  proto::Role role = proto::WORKER;         // SERVER or WORKER
  int rank = -1;                            // requested rank, -1 = any
  Nanos connect_timeout = 30 * kSeconds;    // named in the join errors (the deadline is StartJoin's)
  Nanos heartbeat_interval = kDefaultHeartbeatInterval;  // how often to heartbeat
  Nanos lease = kDefaultLease;  // coordinator silence after which the node is silent()
  Nanos give_up = 60 * kSeconds;            // coordinator silence that ends the job (at least lease)
  Nanos register_retry = 500 * kMillis;     // resend registration (and the done report) this often
  std::string coordinator;                  // the coordinator's address, for errors
  std::string coordinator_note;             // appended to the address in the lost-coordinator error
};

class SessionCore {
 public:
  // Request ids with this bit belong to the session.
  static constexpr uint64_t kSessionRequestBit = 1ull << 63;

  explicit SessionCore(SessionCoreOptions options);

  // --- Inputs ---
  // Consumes the message if it belongs to the session; returns whether it did.
  bool Handle(const Message& message, Nanos now);
  // What the timers send to the coordinator now, in this order: a
  // registration, a heartbeat, done reports. May end the job (the lease).
  std::vector<proto::Envelope> Tick(Nanos now);
  // When Tick has something to do next (nullopt: nothing until an input).
  // Tick may still find nothing then (e.g. the join deadline passed).
  std::optional<Nanos> NextTickAt() const;

  // --- Joining ---
  // Starts registering (the first RegisterRequest goes at the next Tick);
  // registration stops at `deadline`.
  void StartJoin(Nanos now, Nanos deadline);
  // Registers again, for the rank this node had (see Promises); the join's
  // outcome (JoinResult) starts over. Does nothing before the first
  // registration or after the end.
  void StartRejoin(Nanos now, Nanos deadline);
  // The outcome of the join, once there is one: the JobReady, or why not (in
  // this order: the registration error; the end of the job, Aborted("job
  // ended before it started") for an orderly one; after the deadline,
  // DeadlineExceeded "coordinator at ADDR did not answer within N s" or "the
  // job did not assemble within N s (coordinator at ADDR did not send the
  // shard map)"). nullopt while it is still open.
  std::optional<absl::StatusOr<proto::JobReady>> JoinResult(Nanos now) const;

  // --- Barriers ---
  // The request to send now for barrier `name` (forgets an earlier release of it).
  proto::Envelope Barrier(const std::string& name);
  // OK once `name` was released, the coordinator's error if it refused the
  // latest request for it (that wins over a release), else nullopt.
  std::optional<absl::Status> barrier_result(const std::string& name) const;
  bool barrier_released(const std::string& name) const;
  // Forgets the state of barrier `name` (the caller has its result).
  void ForgetBarrier(const std::string& name) { barriers_.erase(name); }

  // --- The done report ---
  // The report to send now; Tick sends it again every register_retry (same
  // request id) until answered, the end, or `deadline`.
  proto::Envelope ReportDone(const proto::WorkerDone& report, Nanos now, Nanos deadline);
  // The coordinator's answer to the done report `request_id` (OK for an Ack).
  std::optional<absl::Status> done_reply(uint64_t request_id) const;
  // Whether the latest done report was answered.
  bool done_acknowledged() const { return last_done_ != 0 && done_reply(last_done_).has_value(); }
  // Forgets done report `request_id` (stops sending it).
  void ForgetDone(uint64_t request_id) { dones_.erase(request_id); }

  // --- The coordinator ---
  // The address named in errors (an etcd:// address until resolved).
  void set_coordinator(std::string address) { options_.coordinator = std::move(address); }
  void set_coordinator_note(std::string note) { options_.coordinator_note = std::move(note); }
  const std::string& coordinator() const { return options_.coordinator; }
  // Counts as hearing from the coordinator (a new leader gets a whole lease).
  void ResetLease(Nanos now) {
    last_heard_ = now;
    silent_ = false;
  }

  // --- State ---
  void set_map_epoch(uint64_t epoch) { map_epoch_ = std::max(map_epoch_, epoch); }
  uint64_t map_epoch() const { return map_epoch_; }
  // Called by Tick on each heartbeat it sends (may be empty).
  void set_heartbeat_filler(std::function<void(proto::Heartbeat*)> fill) { fill_heartbeat_ = std::move(fill); }
  bool registered() const { return registered_.has_value(); }
  // This node as the coordinator registered it (empty before).
  const proto::NodeInfo& self() const { return registered_ ? registered_->self() : empty_self_; }
  // A worker that joined a job already running (RegisterReply).
  bool joined_running_job() const { return registered_ && registered_->joined_running_job(); }
  const std::optional<proto::JobReady>& ready() const { return ready_; }
  const std::optional<absl::Status>& ended() const { return ended_; }
  const std::optional<absl::Status>& register_error() const { return register_error_; }
  Nanos last_heard() const { return last_heard_; }
  // Since when the coordinator has been silent, once that passed `lease`
  // (see Promises); nullopt while it answers.
  std::optional<Nanos> silent_since() const { return silent_ ? std::optional<Nanos>(last_heard_) : std::nullopt; }
  // The interval heartbeats go at (the shorter of the option and the job's).
  Nanos heartbeat_interval() const;
  // Whether Tick(now) would heartbeat (or find the lease expired).
  bool HeartbeatDue(Nanos now) const { return Heartbeating() && now >= next_heartbeat_; }
  const SessionCoreOptions& options() const { return options_; }

  // "1.5 s": how durations appear in the session's messages.
  static std::string FormatSeconds(Nanos n);

 private:
  struct BarrierState {
    uint64_t request_id = 0;
    proto::Envelope request;  // sent again every register_retry until released or refused
    Nanos next_send = 0;      // 0: the caller sent it; the next Tick starts the timer
    bool released = false;
    std::optional<absl::Status> error;
  };
  struct DoneReport {
    proto::Envelope request;
    Nanos next_send = 0;
    Nanos deadline = 0;
    bool expired = false;  // past its deadline: no more sends
    std::optional<absl::Status> reply;
  };

  uint64_t NextRequestId() { return kSessionRequestBit | ++next_request_; }
  bool Registering() const;
  bool Heartbeating() const { return registered_ && !register_error_ && !ended_; }
  bool JoinFailedUnregistered(Nanos now) const;
  void End(absl::Status status);

  SessionCoreOptions options_;
  std::function<void(proto::Heartbeat*)> fill_heartbeat_;
  const proto::NodeInfo empty_self_;
  uint64_t next_request_ = 0;

  bool joining_ = false;
  bool registration_over_ = false;  // the join deadline passed
  Nanos join_deadline_ = 0;
  Nanos next_register_ = 0;
  std::optional<proto::RegisterReply> registered_;
  std::optional<absl::Status> register_error_;
  std::optional<absl::Status> register_refused_;  // the last Unavailable answer to a registration
  std::optional<proto::JobReady> ready_;
  std::optional<absl::Status> ended_;

  Nanos last_heard_ = 0;
  bool silent_ = false;  // nothing heard for `lease` (see silent_since)
  Nanos next_heartbeat_ = 0;
  uint64_t map_epoch_ = 0;

  absl::flat_hash_map<std::string, BarrierState> barriers_;
  std::map<uint64_t, DoneReport> dones_;  // by request id
  uint64_t last_done_ = 0;
};

}  // namespace tessera

#pragma once
// CoordinatorNode: the coordinator's I/O shell. Messages from the transport
// are queued and fed to the CoordinatorCore on the thread that calls Run(),
// with a Tick every 50 ms; outputs are sent as they come. Used by the
// tessera-coordinator binary and by in-process cluster tests.
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "coordinator/coordinator_core.h"
#include "transport/transport.h"

namespace tessera {

class CoordinatorNode {
 public:
  // options.address is filled in from the transport.
  CoordinatorNode(CoordinatorOptions options, std::unique_ptr<Transport> transport);
  ~CoordinatorNode();
  CoordinatorNode(const CoordinatorNode&) = delete;
  CoordinatorNode& operator=(const CoordinatorNode&) = delete;

  // Starts listening. After OK, address() is where nodes register.
  absl::Status Start();
  const std::string& address() const { return transport_->address(); }

  // The coordinator's own state (set before Run()): `restored` is taken over
  // at the start (a restarted coordinator, or a standby taking over), and
  // `save` is called with the serialized proto::CoordinatorState whenever it
  // changed, before any message that follows from the change is sent (so a
  // successor never publishes an older map than one a node has seen). `save`
  // returning false means this coordinator may no longer act (it was
  // deposed): Run() then returns FailedPrecondition without sending.
  // `source` names where the state was kept, for the log ("the state file").
  void set_state(std::optional<proto::CoordinatorState> restored, std::function<bool(const std::string&)> save,
                 std::string source = "the state file") {
    restored_ = std::move(restored);
    save_state_ = std::move(save);
    state_source_ = std::move(source);
  }
  // Whether this coordinator still leads the job (checked before every
  // send); false stops Run() as a false `save` does. Default: always.
  void set_leadership(std::function<bool()> holds) { holds_ = std::move(holds); }

  // Runs the job to its end. OK if every worker finished; Aborted with the
  // reason if the job failed; FailedPrecondition if this coordinator lost the
  // leadership. Requires Start() to have succeeded.
  absl::Status Run();
  // After Run(): keeps answering for `duration` (a node that missed its
  // Shutdown, a lost message, gets it again when it next heartbeats), then
  // closes the transport.
  void Linger(Nanos duration);

  // The job summary as JSON (see docs/launcher.md); valid after Run().
  std::string SummaryJson() const;

  // The coordinator's figures in the Prometheus text format (membership,
  // map epoch, failovers, message counts, state saves). Thread-safe: Run()
  // takes a snapshot after every turn; before Run() the figures are zero.
  std::string MetricsText() const;

 private:
  CoordinatorOptions options_;
  std::unique_ptr<Transport> transport_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> inbox_;  // guarded by mu_
  std::optional<CoordinatorCore> core_;
  std::optional<proto::CoordinatorState> restored_;
  std::function<bool(const std::string&)> save_state_;
  std::function<bool()> holds_;
  std::string state_source_;

  struct Figures {
    CoordinatorCore::Stats stats;
    uint64_t epoch = 0;
    uint32_t phase = 0;
    size_t syncing = 0;
    size_t moving = 0;  // shard moves under way
    size_t draining = 0;  // servers being drained
    uint64_t state_saves = 0;
    // [role][state]: role 0 server, 1 worker; state 0 alive, 1 lost, 2 away, 3 done.
    uint32_t nodes[2][4] = {};
    std::vector<LoadTracker::ServerLoad> load;  // by server rank
  };
  void TakeFigures(const CoordinatorCore& core, uint64_t state_saves);
  mutable std::mutex figures_mu_;
  Figures figures_;  // guarded by figures_mu_
};

// JSON helpers shared with tests.
std::string JsonString(const std::string& s);
// Embeds s as a JSON object if it looks like one (balanced, starts with '{'),
// else as a JSON string.
std::string JsonObjectOrString(const std::string& s);

}  // namespace tessera

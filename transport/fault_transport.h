#pragma once
// Fault injection for any Transport: a wrapper that drops, duplicates, delays
// and reorders messages and cuts links, decided by a seeded counter-based
// random function so that the same traffic with the same seed meets the same
// faults. For fault experiments on real jobs (see TESSERA_FAULTS in
// transport/transport_factory.h and docs/fault_injection.md) and for tests.
//
// The spec (FaultSpec::Parse), comma-separated NAME=VALUE fields, all optional:
//   seed=N            64-bit seed of every random decision (default 0)
//   drop=P            probability that a message is lost
//   dup=P             probability that a message is delivered twice
//   reorder=P         probability that a message is held back so that later
//                     ones on the same link overtake it
//   reorder_ms=LO-HI  how long a reordered message is held (default 1-10)
//   delay_ms=LO-HI    every message is delayed by a uniform time in [LO, HI]
//                     milliseconds; delays keep the order of a link
//   cut=A|B           no message passes between an endpoint whose address
//                     contains A and one whose address contains B, either
//                     way (repeatable; "tcp://10.0.0.1:5001" or ":5001")
//   only=S            random faults (drop, dup, delay, reorder) only for
//                     messages whose peer address contains S; cuts are not
//                     restricted by it
//   side=send|recv|both  where faults apply (default both), see below
// P is a probability in [0,1]; LO-HI are whole milliseconds (a single number N
// means N-N), at most 60000. Example:
//   "seed=7,drop=0.02,dup=0.01,reorder=0.05,delay_ms=0-5,cut=:5001|:5002"
//
// Where faults apply. A message meets faults at a *stage*: leaving this
// process (side=send: the peer is the destination) and arriving at it
// (side=recv: the peer is the header's sender_address). With side=both (the
// default) a process applies the spec to everything it sends and everything
// it receives, so a process given faults alone also loses, delays and cuts
// what healthy peers send it. When every process of a job runs with the same
// spec and side=both, a message between two of them passes two stages and
// the probabilities compound (drop=0.02 loses about 4% of it); use side=send
// to have every message meet the spec exactly once in that case.
//
// At each stage, in this order: a cut link drops the message (counted as
// cut); outside `only`, the message passes untouched; else it is dropped with
// probability drop; else duplicated with probability dup (both copies share
// the frames and the fate that follows); then delayed by delay_ms; then, with
// probability reorder, held back for reorder_ms more. A message that is held
// (delayed, reordered, queued behind a held one, or received) keeps the bytes
// it had when it was handed over, as on a wire: its borrowed and transient
// frames are copied (a sender may reuse borrowed memory once its request is
// answered, maybe through a copy that was not held).
//
// Determinism. Each decision is a pure function of (seed, stage, this
// endpoint's address, the peer's address, the number of earlier messages
// this stage saw on that link): FaultDecider below. The same sequence of
// messages per link with the same seed and the same addresses makes the same
// decisions in every run; with ephemeral ports the addresses, and so the
// decisions, change between runs (bind fixed ports to replay). Different
// senders to one peer make independent decisions. Timing is not
// deterministic: when a delayed message goes out depends on the clock.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "transport/transport.h"

namespace tessera {

struct FaultSpec {
  enum class Side { kSend, kReceive, kBoth };
  // One cut link: endpoints matched by substring of their addresses.
  struct Cut {
    std::string a;
    std::string b;
    bool operator==(const Cut&) const = default;
  };

  uint64_t seed = 0;             // seed of every random decision
  double drop = 0;               // probability a message is lost, in [0,1]
  double dup = 0;                // probability a message is delivered twice, in [0,1]
  double reorder = 0;            // probability a message is held back, in [0,1]
  uint32_t reorder_min_ms = 1;   // hold of a reordered message, lower bound
  uint32_t reorder_max_ms = 10;  // ... and upper bound (inclusive)
  uint32_t delay_min_ms = 0;     // delay of every message, lower bound
  uint32_t delay_max_ms = 0;     // ... and upper bound (inclusive); 0 = no delay
  std::vector<Cut> cuts;         // links severed in both directions
  std::string only;              // empty = random faults for every peer
  Side side = Side::kBoth;       // stages the spec applies at

  // Parses the grammar in the file comment. Surrounding whitespace and empty
  // fields are ignored; an empty text is the spec with no faults. Errors:
  // InvalidArgument naming the field at fault and why (unknown name, value
  // out of range, a field other than cut given twice, ...) and listing the
  // accepted fields.
  static absl::StatusOr<FaultSpec> Parse(std::string_view text);

  // The canonical text: seed first, then every field that differs from its
  // default, in the order of the grammar. Parse(ToString()) == *this.
  std::string ToString() const;

  bool operator==(const FaultSpec&) const = default;
};

// What one transport's faults did, summed over both stages. Messages, not
// copies: a duplicated message counts once in `duplicated`.
struct FaultStats {
  uint64_t dropped = 0;     // lost to drop=P
  uint64_t duplicated = 0;  // delivered (or sent) twice
  uint64_t delayed = 0;     // given a delay above zero by delay_ms
  uint64_t reordered = 0;   // held back by reorder=P
  uint64_t cut = 0;         // lost on a cut link
};

enum class FaultStage { kSend, kReceive };

// The fate of one message at one stage.
struct FaultDecision {
  bool cut = false;        // lost on a cut link (nothing below applies)
  bool drop = false;       // lost (nothing below applies)
  bool duplicate = false;  // two copies
  Nanos delay = 0;         // order-keeping delay
  Nanos hold = 0;          // reorder hold-back on top of the delay; 0 = not reordered

  bool operator==(const FaultDecision&) const = default;
};

// The pure decision function. Immutable and thread-safe; no clock, no state.
class FaultDecider {
 public:
  // `own_address` is the address of the endpoint whose stages these are.
  FaultDecider(FaultSpec spec, std::string own_address);

  // The fate of message number `counter` (0, 1, ...) that `stage` of this
  // endpoint sees on its link with `peer`. A stage the spec's side excludes
  // decides "pass" (all fields false or zero). Each kind of fault uses its
  // own random draw, so changing one probability does not change the
  // decisions of the others.
  FaultDecision Decide(FaultStage stage, std::string_view peer, uint64_t counter) const;

  // True when the link between this endpoint and `peer` is cut.
  bool IsCut(std::string_view peer) const;

  const FaultSpec& spec() const { return spec_; }
  const std::string& own_address() const { return own_address_; }

 private:
  FaultSpec spec_;
  std::string own_address_;
  // Substrings that name a peer cut off from this endpoint (the other end of
  // every cut whose one end matches own_address_).
  std::vector<std::string> cut_peers_;
  uint64_t stage_keys_[2];  // seed and own address mixed, per stage
};

// FaultTransport: a Transport that applies a FaultSpec to another one.
//
// Contract: the one in transport/transport.h, with these differences.
// - Order: messages from one sender to one receiver keep their order except
//   those chosen by reorder=P, which later ones overtake (that is the point),
//   and except that a duplicate follows its original directly. Drop, dup and
//   delay alone keep the order.
// - Lost messages are not errors: Send returns OK for a message that was
//   dropped or cut. Send returns the inner transport's error for a message it
//   passes on at once; for a message sent later (delayed or held back) an
//   error is logged, rate-limited, not returned.
// - Delivery: the handler runs on this wrapper's own delivery thread (not
//   the inner transport's), one message at a time. That thread also sends
//   the delayed messages. Messages waiting for their time are held in memory
//   without bound.
// - Stop(): stops the inner transport and the delivery thread, drops every
//   message still waiting, and returns once neither the handler nor a
//   delayed Send is running or will run again; it does not wait for pending
//   delays. Idempotent and callable from any thread, also from inside the
//   handler (then the handler is not called again, and the delivery thread
//   ends when the handler returns); destroying the wrapper from inside its
//   handler is allowed too.
// - Lifecycle: Start() once; a failed Start() (the inner transport's error)
//   may be retried; Start() after Stop() is FailedPrecondition.
// - stats() is the inner transport's: what really went over the medium
//   (a message dropped at the send stage is not in messages_sent; one dropped
//   at the receive stage is in messages_received). fault_stats() says what
//   the faults did.
// - Zero copy: a duplicate shares the frames of its original; held messages
//   keep their Buffers alive until they are sent, delivered or dropped.
// - Forget(to): drops the messages to `to` still waiting here (delayed or
//   held back; they hold copies of borrowed frames, but must not reach a
//   new process at that address either: counted in messages_dropped and
//   frames_pending, not in fault_stats()), then the inner transport's
//   Forget. One the delivery thread is sending right now overlaps it.
// Thread safety: every method may be called from any thread.
class FaultTransport final : public Transport {
 public:
  // Takes ownership of `inner`, which must not be started.
  FaultTransport(std::unique_ptr<Transport> inner, FaultSpec spec);
  ~FaultTransport() override;
  FaultTransport(const FaultTransport&) = delete;
  FaultTransport& operator=(const FaultTransport&) = delete;

  absl::Status Start(Handler handler) override;
  const std::string& address() const override;
  absl::Status Send(const std::string& to, Message message) override;
  void Stop() override;
  TransportStats stats() const override;
  void Flush() override;  // the wrapped transport's
  bool LendsTo(const std::string& to, size_t bytes) const override;
  bool SameHostPath(const std::string& peer) const override;
  PeerBacklog Backlog(const std::string& to) const override;  // the wrapped transport's
  ForgetResult Forget(const std::string& peer, std::chrono::milliseconds max_wait) override;
  void SetLinkHandler(LinkHandler handler) override;  // the wrapped transport's events
  // Posted destinations are the wrapped transport's: a frame it placed
  // stays placed whatever this wrapper then does to its message (a dropped
  // message used its destination up; a duplicate or a delayed one views it).
  bool PlacesInto(const std::string& from) const override;
  absl::Status PostDestination(const std::string& from, uint64_t request_id, uint32_t frame_index,
                               Buffer destination) override;
  bool CancelDestination(const std::string& from, uint64_t request_id, uint32_t frame_index) override;

  FaultStats fault_stats() const;
  const FaultSpec& spec() const;

 private:
  class Impl;
  // Shared with the delivery thread, which keeps the state alive until it
  // exits; that is what makes Stop() and destruction from the handler safe.
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessera

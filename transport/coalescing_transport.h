#pragma once
// CoalescingTransport: a Transport that sends small messages for one peer
// that are made close together as one message (a batch), and delivers each
// batch it receives as the messages it holds, one by one. Embedding
// workloads are many small pushes and pulls: each message costs the sender a
// hand-off to its I/O thread, the receiver a wake-up of its delivery thread
// and a handler call, and a small message's bytes are mostly that cost.
// Coalesced, a burst of small requests (and the server's replies to it)
// costs one of each.
//
// What is held. A message is *small* when its header and data frames add up
// to at most Options::max_message_bytes and the inner transport would not
// lend it (Message::lendable and LendsTo). Only small messages not marked
// Message::at_once (control messages to the coordinator) are held; a
// held message is kept per destination, behind the ones held before it.
// - A small message the handler sends while it handles the messages of a
//   batch (replies, forwards to backups) is held until it handled them all:
//   then what it sent goes, one message per destination. (For a message
//   that came alone, the handler's sends follow the rule below: held
//   replies would only cost time.)
// - Any other small message (from another thread, or from the handler
//   handling a message that came alone) is held when something is
//   already held for that destination (so it keeps its place), or when
//   Options::hold_requests is set and the destination owes an answer: a
//   message went to it and nothing has arrived from it since (Nagle's rule:
//   a client's next request waits for the answer to its last one, or for
//   the caller to wait), unless its answers are large lately (a moving
//   average of the data bytes of what it sent us over max_message_bytes:
//   a request for a wide pull gains nothing by waiting, and the server
//   would idle while the caller reads the answers it has). Otherwise it
//   goes at once.
// What is held for a destination goes (one message alone as itself, two or
// more as a batch) when:
// - it reaches max_batch_bytes or max_batch_messages;
// - a message that is not held (not small, or at_once) is sent to that
//   destination (the held ones go first: order is kept);
// - a message (or batch) from that destination was delivered (after the
//   handler returned): its answer arrived; a handler that handled a batch
//   releases everything it held then too;
// - Flush() or DeliverUntil() is called (a caller about to wait for answers:
//   Worker's waits);
// - Options::max_delay passed since the first of them was held (a timer
//   thread that runs only while something is held or was lately);
// - Stop() (handed to the inner transport before it stops).
//
// Wire format. A batch is one message of the inner transport whose header
// carries proto::Batch (the size of every piece) and whose only data frame
// holds the messages back to back: each message's serialized Envelope, then
// its data frames, every piece starting at a multiple of 8 bytes (so that a
// frame of floats or keys is as aligned as the batch's frame). The messages'
// headers do not carry sender_address: the batch's does. A batch is sent to
// a peer only when this transport holds messages for it, so every peer of a
// job must run a CoalescingTransport (the factory makes one for every
// process: transport/transport_factory.h).
//
// Contract: the one in transport/transport.h, with these differences.
// - Send returns OK for a message it holds; an error of the inner transport
//   when a held message goes later is logged (rate-limited) and counted, not
//   returned. Send before Start or after Stop is FailedPrecondition, as
//   always.
// - Order: messages from this transport to one destination arrive in the
//   order Send took them, batched or not.
// - Delivery: on the inner transport's thread (or a DeliverUntil caller).
//   Each message of a batch reaches the handler as if sent alone: its own
//   header (sender_address: the batch's), its frames (views of the batch's
//   frame, which they keep alive), received_bytes = its header and frames.
//   A batch whose layout does not add up, whose headers do not parse, or
//   that holds a batch is dropped whole, logged and counted in
//   malformed_received.
// - Message::sent_bytes of a held message gets its header and frames when
//   its batch is handed over (the batch's own header is in no caller's
//   count); TransportStats counts what the inner transport moved (a batch is
//   one message) plus the coalescing counters below.
// - Backlog(to): the inner transport's plus what is held for `to`.
// - Forget(to): drops what is held for `to` (never sent: a held message may
//   view a caller's borrowed memory, so it must not go later; counted in
//   messages_dropped and frames_pending), forgets that `to` owes an answer
//   and how large its answers are (a new process at that address starts
//   afresh), then the inner transport's Forget.
// - Stop(): hands what is held to the inner transport, stops the timer and
//   the inner transport. Idempotent; callable from the handler.
// - Everything else (LendsTo, link events, posted destinations, caller
//   delivery) is the inner transport's. A posted destination is used only by
//   a message sent alone: replies that could fill one (at least 64 KiB in
//   the worker) are not small.
// Thread safety: every method may be called from any thread.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/transport.h"

namespace tessera {

// What a coalescing transport did (also in TransportStats, coalesce_*).
struct CoalesceStats {
  uint64_t batches_sent = 0;        // batches handed to the inner transport
  uint64_t messages_batched = 0;    // messages that went inside those batches
  uint64_t batches_received = 0;    // well-formed batches delivered
  uint64_t messages_unbatched = 0;  // messages delivered out of those batches
  uint64_t messages_held = 0;       // messages held to go with later ones (then batched or not)
  uint64_t timer_flushes = 0;       // destinations whose held messages went by max_delay
  uint64_t send_errors = 0;         // held messages the inner transport refused later
};

class CoalescingTransport final : public Transport {
 public:
  struct Options {
    // Off: every Send goes straight to the inner transport and nothing is
    // held (batches from peers are still unpacked).
    bool enabled = true;
    // The largest message (serialized header + data frames) that is held.
    size_t max_message_bytes = 16 << 10;
    // What one batch may hold: its messages' headers, frames and padding,
    // and their count. A message that would pass either sends the held ones
    // first.
    size_t max_batch_bytes = 64 << 10;
    size_t max_batch_messages = 256;
    // Sends from outside the handler to a destination that owes an answer
    // are held (see above). For processes whose messages are requests
    // (workers); servers and the coordinator answer, and their sends
    // outside the handler go at once.
    bool hold_requests = false;
    // The longest a held message waits when nothing else sends it. Only
    // sends outside the handler (hold_requests) can wait this long; must be
    // positive when hold_requests is set.
    std::chrono::microseconds max_delay{1000};
  };

  // Takes ownership of `inner`, which must not be started.
  CoalescingTransport(std::unique_ptr<Transport> inner, Options options);
  ~CoalescingTransport() override;
  CoalescingTransport(const CoalescingTransport&) = delete;
  CoalescingTransport& operator=(const CoalescingTransport&) = delete;

  absl::Status Start(Handler handler) override;
  const std::string& address() const override;
  absl::Status Send(const std::string& to, Message message) override;
  void Stop() override;
  TransportStats stats() const override;
  void Flush() override;
  bool LendsTo(const std::string& to, size_t bytes) const override;
  bool SameHostPath(const std::string& peer) const override;
  PeerBacklog Backlog(const std::string& to) const override;
  ForgetResult Forget(const std::string& peer, std::chrono::milliseconds max_wait) override;
  void SetLinkHandler(LinkHandler handler) override;
  bool DeliverUntil(const std::function<bool()>& done, std::chrono::milliseconds max_wait) override;
  void WakeCallerDelivery() override;
  bool PlacesInto(const std::string& from) const override;
  absl::Status PostDestination(const std::string& from, uint64_t request_id, uint32_t frame_index,
                               Buffer destination) override;
  bool CancelDestination(const std::string& from, uint64_t request_id, uint32_t frame_index) override;

  CoalesceStats coalesce_stats() const;
  const Options& options() const { return options_; }
  Transport& inner() { return *inner_; }

  // The wire format, exposed for tests and fuzzing. PackBatch lays out
  // `messages` (at least one, frames local; their headers' sender_address
  // is cleared) as one batch message; UnpackBatch takes a received batch apart (InvalidArgument
  // naming what does not add up). Neither touches a transport.
  static Message PackBatch(std::vector<Message>& messages);
  static absl::StatusOr<std::vector<Message>> UnpackBatch(const Message& batch);

 private:
  struct Peer;
  Peer& PeerFor(const std::string& to);
  // Hands what `peer` holds to the inner transport; peer.mu held.
  void SendHeldLocked(Peer& peer);
  void FlushPeer(Peer& peer);
  Peer* FindPeer(absl::string_view address) const;  // null: never sent to
  void OnMessage(Message message);
  void AfterDelivery(Peer* sender);
  void TimerLoop();

  std::unique_ptr<Transport> inner_;
  const Options options_;
  Handler handler_;

  mutable std::mutex peers_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_;  // entries never removed
  std::atomic<size_t> held_peers_{0};  // peers holding something now

  // Peers the handler held messages for while it handled a batch (the
  // delivering thread's; one handler call at a time).
  std::vector<Peer*> held_in_handler_;

  std::mutex timer_mu_;
  std::condition_variable timer_cv_;
  std::atomic<bool> timer_idle_{false};  // the timer sleeps until woken (nothing held lately)
  bool stopping_ = false;
  std::thread timer_;

  std::atomic<bool> started_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> batches_sent_{0}, messages_batched_{0}, batches_received_{0}, messages_unbatched_{0},
      timer_flushes_{0}, send_errors_{0}, failed_sends_{0}, malformed_batches_{0}, messages_held_{0};
};

}  // namespace tessera

#include "transport/zmq_send_hold.h"

namespace tessera::zmq_internal {

// Runs on a libzmq I/O thread (or on the sending thread when the message is
// dropped before libzmq took it).
void ReleaseSendHold(void* /*data*/, void* hint) {
  auto* hold = static_cast<SendHold*>(hint);
  (void)hold->published.load(std::memory_order_acquire);
  if (hold->backlog) {
    hold->backlog->bytes.fetch_sub(hold->backlog_bytes, std::memory_order_relaxed);
    hold->backlog->messages.fetch_sub(1, std::memory_order_release);
  }
  SendHold::Delete(hold);
}

}  // namespace tessera::zmq_internal

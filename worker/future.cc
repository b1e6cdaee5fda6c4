// Future: waiting on a request's completion, with caller delivery and
// finishing steps (see worker/future_state.h and worker/worker.h).
#include "worker/future_state.h"

#include <chrono>
#include <utility>

namespace tessera {

// How long a caller delivering its own reply sleeps at most before it looks
// at its Future again (completions from other threads wake it at once).
constexpr std::chrono::milliseconds kCallerDeliveryMaxWait{50};
// Caller delivery only while the worker has at most this many operations
// in flight: it saves a thread hand-off per reply, which is what a caller
// waiting on one or two requests pays for; with more in flight the
// replies keep the delivery thread busy, and handing the socket back and
// forth would cost more CPU than it saves (measured: 1 MiB pulls 8 in
// flight were 10% slower with it, docs/benchmarks.md).
constexpr int kCallerDeliveryMaxInFlight = 2;

namespace {

// Runs the finishing step of `state` once its `after` is done: `after_status`.
absl::Status FinishOnce(Future::State& state, const absl::Status& after_status) {
  std::lock_guard lock(state.mu);
  if (!state.status) {
    absl::Status s = after_status;
    if (s.ok() && state.finish) s = state.finish();
    state.finish = nullptr;  // what it held goes now
    state.status = std::move(s);
    state.done.store(true, std::memory_order_release);
  }
  return *state.status;
}

}  // namespace

Future Finally(Future after, std::function<absl::Status()> finish) {
  auto state = std::make_shared<Future::State>();
  state->after = std::move(after);
  std::lock_guard lock(state->mu);
  state->finish = std::move(finish);
  return Future(std::move(state));
}

absl::Status Future::Wait() const {
  if (!state_) return absl::FailedPreconditionError("waiting on an empty Future");
  if (state_->after) return FinishOnce(*state_, state_->after->Wait());
  if (!state_->done.load(std::memory_order_acquire)) {
    if (std::shared_ptr<Transport> t = state_->transport.lock()) {
      // Requests held to go together with later ones (transport/
      // coalescing_transport.h) go now: nothing more comes while we wait.
      t->Flush();
      if (state_->in_flight && state_->in_flight->load(std::memory_order_relaxed) <= kCallerDeliveryMaxInFlight) {
        State* s = state_.get();
        t->DeliverUntil([s] { return s->done.load(std::memory_order_acquire); }, kCallerDeliveryMaxWait);
      }
    }
  }
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->status.has_value(); });
  return *state_->status;
}

bool Future::ready() const {
  if (!state_) return false;
  if (state_->after) {
    if (state_->done.load(std::memory_order_acquire)) return true;
    if (!state_->after->ready()) return false;
    FinishOnce(*state_, state_->after->Wait()).IgnoreError();  // ready: no wait
    return true;
  }
  std::lock_guard lock(state_->mu);
  return state_->status.has_value();
}

void Future::Own(std::shared_ptr<const void> memory) const {
  if (!state_) return;
  std::lock_guard lock(state_->mu);
  state_->owned.push_back(std::move(memory));
}

Future Future::Ready(absl::Status status) {
  auto state = std::make_shared<State>();
  state->status = std::move(status);
  state->done.store(true, std::memory_order_release);
  return Future(std::move(state));
}

}  // namespace tessera

#pragma once
// Future::State: the shared state behind a Future (worker/worker.h), the
// worker's side of a request's completion. The Worker shell (worker/
// worker.cc) makes one per operation, registers it with the WorkerCore as
// the operation's handle, and calls Set once the core reports it complete;
// the caller's Future waits on it (worker/future.cc).
//
// Contract:
// - Set(status) completes the request once (later calls do nothing): it
//   wakes every Wait(), counts the operation out of the worker's in-flight
//   count, observes its latency, and wakes a caller delivering replies
//   itself (Transport::DeliverUntil).
// - Caller delivery: while its request is not done, Wait() flushes the
//   transport's held requests and, while the worker has at most two
//   operations in flight, handles incoming replies on the waiting thread
//   (docs/design.md, "Caller delivery").
// - Finally(after, finish): a Future with a finishing step (Future in
//   worker/worker.h): the first Wait() or ready() that finds `after` done
//   runs `finish` (only if `after` ended with OK) on its own thread, once.
// - Owned memory (Future::Own) is released with the last reference to the
//   state, so never before the worker is done with the request.
// Thread safety: any thread; the fields marked so are guarded by mu, the
// others are set before the state is shared (status: under mu).
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "transport/transport.h"
#include "worker/worker.h"

namespace tessera {

struct Future::State {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<absl::Status> status;
  std::atomic<bool> done{false};           // status is set (readable without mu)
  Nanos started = 0;                       // when the request was issued
  metrics::Histogram* latency = nullptr;   // observes issue-to-completion seconds (owned by the worker)
  // The worker's transport, for caller delivery: a waiter reads its reply
  // itself instead of being woken by the delivery thread (Transport::
  // DeliverUntil). Weak: a Future may outlive its worker.
  std::weak_ptr<Transport> transport;
  // The worker's count of operations issued and not completed (this one
  // included until Set); shared with the worker.
  std::shared_ptr<std::atomic<int>> in_flight;
  // Memory the request reads or writes that the request itself owns
  // (PushAggregated's sums, PullDeduplicated's distinct keys and rows):
  // released with the last reference to this state, so never before the
  // worker is done with the request (it holds the state until then).
  std::vector<std::shared_ptr<const void>> owned ABSL_GUARDED_BY(mu);
  // A Future with a finishing step (Worker::PullDeduplicated): `after` is
  // the request it waits for (set at creation, never changed), `finish`
  // the step, run under mu by the first Wait() or ready() that finds
  // `after` done with OK, and dropped once run.
  std::optional<Future> after;
  std::function<absl::Status()> finish ABSL_GUARDED_BY(mu);

  void Set(absl::Status s) {
    {
      std::lock_guard lock(mu);
      if (status) return;
      status = std::move(s);
      done.store(true, std::memory_order_release);
    }
    if (in_flight) in_flight->fetch_sub(1, std::memory_order_relaxed);
    if (latency != nullptr) latency->Observe(static_cast<double>(MonotonicNow() - started) / kSeconds);
    cv.notify_all();
    if (std::shared_ptr<Transport> t = transport.lock()) t->WakeCallerDelivery();
  }
};

// A Future that completes once `after` did and `finish` ran (only if `after`
// ended with OK; its status is then the Future's).
Future Finally(Future after, std::function<absl::Status()> finish);

}  // namespace tessera

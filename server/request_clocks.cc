#include "server/request_clocks.h"

#include "absl/strings/str_cat.h"

namespace tessera {

// The clock fields of a push, pull or clock advance: in range, and a hold
// no longer than the server allows.
absl::Status CheckClockFields(const proto::Envelope& h, Nanos max_hold) {
  uint64_t clock = 0;
  uint64_t hold_ms = 0;
  const char* what = nullptr;
  if (h.has_push()) {
    clock = h.push().clock();
    what = "push";
  } else if (h.has_pull()) {
    clock = h.pull().clock();
    hold_ms = h.pull().hold_timeout_ms();
    what = "pull";
  } else if (h.has_clock_advance()) {
    clock = h.clock_advance().clock();
    hold_ms = h.clock_advance().hold_timeout_ms();
    what = "clock advance";
  } else {
    return absl::OkStatus();
  }
  if (clock >= kMaxClock) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " clock ", clock, " is out of range (clocks stay below 2^62 = ", kMaxClock, ")"));
  }
  const uint64_t max_hold_ms = static_cast<uint64_t>(max_hold / kMillis);
  if (hold_ms > max_hold_ms) {
    return absl::InvalidArgumentError(absl::StrCat(what, " asks to be held up to ", hold_ms,
                                                   " ms for slower workers; this server holds a request at most ",
                                                   max_hold_ms, " ms (tessera-server --max-hold-ms)"));
  }
  return absl::OkStatus();
}

// Staleness of a table: BSP 0, SSP its bound, ASP unbounded.
uint64_t Staleness(const proto::TableConfig& c) {
  switch (c.consistency()) {
    case proto::SSP: return c.staleness();
    case proto::ASP: return kUnboundedStaleness;
    default: return 0;
  }
}

}  // namespace tessera

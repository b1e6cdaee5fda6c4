#pragma once
// A straggler model for experiments: how much slower than the others a
// worker's compute is at a given step. Every worker evaluates the same pure
// function, so they agree on who is slow without talking.
//
// - kNone: nobody is slow (factor 1 everywhere).
// - kFixed: worker `rank` is slow at every step.
// - kRotating: at every step exactly one worker is slow, the same one for
//   `period` consecutive steps, then another chosen by a seeded hash of the
//   period index (it may be chosen again). This is a transient straggler
//   (background load, a noisy neighbour, garbage collection): on average each
//   worker is slow 1/W of the time.
//
// The slow worker's compute takes `slowdown` times the base step time.
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/keys.h"

namespace tessera::examples {

struct StragglerModel {
  enum class Mode { kNone, kFixed, kRotating };
  Mode mode = Mode::kNone;
  uint32_t rank = 0;      // kFixed: the slow worker
  double slowdown = 2.0;  // compute-time factor of the slow worker, >= 1
  uint64_t period = 1;    // kRotating: steps before the slow worker changes, >= 1
  uint64_t seed = 0;      // kRotating: which workers are chosen

  static absl::StatusOr<Mode> ParseMode(const std::string& s) {
    if (s == "none") return Mode::kNone;
    if (s == "fixed") return Mode::kFixed;
    if (s == "rotating") return Mode::kRotating;
    return absl::InvalidArgumentError(absl::StrCat("unknown straggler mode \"", s, "\" (none, fixed or rotating)"));
  }

  absl::Status Validate(uint32_t num_workers) const {
    if (!(slowdown >= 1.0)) return absl::InvalidArgumentError(absl::StrCat("straggler slowdown must be >= 1, got ", slowdown));
    if (period == 0) return absl::InvalidArgumentError("straggler period must be at least 1 step");
    if (mode == Mode::kFixed && rank >= num_workers) {
      return absl::InvalidArgumentError(
          absl::StrCat("straggler rank ", rank, " is not a worker of a job of ", num_workers, " workers"));
    }
    return absl::OkStatus();
  }

  // The worker that is slow at `step` (num_workers if nobody is).
  uint32_t SlowWorker(uint32_t num_workers, uint64_t step) const {
    switch (mode) {
      case Mode::kFixed: return rank;
      case Mode::kRotating: return static_cast<uint32_t>(Mix64(seed ^ Mix64(step / period)) % num_workers);
      default: return num_workers;
    }
  }

  // The compute-time factor of worker `me` at `step`: `slowdown` or 1.
  double Factor(uint32_t me, uint32_t num_workers, uint64_t step) const {
    return SlowWorker(num_workers, step) == me ? slowdown : 1.0;
  }
};

}  // namespace tessera::examples

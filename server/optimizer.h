#pragma once
// Server-side optimizers: the update a table applies to one row from one
// (aggregated) gradient row. Pure functions; no I/O, no state of their own:
// a row's optimizer state is stored beside its weights in the table
// (server/table.h), `OptimizerStateFloats` floats after the `width` weights.
//
// The update rules, for weight w, gradient g (per coordinate), learning rate
// lr = TableConfig.learning_rate and the hyper-parameters p =
// TableConfig.optimizer_params:
//   SGD         w -= lr * g
//   ACCUMULATE  w += g                                       (exact tests)
//   MOMENTUM    v = p.momentum * v + g;  w -= lr * v          (heavy ball)
//   ADAGRAD     a += g^2;  w -= lr * g / (sqrt(a) + p.epsilon)
//               a starts at p.initial_accumulator
//   ADAM        t += 1 (per row: "lazy" Adam, a row's step count advances
//               only when a push touches it); m = b1 m + (1 - b1) g;
//               v = b2 v + (1 - b2) g^2;
//               w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + p.epsilon)
//   FTRL        FTRL-Proximal (McMahan et al., "Ad click prediction: a view
//               from the trenches", 2013, algorithm 1), alpha = lr,
//               beta = p.ftrl_beta:
//               sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z += g - sigma * w;
//               n += g^2;
//               w = 0 if |z| <= l1, else
//                   -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)
//               The weight a new row starts from (its initializer's) enters
//               the first z update as the textbook's w does.
// State layout per row (floats after the weights): MOMENTUM v[width];
// ADAGRAD a[width]; ADAM m[width] v[width] t (a step count, exact up to
// 2^24 steps per row); FTRL z[width] n[width].
// Arithmetic is fp32, except the bias corrections and FTRL's square roots of
// the accumulator, which are computed per coordinate in fp32 too; tests
// compare against a double-precision reference within fp32 rounding.
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "proto/tessera.pb.h"

namespace tessera {

// Checks the hyper-parameters the table's optimizer uses (ranges above);
// the others are ignored.
absl::Status ValidateOptimizer(const proto::TableConfig& config);

// Floats of optimizer state per row (0 for SGD and ACCUMULATE).
uint32_t OptimizerStateFloats(const proto::TableConfig& config);

// Floats a table stores per row: width weights, then the optimizer state.
inline uint32_t StoredRowFloats(const proto::TableConfig& config) {
  return config.width() + OptimizerStateFloats(config);
}

// Sets the optimizer state of a new row (state.size() ==
// OptimizerStateFloats(config)).
void InitOptimizerState(const proto::TableConfig& config, std::span<float> state);

// Columns [first, first + count) of a row; count 0: the whole row.
struct Columns {
  uint32_t first = 0;
  uint32_t count = 0;
  bool whole() const { return count == 0; }
  // Floats of a row's piece: count, or the whole row's width.
  uint32_t Width(uint32_t row_width) const { return count == 0 ? row_width : count; }
};

// Whether the optimizer can update a piece of a row alone (Columns): every
// element-wise rule can; ADAM cannot (its step count is per row and push,
// and would advance once per piece).
bool UpdatesPiecesOfRows(proto::OptimizerKind kind);

// One update of one row: `row` holds StoredRowFloats(config) floats
// (weights, then state). With whole `columns`, `gradient` holds width
// floats; with a piece, it holds columns.count floats, the gradient of
// those columns, and only they (and their state) change, exactly as the
// whole-row update changes them. A piece must lie inside the row, and its
// optimizer must be UpdatesPiecesOfRows (asserted).
void ApplyOptimizer(const proto::TableConfig& config, float* row, const float* gradient, Columns columns = {});

// Whether the optimizer keeps state (its update is not linear in the
// gradient, so duplicate keys in one push are summed before one update).
inline bool IsStateful(proto::OptimizerKind kind) {
  return kind != proto::SGD && kind != proto::ACCUMULATE;
}

}  // namespace tessera

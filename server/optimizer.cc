#include "server/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace tessera {
namespace {

absl::Status Bad(const proto::TableConfig& c, const char* what, float value, const char* range) {
  return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": optimizer ",
                                                 proto::OptimizerKind_Name(c.optimizer()), " needs ", what, " ",
                                                 range, ", got ", value));
}

bool InUnit(float x) { return std::isfinite(x) && x >= 0.0f && x < 1.0f; }
bool Positive(float x) { return std::isfinite(x) && x > 0.0f; }
bool NonNegative(float x) { return std::isfinite(x) && x >= 0.0f; }

}  // namespace

absl::Status ValidateOptimizer(const proto::TableConfig& c) {
  const proto::OptimizerParams& p = c.optimizer_params();
  switch (c.optimizer()) {
    case proto::MOMENTUM:
      if (!InUnit(p.momentum())) return Bad(c, "momentum", p.momentum(), "in [0, 1)");
      break;
    case proto::ADAGRAD:
      if (!Positive(p.epsilon())) return Bad(c, "epsilon", p.epsilon(), "> 0");
      if (!NonNegative(p.initial_accumulator()))
        return Bad(c, "initial_accumulator", p.initial_accumulator(), ">= 0");
      break;
    case proto::ADAM:
      if (!InUnit(p.beta1())) return Bad(c, "beta1", p.beta1(), "in [0, 1)");
      if (!InUnit(p.beta2())) return Bad(c, "beta2", p.beta2(), "in [0, 1)");
      if (!Positive(p.epsilon())) return Bad(c, "epsilon", p.epsilon(), "> 0");
      break;
    case proto::FTRL:
      if (!Positive(p.ftrl_beta())) return Bad(c, "ftrl_beta", p.ftrl_beta(), "> 0");
      if (!NonNegative(p.l1())) return Bad(c, "l1", p.l1(), ">= 0");
      if (!NonNegative(p.l2())) return Bad(c, "l2", p.l2(), ">= 0");
      if (!(c.learning_rate() > 0.0f)) return Bad(c, "learning_rate (alpha)", c.learning_rate(), "> 0");
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

uint32_t OptimizerStateFloats(const proto::TableConfig& c) {
  switch (c.optimizer()) {
    case proto::MOMENTUM:
    case proto::ADAGRAD:
      return c.width();
    case proto::ADAM:
      return 2 * c.width() + 1;
    case proto::FTRL:
      return 2 * c.width();
    default:
      return 0;
  }
}

void InitOptimizerState(const proto::TableConfig& c, std::span<float> state) {
  const float fill = c.optimizer() == proto::ADAGRAD ? c.optimizer_params().initial_accumulator() : 0.0f;
  for (float& x : state) x = fill;
}

bool UpdatesPiecesOfRows(proto::OptimizerKind kind) { return kind != proto::ADAM; }

void ApplyOptimizer(const proto::TableConfig& c, float* __restrict row, const float* __restrict g, Columns cols) {
  // Once per row of a push: a debug check (Table::CheckPush validated the columns).
  TESSERA_DCHECK(cols.whole() ||
                 (UpdatesPiecesOfRows(c.optimizer()) && uint64_t{cols.first} + cols.count <= c.width()));
  const size_t width = c.width();  // the stride of the state arrays
  const size_t n = cols.Width(c.width());
  const float lr = c.learning_rate();
  const proto::OptimizerParams& p = c.optimizer_params();
  float* __restrict w = row + cols.first;          // the piece's weights
  float* __restrict s = row + width + cols.first;  // its first state array (after the weights)
  switch (c.optimizer()) {
    case proto::ACCUMULATE:
      for (size_t j = 0; j < n; ++j) w[j] += g[j];
      break;
    case proto::MOMENTUM: {
      const float mu = p.momentum();
      for (size_t j = 0; j < n; ++j) {
        s[j] = mu * s[j] + g[j];
        w[j] -= lr * s[j];
      }
      break;
    }
    case proto::ADAGRAD: {
      const float eps = p.epsilon();
      for (size_t j = 0; j < n; ++j) {
        s[j] += g[j] * g[j];
        w[j] -= lr * g[j] / (std::sqrt(s[j]) + eps);
      }
      break;
    }
    case proto::ADAM: {
      float* __restrict m = s;
      float* __restrict v = s + width;
      float& t = row[3 * width];  // whole rows only (asserted above)
      t += 1.0f;
      const float b1 = p.beta1(), b2 = p.beta2(), eps = p.epsilon();
      const float c1 = 1.0f - std::pow(b1, t);
      const float c2 = 1.0f - std::pow(b2, t);
      const float step = lr / c1;
      const float inv_sqrt_c2 = 1.0f / std::sqrt(c2);
      for (size_t j = 0; j < n; ++j) {
        m[j] = b1 * m[j] + (1.0f - b1) * g[j];
        v[j] = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
        w[j] -= step * m[j] / (std::sqrt(v[j]) * inv_sqrt_c2 + eps);
      }
      break;
    }
    case proto::FTRL: {
      float* __restrict z = s;
      float* __restrict acc = s + width;
      const float inv_alpha = 1.0f / lr;
      const float beta = p.ftrl_beta(), l1 = p.l1(), l2 = p.l2();
      for (size_t j = 0; j < n; ++j) {
        const float old_sqrt = std::sqrt(acc[j]);
        const float new_acc = acc[j] + g[j] * g[j];
        const float new_sqrt = std::sqrt(new_acc);
        z[j] += g[j] - (new_sqrt - old_sqrt) * inv_alpha * w[j];
        acc[j] = new_acc;
        if (std::fabs(z[j]) <= l1) {
          w[j] = 0.0f;
        } else {
          const float shrunk = z[j] - std::copysign(l1, z[j]);
          w[j] = -shrunk / ((beta + new_sqrt) * inv_alpha + l2);
        }
      }
      break;
    }
    default:  // SGD
      for (size_t j = 0; j < n; ++j) w[j] -= lr * g[j];
      break;
  }
}

}  // namespace tessera

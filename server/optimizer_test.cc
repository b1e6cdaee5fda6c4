// The server-side optimizers against textbook update rules computed here in
// double precision, over many steps, through Table::ApplyPush (so the state
// stored beside each row is exercised too).
#include "server/optimizer.h"

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/table.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kWidth = 4;

proto::TableConfig Config(proto::OptimizerKind kind, float lr) {
  proto::TableConfig c;
  c.set_table_id(3);
  c.set_width(kWidth);
  c.set_kind(proto::SPARSE);
  c.set_optimizer(kind);
  c.set_learning_rate(lr);
  c.set_init(proto::UNIFORM);
  c.set_init_scale(0.5f);
  c.set_init_seed(11);
  auto* p = c.mutable_optimizer_params();
  p->set_momentum(0.9f);
  p->set_beta1(0.9f);
  p->set_beta2(0.999f);
  p->set_epsilon(1e-8f);
  p->set_initial_accumulator(0.1f);
  p->set_ftrl_beta(1.0f);
  p->set_l1(0.05f);
  p->set_l2(0.01f);
  return c;
}

// The textbook rules (server/optimizer.h), in double precision.
struct Reference {
  proto::TableConfig c;
  std::vector<double> w, s1, s2;
  double t = 0;

  Reference(const proto::TableConfig& config, std::vector<double> initial)
      : c(config), w(std::move(initial)), s1(kWidth, 0.0), s2(kWidth, 0.0) {
    if (c.optimizer() == proto::ADAGRAD) std::fill(s1.begin(), s1.end(), c.optimizer_params().initial_accumulator());
  }

  void Step(const std::vector<double>& g) {
    const double lr = c.learning_rate();
    const auto& p = c.optimizer_params();
    t += 1;
    for (uint32_t j = 0; j < kWidth; ++j) {
      switch (c.optimizer()) {
        case proto::SGD:
          w[j] -= lr * g[j];
          break;
        case proto::MOMENTUM:
          s1[j] = p.momentum() * s1[j] + g[j];
          w[j] -= lr * s1[j];
          break;
        case proto::ADAGRAD:
          s1[j] += g[j] * g[j];
          w[j] -= lr * g[j] / (std::sqrt(s1[j]) + p.epsilon());
          break;
        case proto::ADAM: {
          const double b1 = p.beta1(), b2 = p.beta2();
          s1[j] = b1 * s1[j] + (1 - b1) * g[j];
          s2[j] = b2 * s2[j] + (1 - b2) * g[j] * g[j];
          const double mhat = s1[j] / (1 - std::pow(b1, t));
          const double vhat = s2[j] / (1 - std::pow(b2, t));
          w[j] -= lr * mhat / (std::sqrt(vhat) + p.epsilon());
          break;
        }
        case proto::FTRL: {
          // z = s1, n = s2.
          const double sigma = (std::sqrt(s2[j] + g[j] * g[j]) - std::sqrt(s2[j])) / lr;
          s1[j] += g[j] - sigma * w[j];
          s2[j] += g[j] * g[j];
          if (std::fabs(s1[j]) <= p.l1()) {
            w[j] = 0;
          } else {
            const double sign = s1[j] < 0 ? -1.0 : 1.0;
            w[j] = -(s1[j] - sign * p.l1()) / ((p.ftrl_beta() + std::sqrt(s2[j])) / lr + p.l2());
          }
          break;
        }
        default:
          ADD_FAILURE() << "no reference for " << proto::OptimizerKind_Name(c.optimizer());
      }
    }
  }
};

struct Case {
  proto::OptimizerKind kind;
  float lr;
};

class OptimizerTest : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerTest, MatchesTheTextbookRuleOverManySteps) {
  const proto::TableConfig c = Config(GetParam().kind, GetParam().lr);
  ASSERT_TRUE(ValidateTableConfig(c).ok()) << ValidateTableConfig(c);
  Table table(c, [](Key) { return true; });
  const Key key = 77;
  std::vector<float> initial(kWidth);
  ASSERT_TRUE(table.ReadRows(std::vector<Key>{key}, initial).ok());
  Reference ref(c, std::vector<double>(initial.begin(), initial.end()));

  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  constexpr int kSteps = 1000;
  double max_error = 0, max_weight = 0;
  for (int step = 0; step < kSteps; ++step) {
    // A gradient that pulls the weights toward a target, plus noise: the
    // weights move a lot early and settle, as in training.
    std::vector<float> g(kWidth);
    std::vector<double> gd(kWidth);
    for (uint32_t j = 0; j < kWidth; ++j) {
      gd[j] = static_cast<float>(0.5 * (ref.w[j] - (j % 2 ? 1.0 : -1.0)) + 0.3 * normal(rng));
      g[j] = static_cast<float>(gd[j]);
    }
    ASSERT_TRUE(table.ApplyPush(std::vector<Key>{key}, g, /*clock=*/step).ok());
    ref.Step(gd);
    std::vector<float> got(kWidth);
    ASSERT_TRUE(table.ReadRows(std::vector<Key>{key}, got).ok());
    for (uint32_t j = 0; j < kWidth; ++j) {
      max_error = std::max(max_error, std::fabs(got[j] - ref.w[j]));
      max_weight = std::max(max_weight, std::fabs(ref.w[j]));
    }
  }
  // fp32 against fp64 over 1000 steps: the errors stay at rounding level
  // relative to the weights' size (a wrong rule is off by orders more).
  EXPECT_LT(max_error, 2e-4 * std::max(1.0, max_weight))
      << proto::OptimizerKind_Name(c.optimizer()) << " max |w - w_ref| " << max_error;
  EXPECT_GT(max_weight, 0.3);  // the weights did move
}

INSTANTIATE_TEST_SUITE_P(Kinds, OptimizerTest,
                         ::testing::Values(Case{proto::SGD, 0.05f}, Case{proto::MOMENTUM, 0.01f},
                                           Case{proto::ADAGRAD, 0.1f}, Case{proto::ADAM, 0.01f},
                                           Case{proto::FTRL, 0.1f}),
                         [](const auto& info) { return proto::OptimizerKind_Name(info.param.kind); });

// The same rules in float, in the same order of operations, as plain code:
// ApplyOptimizer's loops are vectorized (server/CMakeLists.txt) and must
// still give exactly these bits (no reassociation, no FMA contraction).
void ScalarRule(const proto::TableConfig& c, float* w, const float* g) {
  const size_t n = c.width();
  const float lr = c.learning_rate();
  const auto& p = c.optimizer_params();
  float* s = w + n;
  for (size_t j = 0; j < n; ++j) {
    switch (c.optimizer()) {
      case proto::ACCUMULATE: w[j] += g[j]; break;
      case proto::SGD: w[j] -= lr * g[j]; break;
      case proto::MOMENTUM:
        s[j] = p.momentum() * s[j] + g[j];
        w[j] -= lr * s[j];
        break;
      case proto::ADAGRAD:
        s[j] += g[j] * g[j];
        w[j] -= lr * g[j] / (std::sqrt(s[j]) + p.epsilon());
        break;
      case proto::ADAM: {
        const float t = s[2 * n] + 1.0f;  // the step count, stored after m and v
        const float b1 = p.beta1(), b2 = p.beta2();
        const float step = lr / (1.0f - std::pow(b1, t));
        const float inv_sqrt_c2 = 1.0f / std::sqrt(1.0f - std::pow(b2, t));
        s[j] = b1 * s[j] + (1.0f - b1) * g[j];
        s[n + j] = b2 * s[n + j] + (1.0f - b2) * g[j] * g[j];
        w[j] -= step * s[j] / (std::sqrt(s[n + j]) * inv_sqrt_c2 + p.epsilon());
        break;
      }
      case proto::FTRL: {
        float* z = s;
        float* acc = s + n;
        const float old_sqrt = std::sqrt(acc[j]);
        const float new_acc = acc[j] + g[j] * g[j];
        const float new_sqrt = std::sqrt(new_acc);
        z[j] += g[j] - (new_sqrt - old_sqrt) * (1.0f / lr) * w[j];
        acc[j] = new_acc;
        w[j] = std::fabs(z[j]) <= p.l1()
                   ? 0.0f
                   : -(z[j] - std::copysign(p.l1(), z[j])) / ((p.ftrl_beta() + new_sqrt) * (1.0f / lr) + p.l2());
        break;
      }
      default: ADD_FAILURE() << "no scalar rule";
    }
  }
  if (c.optimizer() == proto::ADAM) s[2 * n] += 1.0f;
}

TEST(OptimizerBitsTest, EveryRuleGivesTheBitsOfThePlainLoop) {
  for (proto::OptimizerKind kind : {proto::ACCUMULATE, proto::SGD, proto::MOMENTUM, proto::ADAGRAD,
                                    proto::ADAM, proto::FTRL}) {
    proto::TableConfig c = Config(kind, 0.05f);
    c.set_width(1037);  // vector bodies and an odd tail
    const size_t stored = StoredRowFloats(c);
    std::mt19937_64 rng(9);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> a(stored), b;
    for (size_t j = 0; j < c.width(); ++j) a[j] = normal(rng);
    InitOptimizerState(c, std::span(a).subspan(c.width(), stored - c.width()));
    b = a;
    for (int step = 0; step < 20; ++step) {
      std::vector<float> g(c.width());
      for (float& x : g) x = normal(rng) * (step % 3 == 0 ? 1e-3f : 1.0f);
      ApplyOptimizer(c, a.data(), g.data());
      ScalarRule(c, b.data(), g.data());
      for (size_t j = 0; j < stored; ++j) {
        ASSERT_EQ(std::bit_cast<uint32_t>(a[j]), std::bit_cast<uint32_t>(b[j]))
            << proto::OptimizerKind_Name(kind) << " step " << step << " float " << j;
      }
    }
  }
}

// A row updated piece by piece (Columns) ends with the bits of the row
// updated whole, state included, for every optimizer that allows pieces;
// ADAM (a step count per row and push) does not.
TEST(OptimizerPiecesTest, PiecesOfARowGiveTheBitsOfTheWholeRowUpdate) {
  for (proto::OptimizerKind kind : {proto::ACCUMULATE, proto::SGD, proto::MOMENTUM, proto::ADAGRAD, proto::FTRL}) {
    ASSERT_TRUE(UpdatesPiecesOfRows(kind)) << proto::OptimizerKind_Name(kind);
    proto::TableConfig c = Config(kind, 0.05f);
    c.set_width(1037);
    const size_t stored = StoredRowFloats(c);
    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> whole(stored);
    for (size_t j = 0; j < c.width(); ++j) whole[j] = normal(rng);
    InitOptimizerState(c, std::span(whole).subspan(c.width(), stored - c.width()));
    std::vector<float> pieces = whole;
    for (int step = 0; step < 5; ++step) {
      std::vector<float> g(c.width());
      for (float& x : g) x = normal(rng);
      ApplyOptimizer(c, whole.data(), g.data());
      // Pieces of 0-400, 400-1000 and 1000-1037, out of order.
      for (const Columns piece : {Columns{400, 600}, Columns{0, 400}, Columns{1000, 37}}) {
        ApplyOptimizer(c, pieces.data(), g.data() + piece.first, piece);
      }
      for (size_t j = 0; j < stored; ++j) {
        ASSERT_EQ(std::bit_cast<uint32_t>(whole[j]), std::bit_cast<uint32_t>(pieces[j]))
            << proto::OptimizerKind_Name(kind) << " step " << step << " float " << j;
      }
    }
    // One piece changes its columns (and their state) only.
    std::vector<float> before = pieces;
    std::vector<float> g(10, 0.5f);
    ApplyOptimizer(c, pieces.data(), g.data(), Columns{100, 10});
    for (size_t j = 0; j < stored; ++j) {
      const size_t column = j % c.width();
      if (column < 100 || column >= 110) {
        ASSERT_EQ(pieces[j], before[j]) << proto::OptimizerKind_Name(kind) << " " << j;
      }
    }
    EXPECT_NE(pieces[100], before[100]) << proto::OptimizerKind_Name(kind);
  }
  EXPECT_FALSE(UpdatesPiecesOfRows(proto::ADAM));
}

TEST(OptimizerPiecesTest, TablesCheckPiecesAndApplyThemInPlace) {
  Table sgd(Config(proto::ACCUMULATE, 1), [](Key) { return true; });
  const std::vector<Key> keys = {3, 8};
  // Outside the row, columns without a count, a values size for whole rows: errors naming the problem.
  std::vector<float> two(2 * 2, 1.0f);
  absl::Status s = sgd.ApplyPush(keys, two, 0, Columns{kWidth - 1, 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("outside rows of width"));
  s = sgd.CheckColumns(Columns{2, 0});
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("has no columns"));
  std::vector<float> whole_rows(keys.size() * kWidth, 1.0f);
  EXPECT_FALSE(sgd.ApplyPush(keys, whole_rows, 0, Columns{0, 2}).ok());
  // A piece: columns 1 and 2 of each key's row.
  ASSERT_TRUE(sgd.ApplyPush(keys, std::vector<float>{1, 2, 3, 4}, 0, Columns{1, 2}).ok());
  std::vector<float> out(keys.size() * kWidth);
  ASSERT_TRUE(sgd.ReadRows(keys, out).ok());
  std::vector<float> want(keys.size() * kWidth, 0.0f);
  want[1] = 1, want[2] = 2, want[kWidth + 1] = 3, want[kWidth + 2] = 4;
  std::vector<float> initial(keys.size() * kWidth);
  Table fresh(Config(proto::ACCUMULATE, 1), [](Key) { return true; });
  ASSERT_TRUE(fresh.ReadRows(keys, initial).ok());
  for (size_t j = 0; j < out.size(); ++j) EXPECT_EQ(out[j], initial[j] + want[j]) << j;

  // SGD (the table's own inline loop): w -= lr * g in the piece's columns only.
  Table plain(Config(proto::SGD, 0.5f), [](Key) { return true; });
  std::vector<float> start(keys.size() * kWidth), after(keys.size() * kWidth);
  ASSERT_TRUE(plain.ReadRows(keys, start).ok());
  ASSERT_TRUE(plain.ApplyPush(keys, std::vector<float>{2, 4}, 0, Columns{3, 1}).ok());
  ASSERT_TRUE(plain.ReadRows(keys, after).ok());
  for (size_t j = 0; j < after.size(); ++j) {
    const float step = j == 3 ? 1.0f : j == kWidth + 3 ? 2.0f : 0.0f;
    EXPECT_EQ(after[j], start[j] - step) << j;
  }

  Table adam(Config(proto::ADAM, 0.05f), [](Key) { return true; });
  s = adam.ApplyPush(keys, two, 0, Columns{0, 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("ADAM updates whole rows only"));
  EXPECT_TRUE(adam.CheckColumns(Columns{}).ok());
}

TEST(OptimizerStateTest, StoredRowsCarryTheStateSoACopyContinuesExactly) {
  for (proto::OptimizerKind kind : {proto::MOMENTUM, proto::ADAGRAD, proto::ADAM, proto::FTRL}) {
    const proto::TableConfig c = Config(kind, 0.05f);
    Table a(c, [](Key) { return true; });
    const std::vector<Key> keys = {1, 2, 3};
    std::vector<float> g(keys.size() * kWidth);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
    for (int s = 0; s < 5; ++s) ASSERT_TRUE(a.ApplyPush(keys, g).ok());
    // Copy a's stored rows into b, then push the same to both.
    Table b(c, [](Key) { return true; });
    std::vector<Key> ks;
    std::vector<float> vs;
    a.ForEachRow([&](Key k, std::span<const float> row) {
      EXPECT_EQ(row.size(), StoredRowFloats(c));
      ks.push_back(k);
      vs.insert(vs.end(), row.begin(), row.end());
    });
    ASSERT_TRUE(b.RestoreRows(ks, vs).ok());
    for (int s = 0; s < 5; ++s) {
      ASSERT_TRUE(a.ApplyPush(keys, g).ok());
      ASSERT_TRUE(b.ApplyPush(keys, g).ok());
    }
    std::vector<float> ra(keys.size() * kWidth), rb(keys.size() * kWidth);
    ASSERT_TRUE(a.ReadRows(keys, ra).ok());
    ASSERT_TRUE(b.ReadRows(keys, rb).ok());
    EXPECT_EQ(ra, rb) << proto::OptimizerKind_Name(kind);
  }
}

TEST(OptimizerStateTest, DuplicateKeysInOnePushMakeOneStepFromTheirSum) {
  const proto::TableConfig c = Config(proto::ADAM, 0.05f);
  Table dup(c, [](Key) { return true; });
  Table sum(c, [](Key) { return true; });
  std::vector<float> g1(kWidth, 0.25f), g2(kWidth, -1.0f), both(kWidth, -0.75f);
  std::vector<float> dup_values = g1;
  dup_values.insert(dup_values.end(), g2.begin(), g2.end());
  ASSERT_TRUE(dup.ApplyPush(std::vector<Key>{9, 9}, dup_values).ok());
  ASSERT_TRUE(sum.ApplyPush(std::vector<Key>{9}, both).ok());
  std::vector<float> a(kWidth), b(kWidth);
  ASSERT_TRUE(dup.ReadRows(std::vector<Key>{9}, a).ok());
  ASSERT_TRUE(sum.ReadRows(std::vector<Key>{9}, b).ok());
  EXPECT_EQ(a, b);
  // Adam's step count is in the state: one step, not two.
  dup.ForEachRow([&](Key, std::span<const float> row) { EXPECT_EQ(row[3 * kWidth], 1.0f); });
}

TEST(OptimizerValidationTest, BadHyperParametersAreErrorsNamingThem) {
  struct Bad {
    proto::OptimizerKind kind;
    void (*spoil)(proto::OptimizerParams*);
    const char* name;
  };
  const Bad cases[] = {
      {proto::MOMENTUM, [](proto::OptimizerParams* p) { p->set_momentum(1.0f); }, "momentum"},
      {proto::ADAGRAD, [](proto::OptimizerParams* p) { p->set_epsilon(0.0f); }, "epsilon"},
      {proto::ADAGRAD, [](proto::OptimizerParams* p) { p->set_initial_accumulator(-1.0f); }, "initial_accumulator"},
      {proto::ADAM, [](proto::OptimizerParams* p) { p->set_beta1(-0.1f); }, "beta1"},
      {proto::ADAM, [](proto::OptimizerParams* p) { p->set_beta2(NAN); }, "beta2"},
      {proto::FTRL, [](proto::OptimizerParams* p) { p->set_ftrl_beta(0.0f); }, "ftrl_beta"},
      {proto::FTRL, [](proto::OptimizerParams* p) { p->set_l1(-1.0f); }, "l1"},
  };
  for (const Bad& b : cases) {
    proto::TableConfig c = Config(b.kind, 0.1f);
    b.spoil(c.mutable_optimizer_params());
    absl::Status s = ValidateTableConfig(c);
    EXPECT_FALSE(s.ok()) << b.name;
    EXPECT_THAT(s.message(), HasSubstr(b.name));
  }
  // Parameters another optimizer would use do not matter.
  proto::TableConfig sgd = Config(proto::SGD, 0.1f);
  sgd.mutable_optimizer_params()->set_epsilon(0.0f);
  EXPECT_TRUE(ValidateTableConfig(sgd).ok());
}

TEST(OptimizerStateTest, StateSizesAreAsDocumented) {
  EXPECT_EQ(StoredRowFloats(Config(proto::SGD, 1)), kWidth);
  EXPECT_EQ(StoredRowFloats(Config(proto::ACCUMULATE, 1)), kWidth);
  EXPECT_EQ(StoredRowFloats(Config(proto::MOMENTUM, 1)), 2 * kWidth);
  EXPECT_EQ(StoredRowFloats(Config(proto::ADAGRAD, 1)), 2 * kWidth);
  EXPECT_EQ(StoredRowFloats(Config(proto::ADAM, 1)), 3 * kWidth + 1);
  EXPECT_EQ(StoredRowFloats(Config(proto::FTRL, 1)), 3 * kWidth);
}

}  // namespace
}  // namespace tessera

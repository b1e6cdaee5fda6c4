#include "server/admission_sketch.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(AdmissionSketchTest, CountsExactlyWithoutCollisionsAndNeverUnderCounts) {
  AdmissionSketch sketch(1 << 16, 3);
  for (uint64_t id = 1; id <= 200; ++id)
    for (uint64_t k = 0; k < id % 7; ++k) EXPECT_EQ(sketch.Add(id), k + 1);
  for (uint64_t id = 1; id <= 200; ++id) EXPECT_EQ(sketch.Count(id), id % 7) << id;
  EXPECT_EQ(sketch.Count(999), 0u);
  EXPECT_EQ(sketch.bytes(), AdmissionSketch::kDepth * (1u << 16) * 2u);
}

TEST(AdmissionSketchTest, ATinySketchOverCountsButNeverUnder) {
  AdmissionSketch sketch(16, 1);  // 16 counters a row: ids collide (and 150 additions < 160: no halving)
  for (uint64_t id = 0; id < 50; ++id)
    for (int k = 0; k < 3; ++k) sketch.Add(id);
  uint64_t over = 0;
  for (uint64_t id = 0; id < 50; ++id) {
    EXPECT_GE(sketch.Count(id), 3u);
    over += sketch.Count(id) - 3;
  }
  EXPECT_GT(over, 0u);  // 50 ids in 16 slots a row must collide
}

TEST(AdmissionSketchTest, HalvesEveryTenWidthAdditions) {
  AdmissionSketch sketch(4, 2);
  for (int k = 0; k < 39; ++k) sketch.Add(5);
  EXPECT_EQ(sketch.Count(5), 39u);
  EXPECT_EQ(sketch.halvings(), 0u);
  sketch.Add(5);  // the 40th addition: 40 -> 20
  EXPECT_EQ(sketch.halvings(), 1u);
  EXPECT_EQ(sketch.Count(5), 20u);
}

}  // namespace
}  // namespace tessera

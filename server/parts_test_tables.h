#pragma once
// Test helpers shared by the server parts' tests (server_parts_test): the
// table config those tests build their tables and snapshots from, shard
// maps' nodes and views, keys frames, and a disk tier store whose own
// memory grows with its rows (also used by cold_rows_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/buffer.h"
#include "common/keys.h"
#include "proto/tessera.pb.h"
#include "server/cold_rows.h"

namespace tessera::parts_test {

// A disk tier store in memory (MemoryColdRows) that reports `per_row`
// bytes of its own memory for each row it holds, as the log store's index
// does: the more rows it takes, the fewer the budget leaves in memory.
class StoreWithMemoryPerRow : public MemoryColdRows {
 public:
  StoreWithMemoryPerRow(uint32_t row_floats, uint64_t per_row) : MemoryColdRows(row_floats), per_row_(per_row) {}
  uint64_t memory_bytes(uint64_t rows) const override { return rows * per_row_; }

 private:
  const uint64_t per_row_;
};

// A SPARSE ACCUMULATE table (learning rate 1: pushes add exactly).
inline proto::TableConfig Config(uint32_t id, uint32_t width) {
  proto::TableConfig c;
  c.set_table_id(id);
  c.set_width(width);
  c.set_kind(proto::SPARSE);
  c.set_optimizer(proto::ACCUMULATE);
  c.set_learning_rate(1.0f);
  return c;
}

// Server nodes with these node ids (for RoundRobinShardMap).
inline std::vector<proto::NodeInfo> Nodes(std::vector<uint32_t> ids) {
  std::vector<proto::NodeInfo> nodes(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) nodes[i].set_node_id(ids[i]);
  return nodes;
}

// The view of a map the test made valid (a test failure if not).
inline ShardMapView View(const proto::ShardMap& map) {
  auto view = ShardMapView::Create(map);
  EXPECT_TRUE(view.ok()) << view.status();
  return *view;
}

// A keys frame holding `keys`.
inline Buffer KeysBuffer(const std::vector<Key>& keys) {
  Buffer b = Buffer::Allocate(keys.size() * sizeof(Key));
  std::copy(keys.begin(), keys.end(), b.AsMutable<Key>().begin());
  return b;
}

}  // namespace tessera::parts_test

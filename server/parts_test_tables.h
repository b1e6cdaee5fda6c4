#pragma once
// Test helper shared by the server parts' tests (server_parts_test): the
// table config those tests build their tables and snapshots from.
#include <cstdint>

#include "proto/tessera.pb.h"

namespace tessera::parts_test {

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

}  // namespace tessera::parts_test

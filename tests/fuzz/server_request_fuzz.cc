// Fuzz target: one request, any bytes, into a live ServerCore (a map of two
// servers, replication 2, tables of every kind this server can hold: sparse
// and dense, a compressed one, SSP, one with eviction by age). The core must answer or refuse without
// crashing, reading out of bounds or tripping a sanitizer. Replayed over the
// corpus in tests/fuzz/corpus/server_request by the test suite.
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>

#include "common/keys.h"
#include "server/server_core.h"
#include "tests/fuzz/fuzz_input.h"

namespace tessera {
namespace {

proto::NodeInfo Node(uint32_t rank, uint32_t id) {
  proto::NodeInfo n;
  n.set_rank(rank);
  n.set_role(proto::SERVER);
  n.set_node_id(id);
  n.set_address("inproc://server-" + std::to_string(rank));
  return n;
}

Message Request(uint64_t id) {
  Message m;
  m.header.set_request_id(id);
  m.header.set_sender_address("inproc://worker");
  m.header.set_sender_id(10);
  m.header.set_epoch(1);
  return m;
}

Message CreateTable(uint32_t id, uint32_t width, proto::TableKind kind, const std::string& compression,
                    proto::ConsistencyKind consistency) {
  Message m = Request(1000 + id);
  auto* c = m.header.mutable_create_table()->mutable_config();
  c->set_table_id(id);
  c->set_width(width);
  c->set_kind(kind);
  if (kind == proto::DENSE) c->set_dense_rows(64);
  c->set_optimizer(id == 2 ? proto::SGD : proto::ACCUMULATE);
  c->set_learning_rate(0.1f);
  c->set_compression(compression);
  c->set_consistency(consistency);
  c->set_staleness(consistency == proto::SSP ? 2 : 0);
  return m;
}

std::unique_ptr<ServerCore> MakeCore() {
  // Limits as a production server would set them (tessera-server
  // --max-table-mb): without one, a request for a huge dense table is
  // honoured and takes more memory than the fuzzer allows.
  auto core = std::make_unique<ServerCore>(ServerCoreOptions{.node_id = 1, .max_table_bytes = 16u << 20});
  std::vector<proto::NodeInfo> servers = {Node(0, 1), Node(1, 2)};
  (void)core->InstallShardMap(RoundRobinShardMap(1, 16, servers, 2), 0);
  core->SetWorkers({{10, 0}, {11, 1}});
  (void)core->Step(CreateTable(1, 4, proto::SPARSE, "", proto::ASP));
  (void)core->Step(CreateTable(2, 2, proto::DENSE, "", proto::BSP));
  (void)core->Step(CreateTable(3, 8, proto::SPARSE, "topk:ratio=0.5", proto::SSP));
  Message evicting = CreateTable(5, 2, proto::SPARSE, "", proto::ASP);
  evicting.header.mutable_create_table()->mutable_config()->set_evict_after_clocks(2);
  (void)core->Step(std::move(evicting));
  return core;
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  Message m;
  if (!fuzz::ReadMessage(data, size, &m)) return 0;
  // A fresh core per input: a crash replays from the input alone.
  auto core = MakeCore();
  for (Outgoing& o : core->Step(std::move(m), 1000)) (void)o;
  (void)core->Tick(2000);
  (void)core->AuditDump();
  return 0;
}

void WriteSeeds(const std::string& dir) {
  using namespace tessera;
  auto write = [&](const std::string& name, const Message& m) {
    std::ofstream(dir + "/" + name, std::ios::binary) << fuzz::WriteMessage(m);
  };
  const std::vector<Key> keys = {0, 3, 16, 35};
  std::vector<float> values(keys.size() * 4, 0.5f);
  Message push = Request(1);
  push.header.mutable_push()->set_table_id(1);
  push.header.mutable_push()->set_num_keys(keys.size());
  push.header.mutable_push()->set_seq(1);
  push.header.mutable_push()->set_clock(0);
  push.frames = {Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)),
                 Buffer::CopyOf(values.data(), values.size() * sizeof(float))};
  write("push", push);
  Message pull = Request(2);
  pull.header.mutable_pull()->set_table_id(1);
  pull.header.mutable_pull()->set_num_keys(keys.size());
  pull.frames = {Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key))};
  write("pull", pull);
  Message dense = pull;
  dense.header.mutable_pull()->set_table_id(2);
  write("pull-dense", dense);
  Message clock = Request(3);
  clock.header.mutable_clock_advance()->set_clock(1);
  write("clock", clock);
  write("create", CreateTable(4, 3, proto::SPARSE, "fp16", proto::BSP));
  Message forward = Request(4);
  forward.header.set_sender_address("inproc://server-1");
  forward.header.set_sender_id(2);
  forward.header.mutable_replicate()->set_position(1);
  forward.header.mutable_replicate()->set_worker_id(10);
  forward.header.mutable_replicate()->set_seq(1);
  forward.header.mutable_replicate()->set_table_id(1);
  forward.header.mutable_replicate()->set_num_keys(keys.size());
  forward.frames = push.frames;
  write("replicate", forward);
  // Regressions (each once got past the checks; now refused):
  // a pull held on the BSP table asking for a 2^64-1 ms hold (its deadline
  // overflowed), a clock advance to 2^64-1, and a push whose acked_below
  // passed its own number (every later push of the worker would have been
  // dropped as a duplicate).
  Message held = dense;
  held.header.mutable_pull()->set_clock(5);
  held.header.mutable_pull()->set_hold_timeout_ms(std::numeric_limits<uint64_t>::max());
  write("regress-pull-hold-overflow", held);
  Message far = clock;
  far.header.mutable_clock_advance()->set_clock(std::numeric_limits<uint64_t>::max());
  far.header.mutable_clock_advance()->set_hold_timeout_ms(std::numeric_limits<uint64_t>::max());
  write("regress-clock-out-of-range", far);
  Message acked = push;
  acked.header.mutable_push()->set_acked_below(std::numeric_limits<uint64_t>::max());
  write("regress-push-acked-below-past-seq", acked);
  // A push to the table with eviction by age stamped 2^40, far past every
  // announced clock: its table's clock once jumped there, and every row was
  // dropped at once (now it moves one past the highest announced clock).
  std::vector<float> narrow(keys.size() * 2, 0.5f);
  Message ahead = push;
  ahead.header.mutable_push()->set_table_id(5);
  ahead.header.mutable_push()->set_clock(uint64_t{1} << 40);
  ahead.frames[1] = Buffer::CopyOf(narrow.data(), narrow.size() * sizeof(float));
  write("regress-push-clock-far-ahead", ahead);
}

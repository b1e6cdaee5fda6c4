// ToTableConfig (see worker/table_config.h).
#include "worker/table_config.h"

namespace tessera {

proto::TableConfig ToTableConfig(const TableOptions& o) {
  proto::TableConfig c;
  c.set_table_id(o.id);
  c.set_name(o.name);
  c.set_width(o.width);
  c.set_kind(o.kind);
  c.set_dense_rows(o.dense_rows);
  c.set_optimizer(o.optimizer);
  c.set_learning_rate(o.learning_rate);
  c.set_init(o.init);
  c.set_init_scale(o.init_scale);
  c.set_init_seed(o.init_seed);
  c.set_consistency(o.consistency);
  c.set_staleness(o.consistency == proto::SSP ? o.staleness : 0);
  c.set_compression(o.compression);
  c.set_pull_compression(o.pull_compression);
  // Only the hyper-parameters the optimizer uses, so that tables differing
  // in unused ones are the same table.
  proto::OptimizerParams& p = *c.mutable_optimizer_params();
  switch (o.optimizer) {
    case proto::MOMENTUM:
      p.set_momentum(o.momentum);
      break;
    case proto::ADAGRAD:
      p.set_epsilon(o.epsilon);
      p.set_initial_accumulator(o.initial_accumulator);
      break;
    case proto::ADAM:
      p.set_beta1(o.beta1);
      p.set_beta2(o.beta2);
      p.set_epsilon(o.epsilon);
      break;
    case proto::FTRL:
      p.set_ftrl_beta(o.ftrl_beta);
      p.set_l1(o.l1);
      p.set_l2(o.l2);
      break;
    default:
      c.clear_optimizer_params();
      break;
  }
  c.set_admit_after(o.admit_after);
  c.set_admission_sketch_width(o.admission_sketch_width);
  c.set_evict_after_clocks(o.evict_after_clocks);
  c.set_memory_budget_bytes(o.memory_budget_bytes);
  c.set_disk_tier(o.disk_tier);
  return c;
}

}  // namespace tessera

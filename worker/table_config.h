#pragma once
// ToTableConfig: a table's options as the worker gives them (TableOptions,
// worker/worker.h) turned into the TableConfig that CreateTable sends to
// every server (proto/tessera.proto). Called by the Worker shell's
// CreateTable (worker/worker.cc).
//
// Contract: a pure function. The staleness is kept only for SSP tables,
// and of the optimizer hyper-parameters only those the table's optimizer
// uses (none for SGD and ACCUMULATE), so that options that differ only in
// unused fields make the same table (servers compare configs to tell a
// repeated CreateTable from a conflicting one). Nothing is validated here:
// servers check the config and answer what is wrong.
#include "proto/tessera.pb.h"
#include "worker/worker.h"

namespace tessera {

proto::TableConfig ToTableConfig(const TableOptions& options);

}  // namespace tessera

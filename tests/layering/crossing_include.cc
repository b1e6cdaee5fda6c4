// Built only by the ctest layering_refuses_a_crossing_include, which expects
// it NOT to compile: rdma/ links no server target, so it must not see
// server/ headers (docs/design.md, "Layers").
#include "server/table.h"
#include "transport/transport.h"

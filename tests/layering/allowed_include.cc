// Built only by the ctest layering_allows_a_linked_interface: rdma/ links
// the Transport interface (tessera_transport_api), so this compiles; the
// control for layering_refuses_a_crossing_include.
#include "transport/transport.h"

namespace tessera {
int LayeringProbe() { return 0; }
}  // namespace tessera

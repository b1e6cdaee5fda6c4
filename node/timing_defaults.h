// The default timings of the membership protocol: one definition for the
// binaries' flags (tessera-coordinator, tessera-server, the workers'
// CoordinatorSession) and the simulator's scale runs (docs/scaling.md),
// so that simulated figures are figures of the settings users get.
//
// - Workers heartbeat every kDefaultHeartbeatInterval; the coordinator
//   tells registering nodes that interval too (--heartbeat-interval), and a
//   node whose own interval is longer adopts it.
// - Servers heartbeat every kDefaultServerHeartbeatInterval: under
//   replication the coordinator loses a server after kDefaultServerLease of
//   silence (--server-lease) and fails its shards over; every other node,
//   and servers without replication, after kDefaultLease (--lease).
// - A node logs kDefaultLease of coordinator silence and gives up after
//   CoordinatorSession::Options::give_up.
//
// The launcher's defaults (launcher/tessera_launch/config.py, timeouts.*)
// are the same numbers; launcher/tests/test_defaults.py checks the two
// against each binary's --help.
#pragma once

#include "common/clock.h"

namespace tessera {

inline constexpr Nanos kDefaultHeartbeatInterval = 1 * kSeconds;
inline constexpr Nanos kDefaultServerHeartbeatInterval = 100 * kMillis;
inline constexpr Nanos kDefaultLease = 5 * kSeconds;
inline constexpr Nanos kDefaultServerLease = 500 * kMillis;

// Seconds, for the binaries' command-line defaults.
inline constexpr double DefaultSeconds(Nanos n) { return static_cast<double>(n) / 1e9; }

}  // namespace tessera

#pragma once
// Prometheus series of a transport's counters, for a node's /metrics page:
//   tessera_transport_messages_total{direction="sent"|"received"}
//   tessera_transport_bytes_total{direction}            header + frames, ring bytes included
//   tessera_transport_zmq_parts_total{direction}        ZeroMQ message parts (header and data frames)
//   tessera_transport_malformed_total                   incoming messages dropped as malformed
//   tessera_transport_auth_rejected_total               connections refused (not the job's key)
//   tessera_transport_shm_frames_total{direction}       frames through same-host shared memory
//   tessera_transport_shm_bytes_total{direction}
//   tessera_transport_shm_fallback_frames_total         same-host frames sent over the wire: ring full
//   tessera_transport_shm_peers                         destinations with a shared-memory ring now
//   tessera_transport_shm_lent_frames_total{direction}  frames lent (read in place by a same-host peer)
//   tessera_transport_shm_lent_bytes_total{direction}
//   tessera_transport_shm_lent_bytes                    lent by this process and not yet released
//   tessera_transport_shm_lends_reclaimed_total         lends dropped because the reader's process ended
//   tessera_transport_batches_total{direction}          batches of small messages (coalescing_transport.h)
//   tessera_transport_batched_messages_total{direction} messages that went inside them
//
// Bytes are Tessera message bytes (TransportStats in transport/transport.h):
// not ZeroMQ framing, handshakes, CURVE encryption or TCP/IP headers. Over
// ZeroMQ/TCP the sockets carry these bytes (minus the shm ones) plus 2 to 9
// bytes per part (35 to 42 with CURVE) plus each connection's greeting and
// handshake; tests/launcher_e2e/test_wire_bytes.py checks that against the
// kernel's counters.
#include "common/metrics.h"
#include "transport/transport.h"

namespace tessera {

inline metrics::TextWriter& WriteTransportMetrics(metrics::TextWriter& w, const TransportStats& s) {
  using Series = metrics::TextWriter::Series;
  auto both = [](uint64_t sent, uint64_t received) {
    return Series{{{{"direction", "sent"}}, static_cast<double>(sent)},
                  {{{"direction", "received"}}, static_cast<double>(received)}};
  };
  return w.Counters("tessera_transport_messages_total", "Messages sent and received by this node's transport",
                    both(s.messages_sent, s.messages_received))
      .Counters("tessera_transport_bytes_total",
                "Message header and frame bytes sent and received (shared memory included; not ZeroMQ framing, "
                "handshakes, encryption or TCP/IP headers)",
                both(s.bytes_sent, s.bytes_received))
      .Counters("tessera_transport_zmq_parts_total",
                "ZeroMQ message parts (header and data frames) of the messages sent and received",
                both(s.zmq_parts_sent, s.zmq_parts_received))
      .Counter("tessera_transport_malformed_total", "Incoming messages dropped as malformed", s.malformed_received)
      .Counter("tessera_transport_auth_rejected_total", "Connections refused: not the job's key", s.auth_rejected)
      .Counters("tessera_transport_shm_frames_total", "Data frames through same-host shared memory",
                both(s.shm_frames_sent, s.shm_frames_received))
      .Counters("tessera_transport_shm_bytes_total", "Data frame bytes through same-host shared memory",
                both(s.shm_bytes_sent, s.shm_bytes_received))
      .Counter("tessera_transport_shm_fallback_frames_total",
               "Frames for a same-host peer sent over the wire because its ring was full", s.shm_fallback_frames)
      .Counters("tessera_transport_shm_lent_frames_total", "Data frames lent to or by a same-host peer",
                both(s.shm_lent_frames_sent, s.shm_lent_frames_received))
      .Counters("tessera_transport_shm_lent_bytes_total", "Data frame bytes lent to or by a same-host peer",
                both(s.shm_lent_bytes_sent, s.shm_lent_bytes_received))
      .Gauge("tessera_transport_shm_lent_bytes", "Bytes lent by this process and not yet released",
             s.shm_lent_bytes_now)
      .Counter("tessera_transport_shm_lends_reclaimed_total",
               "Lends dropped because the reading process ended", s.shm_lends_reclaimed)
      .Gauge("tessera_transport_shm_peers", "Destinations with a shared-memory ring now", s.shm_peers)
      .Counters("tessera_transport_batches_total",
                "Batches of small messages sent and received (each one message in the counts above)",
                both(s.coalesce_batches_sent, s.coalesce_batches_received))
      .Counters("tessera_transport_batched_messages_total", "Messages that went inside batches",
                both(s.coalesce_messages_batched, s.coalesce_messages_unbatched));
}

}  // namespace tessera

// tessera-server: the I/O shell around ServerCore. It joins the job through
// the coordinator, installs the shard map, then feeds every request to the
// core on the transport's delivery thread and sends the replies. It exits 0
// when the coordinator ends the job in order, 1 on any failure, with one
// line that says why.
#include <csignal>
#include <cstdio>

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "node/coordinator_session.h"
#include "server/server_core.h"
#include "transport/transport_factory.h"

namespace tessera {
namespace {

struct ServerFlags {
  std::string coordinator;
  int rank = -1;
  std::string bind = "tcp://127.0.0.1:0";
  std::string name;
  double connect_timeout = 60;
  double heartbeat_interval = 1;
  double lease = 5;
  bool debug = false;
};

Nanos ToNanos(double seconds) { return static_cast<Nanos>(seconds * 1e9); }

int Run(const ServerFlags& flags) {
  auto transport = MakeTransport(flags.bind);
  if (!transport.ok()) {
    TLOG_ERROR("cannot create transport: {}", transport.status().ToString());
    return 1;
  }
  CoordinatorSession::Options so;
  so.coordinator = flags.coordinator;
  so.role = proto::SERVER;
  so.rank = flags.rank;
  so.connect_timeout = ToNanos(flags.connect_timeout);
  so.heartbeat_interval = ToNanos(flags.heartbeat_interval);
  so.lease = ToNanos(flags.lease);
  CoordinatorSession session(so, transport->get());

  BufferPool pool;
  std::unique_ptr<ServerCore> core;  // created once the node id is known
  std::mutex core_mu;                // guards `core` being set; Step runs on the delivery thread only
  Transport* t = transport->get();
  absl::Status started = t->Start([&](Message m) {
    if (session.Handle(m)) return;
    ServerCore* c;
    {
      std::lock_guard lock(core_mu);
      c = core.get();
    }
    if (c == nullptr) {
      // Not ready yet: answer so the client does not wait for nothing.
      if (m.header.request_id() == 0) return;
      Message reply;
      reply.header.set_request_id(m.header.request_id());
      reply.header.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
      reply.header.mutable_error()->set_message("server has not joined the job yet");
      (void)t->Send(m.header.sender_address(), std::move(reply));
      return;
    }
    for (Outgoing& o : c->Step(std::move(m))) (void)t->Send(o.to, std::move(o.message));
  });
  if (!started.ok()) {
    TLOG_ERROR("cannot listen on {}: {}", flags.bind, started.ToString());
    return 1;
  }
  TLOG_INFO("listening on {}; joining the job at {}", t->address(), flags.coordinator);
  auto ready = session.Join();
  if (!ready.ok()) {
    TLOG_ERROR("{}", ready.status().message());
    t->Stop();
    return 1;
  }
  {
    auto c = std::make_unique<ServerCore>(session.self().node_id(), &pool);
    if (auto s = c->InstallShardMap(ready->shard_map(), session.self().rank()); !s.ok()) {
      TLOG_ERROR("bad shard map from the coordinator: {}", s.ToString());
      t->Stop();
      return 1;
    }
    std::lock_guard lock(core_mu);
    core = std::move(c);
  }
  TLOG_INFO("server {} (node {}) serving; shard map epoch {}, {} virtual shards over {} servers",
            session.self().rank(), session.self().node_id(), ready->shard_map().epoch(),
            ready->shard_map().num_vshards(), ready->shard_map().servers_size());
  absl::Status end = session.WaitForEnd();
  t->Stop();
  const ServerStats& st = core->stats();
  TLOG_INFO("served {} pushes and {} pulls ({} bytes in, {} bytes out, {} bad requests)", st.push_requests,
            st.pull_requests, st.bytes_in, st.bytes_out, st.bad_requests);
  if (!end.ok()) {
    TLOG_ERROR("{}", end.message());
    return 1;
  }
  TLOG_INFO("job ended in order; exiting");
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::ServerFlags flags;
  CLI::App app{"tessera-server: holds virtual shards of the job's tables and answers pushes and pulls.\n"
               "Started by tessera-launch; it joins the job through the coordinator."};
  app.add_option("--coordinator", flags.coordinator, "Coordinator address, e.g. tcp://127.0.0.1:5000")->required();
  app.add_option("--rank", flags.rank, "Server rank to take (0-based); -1 lets the coordinator choose");
  app.add_option("--bind", flags.bind, "Endpoint to listen on (tcp://HOST:PORT, port 0 = any; or ipc://PATH)");
  app.add_option("--name", flags.name, "Name in log lines (default server-RANK)");
  app.add_option("--connect-timeout", flags.connect_timeout, "Seconds to wait for the job to assemble");
  app.add_option("--heartbeat-interval", flags.heartbeat_interval, "Seconds between heartbeats");
  app.add_option("--lease", flags.lease, "Seconds of coordinator silence after which the server gives up");
  app.add_flag("--debug", flags.debug, "Log debug lines");
  CLI11_PARSE(app, argc, argv);
  if (flags.name.empty()) flags.name = flags.rank >= 0 ? "server-" + std::to_string(flags.rank) : "server";
  tessera::InitLogging(flags.name, flags.debug);
  std::signal(SIGPIPE, SIG_IGN);
  return tessera::Run(flags);
}

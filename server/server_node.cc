#include "server/server_node.h"

#include "common/logging.h"

namespace tessera {

ServerNode::ServerNode(CoordinatorSession::Options session, std::unique_ptr<Transport> transport)
    : transport_(std::move(transport)), session_([&] {
        session.role = proto::SERVER;
        return session;
      }(), transport_.get()) {}

ServerNode::~ServerNode() { transport_->Stop(); }

void ServerNode::OnMessage(Message m) {
  if (session_.Handle(m)) return;
  ServerCore* core;
  {
    std::lock_guard lock(mu_);
    core = core_.get();
  }
  if (core == nullptr) {
    // Not serving yet: answer, so the client is not left waiting for nothing.
    if (m.header.request_id() == 0) return;
    Message reply;
    reply.header.set_request_id(m.header.request_id());
    reply.header.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
    reply.header.mutable_error()->set_message("server has not joined the job yet");
    (void)transport_->Send(m.header.sender_address(), std::move(reply));
    return;
  }
  for (Outgoing& o : core->Step(std::move(m))) (void)transport_->Send(o.to, std::move(o.message));
}

absl::Status ServerNode::Run() {
  if (auto s = transport_->Start([this](Message m) { OnMessage(std::move(m)); }); !s.ok()) return s;
  TLOG_INFO("listening on {}; joining the job", transport_->address());
  auto ready = session_.Join();
  if (!ready.ok()) {
    transport_->Stop();
    return ready.status();
  }
  auto core = std::make_unique<ServerCore>(session_.self().node_id(), &pool_);
  if (auto s = core->InstallShardMap(ready->shard_map(), session_.self().rank()); !s.ok()) {
    transport_->Stop();
    return absl::Status(s.code(), "bad shard map from the coordinator: " + std::string(s.message()));
  }
  {
    std::lock_guard lock(mu_);
    core_ = std::move(core);
  }
  TLOG_INFO("server {} (node {}) serving; shard map epoch {}, {} virtual shards over {} servers",
            session_.self().rank(), session_.self().node_id(), ready->shard_map().epoch(),
            ready->shard_map().num_vshards(), ready->shard_map().servers_size());
  absl::Status end = session_.WaitForEnd();
  transport_->Stop();
  ServerStats st = stats();
  TLOG_INFO("served {} pushes and {} pulls ({} bytes in, {} bytes out, {} bad requests)", st.push_requests,
            st.pull_requests, st.bytes_in, st.bytes_out, st.bad_requests);
  return end;
}

ServerStats ServerNode::stats() const {
  std::lock_guard lock(mu_);
  return core_ ? core_->stats() : ServerStats{};
}

}  // namespace tessera

#include "server/server_core.h"

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status ServerCore::InstallShardMap(const proto::ShardMap& map, uint32_t my_rank) {
  auto view = ShardMapView::Create(map);
  if (!view.ok()) return view.status();
  if (my_rank >= view->num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", my_rank, " is not in a shard map of ",
                                                   view->num_servers(), " servers"));
  }
  if (!tables_.empty() && map_ && map_->epoch() != view->epoch()) {
    return absl::UnimplementedError("moving shards between servers is not supported yet");
  }
  map_ = std::move(*view);
  my_rank_ = my_rank;
  return absl::OkStatus();
}

const Table* ServerCore::table(uint32_t id) const {
  auto it = tables_.find(id);
  return it == tables_.end() ? nullptr : it->second.get();
}

Message ServerCore::Reply(const Message& request) const {
  Message reply;
  reply.header.set_request_id(request.header.request_id());
  reply.header.set_sender_id(node_id_);
  if (map_) reply.header.set_epoch(map_->epoch());
  return reply;
}

std::vector<Outgoing> ServerCore::Step(Message request) {
  const proto::Envelope& h = request.header;
  absl::Status status;
  Message reply = Reply(request);
  if (!map_ && h.body_case() != proto::Envelope::BODY_NOT_SET) {
    status = absl::UnavailableError("server has no shard map yet");
  } else {
    switch (h.body_case()) {
      case proto::Envelope::kCreateTable:
        status = HandleCreateTable(h.create_table());
        if (status.ok()) reply.header.mutable_ack();
        break;
      case proto::Envelope::kPush:
        stats_.push_requests++;
        status = HandlePush(h.push(), request);
        if (status.ok()) reply.header.mutable_ack();
        break;
      case proto::Envelope::kPull: {
        stats_.pull_requests++;
        auto values = HandlePull(h.pull(), request);
        status = values.status();
        if (status.ok()) {
          auto* pr = reply.header.mutable_pull_reply();
          pr->set_num_keys(h.pull().num_keys());
          pr->set_width(values->size() / sizeof(float) / std::max<uint64_t>(1, h.pull().num_keys()));
          stats_.bytes_out += values->size();
          reply.frames.push_back(std::move(*values));
        }
        break;
      }
      case proto::Envelope::kStatsRequest: {
        auto* s = reply.header.mutable_stats_reply();
        s->set_push_requests(stats_.push_requests);
        s->set_pull_requests(stats_.pull_requests);
        s->set_bytes_in(stats_.bytes_in);
        s->set_bytes_out(stats_.bytes_out);
        uint64_t rows = 0;
        for (const auto& [id, t] : tables_) rows += t->num_rows();
        s->set_rows(rows);
        break;
      }
      default:
        status = absl::InvalidArgumentError(absl::StrCat("server does not handle message type ", h.body_case()));
    }
  }
  if (!status.ok()) {
    stats_.bad_requests++;
    reply.frames.clear();
    auto* e = reply.header.mutable_error();
    e->set_code(static_cast<int>(status.code()));
    e->set_message(std::string(status.message()));
  }
  std::vector<Outgoing> out;
  if (h.request_id() != 0 && !h.sender_address().empty()) {
    out.push_back(Outgoing{h.sender_address(), std::move(reply)});
  }
  return out;
}

absl::Status ServerCore::HandleCreateTable(const proto::CreateTable& req) {
  const proto::TableConfig& c = req.config();
  if (auto s = ValidateTableConfig(c); !s.ok()) return s;
  if (auto it = tables_.find(c.table_id()); it != tables_.end()) {
    if (google::protobuf::util::MessageDifferencer::Equals(it->second->config(), c)) return absl::OkStatus();
    return absl::AlreadyExistsError(absl::StrCat("table ", c.table_id(), " exists with a different config (",
                                                 it->second->config().ShortDebugString(), ") than requested (",
                                                 c.ShortDebugString(), ")"));
  }
  const ShardMapView& map = *map_;
  const uint32_t rank = my_rank_;
  const uint32_t id = c.table_id();
  tables_.emplace(id, std::make_unique<Table>(c, [&](Key k) { return map.ServerRankOfKey(id, k) == rank; }));
  return absl::OkStatus();
}

absl::StatusOr<Table*> ServerCore::FindTable(uint32_t id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("no table ", id, " on this server"));
  return it->second.get();
}

absl::StatusOr<std::span<const Key>> ServerCore::KeysFrame(const Message& m, uint64_t num_keys, uint32_t table_id) {
  const Buffer& f = m.frames[0];
  if (num_keys > f.size() || f.size() != num_keys * sizeof(Key)) {
    return absl::InvalidArgumentError(absl::StrCat("keys frame has ", f.size(), " bytes, expected ",
                                                   num_keys * sizeof(Key), " for ", num_keys, " keys"));
  }
  auto keys = f.As<Key>();
  for (Key k : keys) {
    uint32_t owner = map_->ServerRankOfKey(table_id, k);
    if (owner != my_rank_) {
      return absl::FailedPreconditionError(absl::StrCat("key ", k, " of table ", table_id, " belongs to server ",
                                                        owner, ", not to server ", my_rank_, " (map epoch ",
                                                        map_->epoch(), ")"));
    }
  }
  return keys;
}

absl::Status ServerCore::HandlePush(const proto::Push& req, const Message& m) {
  if (m.frames.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("push needs 2 frames (keys, values), got ", m.frames.size()));
  }
  stats_.bytes_in += m.FrameBytes();
  auto table = FindTable(req.table_id());
  if (!table.ok()) return table.status();
  auto keys = KeysFrame(m, req.num_keys(), req.table_id());
  if (!keys.ok()) return keys.status();
  const Buffer& values = m.frames[1];
  const uint64_t expected = req.num_keys() * (*table)->width() * sizeof(float);
  if (values.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("values frame has ", values.size(), " bytes, expected ", expected,
                                                   " for ", req.num_keys(), " keys of width ", (*table)->width()));
  }
  return (*table)->ApplyPush(*keys, values.As<float>());
}

absl::StatusOr<Buffer> ServerCore::HandlePull(const proto::Pull& req, const Message& m) {
  if (m.frames.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("pull needs 1 frame (keys), got ", m.frames.size()));
  }
  stats_.bytes_in += m.FrameBytes();
  auto table = FindTable(req.table_id());
  if (!table.ok()) return table.status();
  auto keys = KeysFrame(m, req.num_keys(), req.table_id());
  if (!keys.ok()) return keys.status();
  const size_t bytes = keys->size() * (*table)->width() * sizeof(float);
  Buffer out = pool_ ? pool_->Get(bytes) : Buffer::Allocate(bytes);
  if (auto s = (*table)->ReadRows(*keys, out.AsMutable<float>()); !s.ok()) return s;
  return out;
}

}  // namespace tessera

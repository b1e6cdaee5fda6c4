#pragma once
// PushAcks: the Acks of pushes that wait for their backups. A primary sends
// a push's Ack only once every backup it forwarded the push to has it
// (../shared/DESIGN.md section 6). A part of ServerCore (docs/design.md,
// "Server parts"); BackupStreams says when a forward is done, this part
// says when its push is.
//
// Contract:
// - Wait(push_id, to, reply, forwards, shards) keeps the push's reply until
//   `forwards` (> 0) forwards of it are done. `to` is where the reply goes
//   (empty: nowhere, the push wanted none); `shards` are the shards of this
//   server the push touched.
// - Done(push_id, status): one forward of the push is done; a rejection
//   (status not OK) is remembered, the first one only. When it was the last
//   forward, the push leaves and is returned, with the first rejection in
//   .status (the caller turns the reply into that Error); otherwise, and
//   for a push not waiting (already answered, or never here), nullopt.
// - TakeAll() removes and returns every waiting push; TakeTouching(moved)
//   those that touched a shard `moved` accepts, each with the first such
//   shard; both in push id order (never the map's, which depends on
//   addresses). The caller answers them (Aborted: their forwards may never
//   arrive).
// Pure: no I/O, threads or clocks. Thread safety: none; the caller serializes.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/message.h"

namespace tessera {

class PushAcks {
 public:
  struct Waiting {
    std::string to;
    Message reply;
    uint32_t outstanding = 0;           // forwards not yet done
    absl::Status status;                // the first rejection, if any
    std::vector<uint32_t> shards = {};  // the shards of this server the push touched
  };

  void Wait(uint64_t push_id, std::string to, Message reply, uint32_t forwards, std::vector<uint32_t> shards);
  std::optional<Waiting> Done(uint64_t push_id, const absl::Status& status);
  std::vector<Waiting> TakeAll();
  std::vector<std::pair<Waiting, uint32_t>> TakeTouching(const std::function<bool(uint32_t)>& moved);
  size_t size() const { return waiting_.size(); }

 private:
  std::vector<uint64_t> IdsInOrder() const;  // the waiting pushes' ids, ascending
  absl::flat_hash_map<uint64_t, Waiting> waiting_;  // push id -> its Ack
};

}  // namespace tessera

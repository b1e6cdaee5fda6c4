// Fuzz target: a batch of coalesced messages (transport/
// coalescing_transport.h) as a peer could send it, any header and payload.
// UnpackBatch must refuse a layout that does not add up and never read past
// the payload; what it accepts must pack again into the same batch (sizes
// and bytes), each message's frames inside the payload. Replayed over
// tests/fuzz/corpus/batch.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "transport/coalescing_transport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::Message batch;
  if (!tessera::fuzz::ReadMessage(data, size, &batch)) return 0;
  auto messages = tessera::CoalescingTransport::UnpackBatch(batch);
  if (!messages.ok()) return 0;
  const tessera::Buffer& payload = batch.frames.at(0);
  const std::byte* begin = payload.data();
  const std::byte* end = begin + payload.size();
  for (const tessera::Message& m : *messages) {
    if (m.header.has_batch()) __builtin_trap();
    for (const tessera::Buffer& f : m.frames) {
      if (f.size() > 0 && (f.data() < begin || f.data() + f.size() > end)) __builtin_trap();
    }
  }
  // Packed again, the same sizes and the same frame bytes (headers may
  // serialize differently: unknown fields, field order).
  std::vector<tessera::Message> again = *messages;
  tessera::Message repacked = tessera::CoalescingTransport::PackBatch(again);
  const auto& a = batch.header.batch();
  const auto& b = repacked.header.batch();
  if (a.frame_counts_size() != b.frame_counts_size() || a.frame_bytes_size() != b.frame_bytes_size()) {
    __builtin_trap();
  }
  for (int i = 0; i < a.frame_bytes_size(); ++i) {
    if (a.frame_bytes(i) != b.frame_bytes(i)) __builtin_trap();
  }
  auto back = tessera::CoalescingTransport::UnpackBatch(repacked);
  if (!back.ok() || back->size() != messages->size()) __builtin_trap();
  for (size_t i = 0; i < back->size(); ++i) {
    const auto& x = (*messages)[i];
    const auto& y = (*back)[i];
    if (x.frames.size() != y.frames.size()) __builtin_trap();
    for (size_t k = 0; k < x.frames.size(); ++k) {
      if (x.frames[k].size() != y.frames[k].size() ||
          (x.frames[k].size() > 0 && std::memcmp(x.frames[k].data(), y.frames[k].data(), x.frames[k].size()) != 0)) {
        __builtin_trap();
      }
    }
  }
  return 0;
}

void WriteSeeds(const std::string& dir) {
  auto write = [&](const std::string& name, std::vector<tessera::Message> messages) {
    tessera::Message batch = tessera::CoalescingTransport::PackBatch(messages);
    std::ofstream(dir + "/" + name, std::ios::binary) << tessera::fuzz::WriteMessage(batch);
  };
  std::vector<tessera::Message> pushes(3);
  for (size_t i = 0; i < pushes.size(); ++i) {
    pushes[i].header.set_request_id(i + 1);
    pushes[i].header.mutable_push()->set_table_id(1);
    pushes[i].header.mutable_push()->set_num_keys(1);
    uint64_t key = 40 + i;
    float row[3] = {1.0f, 2.0f, static_cast<float>(i)};
    pushes[i].frames.push_back(tessera::Buffer::CopyOf(&key, sizeof key));
    pushes[i].frames.push_back(tessera::Buffer::CopyOf(row, sizeof row));
  }
  write("pushes", pushes);
  std::vector<tessera::Message> acks(2);
  acks[0].header.set_request_id(7);
  acks[0].header.mutable_ack();
  acks[1].header.set_request_id(8);
  acks[1].frames.push_back(tessera::Buffer());
  write("acks_and_an_empty_frame", acks);
}

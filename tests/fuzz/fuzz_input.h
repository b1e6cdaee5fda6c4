#pragma once
// The byte layout the fuzz targets read a message from, and the driver
// that replays a corpus when the targets are built without libFuzzer.
//
// A message: u16 header length H (little endian), H bytes of a serialized
// proto::Envelope, then frames, each a u32 length L and L bytes; a length
// past the end takes what is left. At most 8 frames.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/message.h"

namespace tessera::fuzz {

inline bool ReadMessage(const uint8_t* data, size_t size, Message* m) {
  if (size < 2) return false;
  size_t header = data[0] | (size_t{data[1]} << 8);
  data += 2;
  size -= 2;
  header = std::min(header, size);
  if (!m->header.ParseFromArray(data, static_cast<int>(header))) return false;
  data += header;
  size -= header;
  while (size >= 4 && m->frames.size() < 8) {
    uint32_t len;
    std::memcpy(&len, data, 4);
    data += 4;
    size -= 4;
    const size_t n = std::min<size_t>(len, size);
    m->frames.push_back(Buffer::CopyOf(data, n));
    data += n;
    size -= n;
  }
  return true;
}

// The inverse, for seed corpora.
inline std::string WriteMessage(const Message& m) {
  std::string header = m.header.SerializeAsString();
  std::string out;
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  for (const Buffer& f : m.frames) {
    const uint32_t len = static_cast<uint32_t>(f.size());
    out.append(reinterpret_cast<const char*>(&len), 4);
    out.append(reinterpret_cast<const char*>(f.data()), f.size());
  }
  return out;
}

}  // namespace tessera::fuzz

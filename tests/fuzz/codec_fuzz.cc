// Fuzz target: an encoded part of any codec, as a server receives it in a
// compressed push. ValidateWire, Decode and DecodeAdd must refuse a bad part
// with an error, never read past it or write past the destination, and a
// part that validates must decode. Replayed over tests/fuzz/corpus/codec.
#include <cstdint>
#include <fstream>
#include <span>
#include <vector>

#include "compress/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::compress;
  const std::span<const std::byte> wire(reinterpret_cast<const std::byte*>(data), size);
  auto info = InspectWire(wire);
  auto valid = ValidateWire(wire);
  if (valid.ok() && !info.ok()) __builtin_trap();  // ValidateWire is InspectWire and more
  if (!info.ok() || info->num_elements > (1u << 20)) return 0;
  std::vector<float> out(info->num_elements, 7.0f);
  const absl::Status decoded = Decode(wire, out);
  if (valid.ok() && !decoded.ok()) __builtin_trap();  // the promise of ValidateWire
  std::vector<float> acc(info->num_elements, 1.0f);
  const absl::Status added = DecodeAdd(wire, acc, 0.5f);
  if (decoded.ok() != added.ok()) __builtin_trap();
  return 0;
}

void WriteSeeds(const std::string& dir) {
  using namespace tessera::compress;
  std::vector<float> input(40);
  for (size_t i = 0; i < input.size(); ++i) input[i] = 0.125f * static_cast<float>(i) - 2.0f;
  for (const char* spec : {"fp16", "bf16", "int8", "terngrad", "onebit", "topk:ratio=0.25", "randomk:ratio=0.25",
                           "qsgd:levels=8"}) {
    auto parsed = ParseCodecSpec(spec);
    if (!parsed.ok()) continue;
    auto codec = Codec::Create(*parsed);
    if (!codec.ok()) continue;
    std::vector<std::byte> out(codec->EncodedSize(input.size()));
    auto n = codec->Encode(input, EncodeContext{.tensor_id = 3, .element_offset = 0}, out);
    if (!n.ok()) continue;
    std::string name(spec);
    for (char& c : name)
      if (c == ':' || c == '=' || c == '.') c = '_';
    std::ofstream(dir + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(out.data()), *n);
  }
}

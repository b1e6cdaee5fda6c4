// CRC32C (Castagnoli) for checkpoint files: slice-by-8 in software, the
// SSE4.2 instruction where the CPU has it (server/checkpoint.h).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "server/checkpoint.h"

namespace tessera {

namespace {

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // reflected Castagnoli

// kCrcTables[k][b]: the CRC register after byte b followed by k zero bytes.
constexpr std::array<std::array<uint32_t, 256>, 8> MakeCrcTables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (kCrc32cPoly & (0u - (c & 1u)));
    t[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  return t;
}
constexpr auto kCrcTables = MakeCrcTables();

}  // namespace

namespace checkpoint_internal {

// Slice-by-8: eight table lookups per eight bytes.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; size >= 8; p += 8, size -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= c;
    c = kCrcTables[7][v & 0xff] ^ kCrcTables[6][(v >> 8) & 0xff] ^ kCrcTables[5][(v >> 16) & 0xff] ^
        kCrcTables[4][(v >> 24) & 0xff] ^ kCrcTables[3][(v >> 32) & 0xff] ^ kCrcTables[2][(v >> 40) & 0xff] ^
        kCrcTables[1][(v >> 48) & 0xff] ^ kCrcTables[0][v >> 56];
  }
  for (; size > 0; ++p, --size) c = kCrcTables[0][(c ^ *p) & 0xff] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__)
bool Crc32cHardwareAvailable() { return __builtin_cpu_supports("sse4.2"); }

__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  for (; size >= 8; p += 8, size -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; size > 0; ++p, --size) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}
#else
bool Crc32cHardwareAvailable() { return false; }
uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t size) { return Crc32cPortable(crc, data, size); }
#endif

}  // namespace checkpoint_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  static const bool hardware = checkpoint_internal::Crc32cHardwareAvailable();
  return hardware ? checkpoint_internal::Crc32cHardware(crc, data, size)
                  : checkpoint_internal::Crc32cPortable(crc, data, size);
}

}  // namespace tessera

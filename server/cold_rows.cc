#include "server/cold_rows.h"

#include <cstring>

#include "common/check.h"

namespace tessera {

size_t ColdRows::Take(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) {
  Get(keys, out, found);
  size_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!found[i]) continue;
    if (!Contains(keys[i])) {  // listed before: already taken
      found[i] = 0;
      continue;
    }
    Erase(keys[i]);
    ++n;
  }
  return n;
}

void MemoryColdRows::Put(Key key, std::span<const float> row) {
  TESSERA_CHECK(row.size() == row_floats_);
  rows_[key].assign(row.begin(), row.end());
  ++stats_.rows_written;
}

size_t MemoryColdRows::Get(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) {
  TESSERA_CHECK(out.size() == keys.size() * row_floats_ && found.size() == keys.size());
  size_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = rows_.find(keys[i]);
    found[i] = it != rows_.end();
    if (!found[i]) {
      ++stats_.lookups_absent;
      continue;
    }
    std::memcpy(out.data() + i * row_floats_, it->second.data(), size_t{row_floats_} * sizeof(float));
    ++stats_.rows_read;
    ++n;
  }
  return n;
}

void MemoryColdRows::Erase(Key key) {
  rows_.erase(key);
  ++stats_.rows_erased;
}

void MemoryColdRows::ForEach(absl::FunctionRef<void(Key, std::span<const float>)> fn) {
  for (const auto& [key, row] : rows_) fn(key, row);
}

void MemoryColdRows::ForEachKey(absl::FunctionRef<void(Key)> fn) {
  for (const auto& [key, row] : rows_) fn(key);
}

}  // namespace tessera

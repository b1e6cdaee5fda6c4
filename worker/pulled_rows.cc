#include "worker/pulled_rows.h"

#include <cstring>

namespace tessera {

void PulledRows::CopyTo(std::span<float> out) const {
  TESSERA_CHECK(out.size() == rows_.size() * width_);
  for (size_t i = 0; i < rows_.size(); ++i) std::memcpy(out.data() + i * width_, rows_[i], width_ * sizeof(float));
}

void PulledRows::Clear() {
  held_.clear();
  rows_.clear();
  width_ = 0;
}

uint64_t PulledRows::held_bytes() const {
  uint64_t n = 0;
  for (const Buffer& b : held_) n += b.size();
  return n;
}

void PulledRows::Reset(size_t rows, uint32_t width) {
  held_.clear();
  rows_.assign(rows, nullptr);
  width_ = width;
}

}  // namespace tessera

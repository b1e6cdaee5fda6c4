#include "common/sparse_batch.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::StatusOr<SparseBatch> SparseBatch::Build(std::span<const Key> keys) {
  SparseBatch batch;
  if (absl::Status s = batch.Reset(keys); !s.ok()) return s;
  return batch;
}

absl::Status SparseBatch::Reset(std::span<const Key> keys) {
  unique_.clear();
  inverse_.clear();
  index_.clear();
  if (keys.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("SparseBatch: ", keys.size(),
                                                   " keys; at most 2^32 - 1 positions are supported"));
  }
  index_.reserve(keys.size());
  inverse_.resize(keys.size());
  uint32_t* inverse = inverse_.data();
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto [it, inserted] = index_.try_emplace(keys[i], static_cast<uint32_t>(unique_.size()));
    if (inserted) unique_.push_back(keys[i]);
    inverse[i] = it->second;
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckRows(const char* what, const char* name, size_t got, size_t rows, uint32_t width) {
  if (width == 0) return absl::InvalidArgumentError(absl::StrCat("SparseBatch::", what, ": width is 0"));
  if (got != rows * width) {
    return absl::InvalidArgumentError(absl::StrCat("SparseBatch::", what, ": ", name, " needs ", rows, " rows of ",
                                                   width, " floats (", rows * width, "), got ", got));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SparseBatch::Gather(std::span<const float> unique_rows, uint32_t width, std::span<float> out) const {
  if (absl::Status s = CheckRows("Gather", "unique_rows", unique_rows.size(), unique_.size(), width); !s.ok()) return s;
  if (absl::Status s = CheckRows("Gather", "out", out.size(), inverse_.size(), width); !s.ok()) return s;
  const float* src = unique_rows.data();
  float* dst = out.data();
  const size_t w = width;
  if (w == 1) {
    for (size_t i = 0; i < inverse_.size(); ++i) dst[i] = src[inverse_[i]];
    return absl::OkStatus();
  }
  for (size_t i = 0; i < inverse_.size(); ++i) {
    std::memcpy(dst + i * w, src + size_t{inverse_[i]} * w, w * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status SparseBatch::ScatterAdd(std::span<const float> grads_per_position, uint32_t width,
                                     std::span<float> unique_grads) const {
  if (absl::Status s = CheckRows("ScatterAdd", "grads_per_position", grads_per_position.size(), inverse_.size(), width);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRows("ScatterAdd", "unique_grads", unique_grads.size(), unique_.size(), width); !s.ok()) {
    return s;
  }
  std::fill(unique_grads.begin(), unique_grads.end(), 0.0f);
  const float* src = grads_per_position.data();
  float* dst = unique_grads.data();
  const size_t w = width;
  for (size_t i = 0; i < inverse_.size(); ++i) {
    float* row = dst + size_t{inverse_[i]} * w;
    const float* g = src + i * w;
    for (size_t j = 0; j < w; ++j) row[j] += g[j];
  }
  return absl::OkStatus();
}

}  // namespace tessera

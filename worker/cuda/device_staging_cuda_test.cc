// DeviceStaging with the CUDA copier: pushes from and pulls into real device
// memory (cudaMalloc) against an in-process cluster, and the copier alone.
// Skips, saying why, where no CUDA device is usable.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/cluster/inproc_cluster.h"
#include "worker/cuda/cuda_copier.h"
#include "worker/device_staging.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// Device memory for n floats, freed at scope exit.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(1, n) * sizeof(float)), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() { return static_cast<float*>(p_); }
  void Put(const std::vector<float>& v) {
    ASSERT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> Get() const {
    std::vector<float> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};

std::vector<float> MakeRows(size_t n, size_t width, int salt) {
  std::vector<float> v(n * width);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int>(i % 977) - 400 + salt);
  return v;
}

TEST(CudaCopierAvailabilityTest, SaysWhyWhenThereIsNoDevice) {
  absl::StatusOr<std::unique_ptr<Copier>> copier = MakeCudaCopier();
  if (copier.ok()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(copier.status().code(), absl::StatusCode::kUnavailable) << copier.status();
  EXPECT_THAT(std::string(copier.status().message()), HasSubstr("CUDA"));
}

class CudaStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Copier>> copier = MakeCudaCopier();
    if (!copier.ok()) GTEST_SKIP() << "CUDA copier unavailable: " << copier.status().message();
    copier_ = std::move(*copier);
  }
  std::unique_ptr<Copier> copier_;
};

TEST_F(CudaStagingTest, CopierMovesDataBothWaysThroughPinnedBuffers) {
  ASSERT_TRUE(copier_->Allocate(2, 4096).ok());
  ASSERT_EQ(copier_->buffer(1).size(), 1024u);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, copier_->buffer(0).data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost) << "staging buffers are page-locked host memory";

  const std::vector<float> v = MakeRows(1000, 1, 0);
  DeviceFloats src(1000), dst(1000);
  src.Put(v);
  ASSERT_TRUE(copier_->StartToHost(1, src.get(), 1000).ok());
  absl::StatusOr<Nanos> took = copier_->Wait(1);
  ASSERT_TRUE(took.ok()) << took.status();
  EXPECT_GE(*took, 0);
  EXPECT_TRUE(copier_->Done(1));
  EXPECT_TRUE(std::equal(v.begin(), v.end(), copier_->buffer(1).begin()));
  ASSERT_TRUE(copier_->StartToDevice(1, dst.get(), 1000).ok());
  EXPECT_FALSE(copier_->StartToDevice(1, dst.get(), 1000).ok()) << "one copy at a time per buffer";
  ASSERT_TRUE(copier_->Wait(1).ok());
  EXPECT_EQ(dst.Get(), v);
  EXPECT_FALSE(copier_->StartToHost(0, src.get(), 1025).ok()) << "larger than the buffer";
}

TEST_F(CudaStagingTest, PushesFromAndPullsIntoDeviceMemoryAgainstACluster) {
  InProcCluster cluster({.servers = 2, .workers = 1, .started_servers = 2});
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), 1u);
  Worker& w = *workers[0];
  constexpr size_t kWidth = 5, kRows = 5000;  // 4 KiB buffers: 204 rows a part, 25 parts
  ASSERT_TRUE(w.CreateTable({.id = 1, .width = kWidth, .optimizer = proto::ACCUMULATE}).ok());
  auto staging = DeviceStaging::Create(w, std::move(copier_), {.staging_bytes = 4096, .buffers = 3});
  ASSERT_TRUE(staging.ok()) << staging.status();

  std::vector<Key> keys(kRows);
  for (size_t i = 0; i < kRows; ++i) keys[i] = 77 + 13 * i;
  const std::vector<float> a = MakeRows(kRows, kWidth, 1), b = MakeRows(kRows, kWidth, 2);
  DeviceFloats da(a.size()), db(b.size()), out(a.size());
  da.Put(a);
  db.Put(b);
  out.Put(std::vector<float>(a.size(), -1.0f));
  absl::Status s = (*staging)->PushFromDevice(1, keys, da.get(), kWidth);
  ASSERT_TRUE(s.ok()) << s;
  s = (*staging)->PushFromDevice(1, keys, db.get(), kWidth);
  ASSERT_TRUE(s.ok()) << s;
  s = (*staging)->PullToDevice(1, keys, out.get(), kWidth);
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<float> pulled = out.Get();
  for (size_t i = 0; i < pulled.size(); ++i) ASSERT_EQ(pulled[i], a[i] + b[i]) << i;

  const DeviceStaging::Stats st = (*staging)->stats();
  EXPECT_EQ(st.parts_pushed, 2u * 25);
  EXPECT_EQ(st.parts_pulled, 25u);
  EXPECT_EQ(st.bytes_to_host, 2 * a.size() * sizeof(float));
  EXPECT_EQ(st.bytes_to_device, a.size() * sizeof(float));
  EXPECT_GT(st.copy_time, 0);

  ASSERT_TRUE(w.Finish({}).ok());
}

}  // namespace
}  // namespace tessera

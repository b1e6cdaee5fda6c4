// GPU results against the CPU codecs: the same wire bytes (onebit: the same
// signs, the scale within fp32 rounding) and the same accumulators bit for
// bit. Skips, saying why, where no CUDA device is usable.
#include "compress/cuda/cuda_codec.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "compress/compress_test_util.h"
#include "gtest/gtest.h"

namespace tessera::compress::cuda {
namespace {

using testing::Gaussian;
using testing::MakeCodec;
using testing::Spec;

const CodecId kAll[] = {CodecId::kNone,     CodecId::kFp16,   CodecId::kBf16, CodecId::kQsgd,
                        CodecId::kTernGrad, CodecId::kOneBit, CodecId::kTopK, CodecId::kRandomK};

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) { EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess); }
  ~DeviceArray() { cudaFree(p_); }
  T* get() { return static_cast<T*>(p_); }
  void Put(const std::vector<T>& v) {
    ASSERT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> Get() {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};

class CudaCodecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status s = CudaDeviceStatus();
    if (!s.ok()) GTEST_SKIP() << "GPU comparison skipped: " << s.message();
  }
};

void ExpectSameWire(CodecId id, const std::vector<std::byte>& cpu, const std::vector<std::byte>& gpu,
                    const std::string& where) {
  ASSERT_EQ(cpu.size(), gpu.size()) << where;
  if (id != CodecId::kOneBit) {
    for (size_t i = 0; i < cpu.size(); ++i) ASSERT_EQ(cpu[i], gpu[i]) << where << " byte " << i;
    return;
  }
  // Header and sign bits identical; scale within fp32 rounding.
  ASSERT_EQ(0, std::memcmp(cpu.data(), gpu.data(), kWireHeaderBytes)) << where;
  ASSERT_EQ(0, std::memcmp(cpu.data() + kWireHeaderBytes + 4, gpu.data() + kWireHeaderBytes + 4,
                           cpu.size() - kWireHeaderBytes - 4))
      << where;
  float a, b;
  std::memcpy(&a, cpu.data() + kWireHeaderBytes, 4);
  std::memcpy(&b, gpu.data() + kWireHeaderBytes, 4);
  EXPECT_LE(std::abs(a - b), 2 * std::numeric_limits<float>::epsilon() * std::abs(a)) << where;
}

TEST_F(CudaCodecTest, EncodeMatchesTheCpuBytes) {
  // Sizes: tiny, odd, and large enough for the sampled top-k path.
  for (size_t n : {1ul, 17ul, 1000ul, 65537ul, 1ul << 20}) {
    std::vector<float> x = Gaussian(n, n);
    for (size_t i = 0; i < n; i += 101) x[i] = 0.0f;
    if (n > 10) x[7] = 50.0f;
    DeviceArray<float> dx(n);
    dx.Put(x);
    for (CodecId id : kAll) {
      for (double ratio : {0.001, 0.1}) {
        Codec c = MakeCodec(Spec(id, ratio, id == CodecId::kQsgd ? 15 : 127, 5));
        for (uint64_t offset : {0ull, 3ull}) {
          const EncodeContext ctx{.tensor_id = 77, .element_offset = offset};
          std::vector<std::byte> cpu(c.EncodedSize(n));
          ASSERT_TRUE(c.Encode(x, ctx, cpu).ok());
          DeviceArray<std::byte> dout(cpu.size());
          absl::StatusOr<size_t> r = EncodeOnDevice(c, dx.get(), n, ctx, dout.get());
          ASSERT_TRUE(r.ok()) << r.status();
          ASSERT_EQ(*r, cpu.size());
          ExpectSameWire(id, cpu, dout.Get(),
                         std::string(CodecName(id)) + " n=" + std::to_string(n) + " ratio=" +
                             std::to_string(ratio) + " offset=" + std::to_string(offset));
        }
      }
    }
  }
}

TEST_F(CudaCodecTest, TopKTiesMatchTheCpu) {
  const size_t n = 300000;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 2654435761u) % 7) * ((i % 2) ? 1.0f : -1.0f);
  DeviceArray<float> dx(n);
  dx.Put(x);
  Codec c = MakeCodec(Spec(CodecId::kTopK, 0.01));
  std::vector<std::byte> cpu = testing::EncodeVec(c, x);
  DeviceArray<std::byte> dout(cpu.size());
  ASSERT_TRUE(EncodeOnDevice(c, dx.get(), n, {}, dout.get()).ok());
  ExpectSameWire(CodecId::kTopK, cpu, dout.Get(), "ties");
}

TEST_F(CudaCodecTest, DecodeAddMatchesTheCpuBitForBit) {
  const size_t n = 100003;
  std::vector<float> x = Gaussian(n, 1);
  std::vector<float> acc0 = Gaussian(n, 2);
  for (CodecId id : kAll) {
    Codec c = MakeCodec(Spec(id, 0.01, 31));
    std::vector<std::byte> wire = testing::EncodeVec(c, x, 9, 100);
    for (float alpha : {1.0f, -0.5f}) {
      std::vector<float> cpu = acc0;
      ASSERT_TRUE(DecodeAdd(wire, cpu, alpha).ok());
      DeviceArray<float> dacc(n);
      dacc.Put(acc0);
      ASSERT_TRUE(DecodeAddOnDevice(wire, dacc.get(), n, alpha).ok()) << CodecName(id);
      std::vector<float> gpu = dacc.Get();
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(testing::Bits(cpu[i]), testing::Bits(gpu[i])) << CodecName(id) << " at " << i;
      }
    }
  }
}

TEST_F(CudaCodecTest, RejectsWhatTheCpuRejects) {
  const size_t n = 70000;
  std::vector<float> x = Gaussian(n, 3);
  x[12345] = std::numeric_limits<float>::quiet_NaN();
  DeviceArray<float> dx(n);
  dx.Put(x);
  for (CodecId id : kAll) {
    Codec c = MakeCodec(Spec(id, 0.01));
    std::vector<std::byte> cpu(c.EncodedSize(n));
    const bool cpu_ok = c.Encode(x, {}, cpu).ok();
    DeviceArray<std::byte> dout(cpu.size());
    EXPECT_EQ(EncodeOnDevice(c, dx.get(), n, {}, dout.get()).ok(), cpu_ok) << CodecName(id);
  }
  // Corrupt wire bytes: error, accumulator untouched.
  Codec c = MakeCodec(Spec(CodecId::kTopK, 0.01));
  std::vector<float> y = Gaussian(n, 4);
  std::vector<std::byte> wire = testing::EncodeVec(c, y);
  wire[kWireHeaderBytes + 8] = std::byte{0xff};
  wire[kWireHeaderBytes + 9] = std::byte{0xff};
  wire[kWireHeaderBytes + 10] = std::byte{0xff};
  wire[kWireHeaderBytes + 11] = std::byte{0xff};
  DeviceArray<float> dacc(n);
  dacc.Put(std::vector<float>(n, 2.0f));
  EXPECT_FALSE(DecodeAddOnDevice(wire, dacc.get(), n).ok());
  for (float v : dacc.Get()) ASSERT_EQ(v, 2.0f);
}

TEST(CudaAvailabilityTest, ReportsWhyWhenThereIsNoDevice) {
  absl::Status s = CudaDeviceStatus();
  if (s.ok()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(s.message().empty());
  // Encoding on a device that is not there is an error, not a crash.
  Codec c = MakeCodec(Spec(CodecId::kFp16));
  EXPECT_FALSE(EncodeOnDevice(c, nullptr, 10, {}, nullptr).ok());
}

}  // namespace
}  // namespace tessera::compress::cuda

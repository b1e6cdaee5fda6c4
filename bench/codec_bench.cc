// Codec throughput on one core: every codec's encode, decode and decode-add
// on a 16M-float tensor (one part), reported as GB/s of fp32 input
// (SetBytesProcessed = 4 bytes per element), next to a plain memory-read pass
// over the same tensor (the sum of its floats) measured in the same run as
// the baseline. bench/run_codec_bench.sh runs it and prints the ratios.
//
// It measures; it never asserts.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "compress/codec.h"
#include "compress/cpu_kernels.h"
#include "compress/scalar_ops.h"
#include "compress/tensor_compressor.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tessera::compress {
namespace {

constexpr size_t kElements = 16u << 20;

// Deterministic gradient-like data: a smooth spread of magnitudes, both
// signs, a few zeros (counter hash to Laplace-ish values, no libm per element).
const std::vector<float>& Input() {
  static const std::vector<float> x = [] {
    std::vector<float> v(kElements);
    for (size_t i = 0; i < kElements; ++i) {
      const uint32_t h = scalar::CounterHash32(0xbe7c4, static_cast<uint32_t>(i));
      const float u = static_cast<float>(h >> 8) * 0x1p-24f;  // [0, 1)
      const float mag = 0.01f * u / (1.0f - u + 1e-3f);      // heavy-ish tail
      v[i] = (h & 1) ? -mag : mag;
    }
    return v;
  }();
  return x;
}

// The baseline: sum of all floats with enough independent accumulators to
// be limited by memory, not by add latency.
#if defined(__x86_64__)
[[gnu::target("avx2")]] float SumAvx2(const float* x, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += x[i];
  return s;
}
#endif

float SumPortable(const float* x, size_t n) {
  float lanes[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) lanes[j] += x[i + j];
  }
  float s = 0;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += x[i];
  return s;
}

void BM_ReadPass(benchmark::State& state) {
  const std::vector<float>& x = Input();
  const bool avx2 = kernels::Avx2() != nullptr;
  for (auto _ : state) {
#if defined(__x86_64__)
    float s = avx2 ? SumAvx2(x.data(), x.size()) : SumPortable(x.data(), x.size());
#else
    float s = SumPortable(x.data(), x.size());
#endif
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kElements * 4);
}

CodecSpec SpecFor(CodecId id, double ratio) {
  CodecSpec s;
  s.codec = id;
  s.ratio = ratio;
  s.seed = 1;
  return s;
}

void BM_Encode(benchmark::State& state, CodecId id, double ratio) {
  const std::vector<float>& x = Input();
  Codec codec = *Codec::Create(SpecFor(id, ratio));
  std::vector<std::byte> out(codec.EncodedSize(x.size()));
  std::memset(out.data(), 0, out.size());  // fault the pages in before timing
  uint64_t step = 0;
  for (auto _ : state) {
    absl::StatusOr<size_t> n = codec.Encode(x, {.tensor_id = step++}, out);
    if (!n.ok()) {
      state.SkipWithError(std::string(n.status().message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kElements * 4);
  state.counters["wire_MB"] = static_cast<double>(out.size()) / 1e6;
}

// The production path: TensorCompressor with the default part size (1M
// elements, so a part's second pass reads from cache), no error feedback.
void BM_EncodeParts(benchmark::State& state, CodecId id, double ratio) {
  const std::vector<float>& x = Input();
  CodecSpec spec = SpecFor(id, ratio);
  auto tc = *TensorCompressor::Create(spec, x.size());
  std::vector<std::byte> out(tc.EncodedSize());
  std::memset(out.data(), 0, out.size());
  uint64_t step = 0;
  for (auto _ : state) {
    size_t at = 0;
    for (size_t p = 0; p < tc.parts().size(); ++p) {
      const size_t size = tc.EncodedPartSize(p);
      absl::StatusOr<size_t> n = tc.EncodePart(p, x, step, std::span(out).subspan(at, size));
      if (!n.ok()) {
        state.SkipWithError(std::string(n.status().message()).c_str());
        return;
      }
      at += size;
    }
    ++step;
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kElements * 4);
}

void BM_Decode(benchmark::State& state, CodecId id, double ratio, bool add) {
  const std::vector<float>& x = Input();
  Codec codec = *Codec::Create(SpecFor(id, ratio));
  std::vector<std::byte> wire(codec.EncodedSize(x.size()));
  (void)codec.Encode(x, {.tensor_id = 1}, wire);
  std::vector<float> dst(x.size(), 0.0f);
  for (auto _ : state) {
    absl::Status s = add ? DecodeAdd(wire, dst) : Decode(wire, dst);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kElements * 4);
}

struct Case {
  const char* name;
  CodecId id;
  double ratio;
};
const Case kCases[] = {
    {"none", CodecId::kNone, 1.0},
    {"fp16", CodecId::kFp16, 1.0},
    {"bf16", CodecId::kBf16, 1.0},
    {"qsgd", CodecId::kQsgd, 1.0},
    {"terngrad", CodecId::kTernGrad, 1.0},
    {"onebit", CodecId::kOneBit, 1.0},
    {"topk_0.1%", CodecId::kTopK, 0.001},
    {"topk_1%", CodecId::kTopK, 0.01},
    {"randomk_0.1%", CodecId::kRandomK, 0.001},
    {"randomk_1%", CodecId::kRandomK, 0.01},
};

int Register() {
  benchmark::RegisterBenchmark("read_pass", BM_ReadPass)->Unit(benchmark::kMillisecond);
  for (const Case& c : kCases) {
    benchmark::RegisterBenchmark((std::string("encode/") + c.name).c_str(), BM_Encode, c.id, c.ratio)
        ->Unit(benchmark::kMillisecond);
  }
  for (const Case& c : kCases) {
    if (c.id == CodecId::kNone || c.id == CodecId::kRandomK || c.id == CodecId::kBf16) continue;
    benchmark::RegisterBenchmark((std::string("encode_parts/") + c.name).c_str(), BM_EncodeParts,
                                 c.id, c.ratio)
        ->Unit(benchmark::kMillisecond);
  }
  for (const Case& c : kCases) {
    benchmark::RegisterBenchmark((std::string("decode/") + c.name).c_str(), BM_Decode, c.id, c.ratio,
                                 false)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("decode_add/") + c.name).c_str(), BM_Decode, c.id,
                                 c.ratio, true)
        ->Unit(benchmark::kMillisecond);
  }
  return 0;
}
const int kRegistered = Register();

}  // namespace
}  // namespace tessera::compress

int main(int argc, char** argv) {
  // --cpu-kernels=portable|avx2|avx512 caps the kernel table (to compare
  // paths); the other flags are Google Benchmark's.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (!arg.starts_with("--cpu-kernels=")) {
      argv[kept++] = argv[i];
      continue;
    }
    if (absl::Status s = tessera::compress::kernels::CapBest(arg.substr(arg.find('=') + 1)); !s.ok()) {
      std::fprintf(stderr, "codec_bench: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  argc = kept;
  // Which kernel table ran; the script prints it.
  benchmark::AddCustomContext("kernels", tessera::compress::kernels::Best().name);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

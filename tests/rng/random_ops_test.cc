// The random kernels on the selected device (sim by default, the GPU for the `gpu` entry): Philox known
// answers through the device path, cuRAND stream vectors through FillBits, fills and dropout equal to the
// host computation bit for bit, captured PhiloxArgs read at run time, and (GPU only) real cuRAND agreement.
// GRAPHALLOC_TEST_SCALE below 1 (the sanitizer builds) shortens the multi-iteration fills.
#include "graphalloc/rng/random_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "graphalloc/rng/philox.h"
#include "graphalloc/rng/philox_args.h"
#include "tests/rng/philox_vectors.h"
#include "tests/rng/rng_test_util.h"
#include "tests/testing/test_device.h"
#include "tests/testing/test_scale.h"

#if defined(GRAPHALLOC_RNG_TEST_HAVE_CUDA)
#include "tests/rng/curand_reference.h"
#endif

namespace graphalloc {
namespace {

using rng_test::Kat;
using rng_test::kKats;
using rng_test::kStreamRows;
using rng_test::StreamRow;

using rng_test::Bits;
using rng_test::DeviceBuffer;
using rng_test::ExpectedWord;

TEST(RandomOpsTest, KnownAnswerVectorsThroughTheDevicePath) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  std::vector<PhiloxWords> counters, out(kKats.size());
  std::vector<PhiloxKey> keys;
  for (const Kat& k : kKats) {
    counters.push_back(k.counter);
    keys.push_back(k.key);
  }
  if (driver->Kind() == "sim") {
    // The simulated device's "kernel" is a stream-ordered closure over device (= host) memory.
    DeviceBuffer buf(*driver, sizeof(PhiloxWords) * kKats.size());
    const DevicePtr dst = buf.get();
    ASSERT_TRUE(driver
                    ->LaunchHostFunction(kDefaultStream,
                                         [dst, counters, keys] {
                                           auto* o = reinterpret_cast<PhiloxWords*>(dst);
                                           for (std::size_t i = 0; i < counters.size(); ++i) {
                                             o[i] = kKats[i].rounds == 7
                                                        ? Philox4x32<7>(counters[i], keys[i])
                                                        : Philox4x32<10>(counters[i], keys[i]);
                                           }
                                         })
                    .ok());
    ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
    out = buf.Read<PhiloxWords>();
  } else {
#if defined(GRAPHALLOC_RNG_TEST_HAVE_CUDA)
    // Rounds differ per row: run the 10-round and 7-round rows separately.
    std::vector<PhiloxWords> out10(kKats.size()), out7(kKats.size());
    int err = rng_test::RunPhiloxBlocksOnGpu(counters.data(), keys.data(), static_cast<int>(kKats.size()), 10,
                                             out10.data());
    ASSERT_EQ(err, 0) << rng_test::CudaErrorText(err);
    err = rng_test::RunPhiloxBlocksOnGpu(counters.data(), keys.data(), static_cast<int>(kKats.size()), 7,
                                         out7.data());
    ASSERT_EQ(err, 0) << rng_test::CudaErrorText(err);
    for (std::size_t i = 0; i < kKats.size(); ++i) out[i] = kKats[i].rounds == 7 ? out7[i] : out10[i];
#else
    GTEST_SKIP() << "built without nvcc: no device kernels to test";
#endif
  }
  for (std::size_t i = 0; i < kKats.size(); ++i) {
    EXPECT_EQ(out[i].x, kKats[i].expected.x) << "K" << i + 1;
    EXPECT_EQ(out[i].y, kKats[i].expected.y) << "K" << i + 1;
    EXPECT_EQ(out[i].z, kKats[i].expected.z) << "K" << i + 1;
    EXPECT_EQ(out[i].w, kKats[i].expected.w) << "K" << i + 1;
  }
}

TEST(RandomOpsTest, FillBitsReproducesCurandStreamVectors) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  // At the full grid (1056 x 256 threads) with 8 words per thread every thread draws two curand4 blocks;
  // thread t's draw j lands at element (j / 4) * 4T + (j % 4) * T + t.
  const std::uint64_t threads = 1056 * 256;
  const std::size_t n = 8 * threads;
  ASSERT_EQ(PhiloxIncrement(n), 8u);
  DeviceBuffer buf(*driver, n * sizeof(std::uint32_t));
  for (const StreamRow& row : kStreamRows) {
    ASSERT_TRUE(
        FillBits(*driver, kDefaultStream, buf.get(), n, PhiloxArgs::Eager(row.seed, row.offset)).ok());
    ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
    const std::vector<std::uint32_t> out = buf.Read<std::uint32_t>();
    for (std::uint64_t j = 0; j < 8; ++j) {
      const std::uint64_t index = (j / 4) * 4 * threads + (j % 4) * threads + row.subsequence;
      EXPECT_EQ(out[index], row.words[j]) << "seed " << row.seed << " subsequence " << row.subsequence
                                          << " offset " << row.offset << " draw " << j;
    }
  }
}

TEST(RandomOpsTest, FillBitsEqualsTheHostStreamForEveryElement) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  for (std::size_t n :
       {std::size_t{1}, std::size_t{255}, std::size_t{5000}, std::size_t{1056 * 256 * 4 + 3}}) {
    const std::uint64_t seed = 0x5eed0000 + n, offset = 12;
    DeviceBuffer buf(*driver, n * sizeof(std::uint32_t));
    ASSERT_TRUE(FillBits(*driver, kDefaultStream, buf.get(), n, PhiloxArgs::Eager(seed, offset)).ok());
    ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
    const std::vector<std::uint32_t> out = buf.Read<std::uint32_t>();
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) mismatches += out[i] != ExpectedWord(seed, offset, i, n);
    EXPECT_EQ(mismatches, 0u) << "n = " << n;
  }
}

TEST(RandomOpsTest, UniformAndNormalFillsEqualHostBitsInBothDtypes) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t n = 300001;
  const std::uint64_t seed = 1234, offset = 40;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (bool normal : {false, true}) {
      DeviceBuffer buf(*driver, n * DTypeSize(dtype));
      const PhiloxArgs args = PhiloxArgs::Eager(seed, offset);
      ASSERT_TRUE(
          (normal ? FillNormal : FillUniform)(*driver, kDefaultStream, buf.get(), n, dtype, args).ok());
      ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
      std::size_t mismatches = 0;
      // Expected: the element's word (pair, for normals) through rng/philox.h's conversions.
      auto expected_float = [&](std::size_t i) {
        if (!normal) return UniformFloat(ExpectedWord(seed, offset, i, n));
        // Normals pair words (0,1) and (2,3) of the same curand4 draw.
        const std::uint64_t t = rng_test::ExpectedThreads(n);
        const std::size_t k = (i % (4 * t)) / t;
        const std::size_t first = i - (k % 2) * t;
        const FloatPair p =
            NormalPair(ExpectedWord(seed, offset, first, n), ExpectedWord(seed, offset, first + t, n));
        return k % 2 == 0 ? p.first : p.second;
      };
      if (dtype == DType::kFloat32) {
        const std::vector<std::uint32_t> out = buf.Read<std::uint32_t>();
        for (std::size_t i = 0; i < n; ++i) mismatches += out[i] != Bits(expected_float(i));
      } else {
        const std::vector<std::uint16_t> out = buf.Read<std::uint16_t>();
        for (std::size_t i = 0; i < n; ++i) mismatches += out[i] != FloatToBFloat16(expected_float(i));
      }
      EXPECT_EQ(mismatches, 0u) << (normal ? "normal" : "uniform") << " dtype " << static_cast<int>(dtype);
    }
  }
}

std::vector<float> Iota(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 1.0f + static_cast<float>(i % 1000) * 0.25f;
  return v;
}

TEST(RandomOpsTest, DropoutForwardAndBackwardShareOneMask) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t n = 100003;
  const float p = 0.3f;
  const std::uint64_t seed = 77, offset = 8;
  const PhiloxArgs args = PhiloxArgs::Eager(seed, offset);
  DeviceBuffer in(*driver, n * 4), out(*driver, n * 4), grad_out(*driver, n * 4), grad_in(*driver, n * 4);
  const std::vector<float> x = Iota(n);
  in.Write(x);
  grad_out.Write(std::vector<float>(n, 2.0f));
  ASSERT_TRUE(DropoutForward(*driver, kDefaultStream, in.get(), out.get(), n, DType::kFloat32, p, args).ok());
  ASSERT_TRUE(
      DropoutBackward(*driver, kDefaultStream, grad_out.get(), grad_in.get(), n, DType::kFloat32, p, args)
          .ok());
  ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
  const std::vector<float> y = out.Read<float>(), g = grad_in.Read<float>();
  const float keep = 1.0f - p, scale = 1.0f / keep;
  std::size_t kept = 0, mismatches = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool k = UniformFloat(ExpectedWord(seed, offset, i, n)) <= keep;
    kept += k;
    mismatches += Bits(y[i]) != Bits(k ? x[i] * scale : 0.0f);
    mismatches += Bits(g[i]) != Bits(k ? 2.0f * scale : 0.0f);
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.7, 0.01);
}

TEST(RandomOpsTest, DropoutBFloat16InPlaceAndEdgeProbabilities) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t n = 4099;
  DeviceBuffer buf(*driver, n * 2);
  std::vector<std::uint16_t> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = FloatToBFloat16(0.5f + static_cast<float>(i % 7));
  const PhiloxArgs args = PhiloxArgs::Eager(5, 0);
  // p = 0: identity.
  buf.Write(x);
  ASSERT_TRUE(
      DropoutForward(*driver, kDefaultStream, buf.get(), buf.get(), n, DType::kBFloat16, 0.0f, args).ok());
  ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
  EXPECT_EQ(buf.Read<std::uint16_t>(), x);
  // p = 0.5 in place: kept elements doubled.
  ASSERT_TRUE(
      DropoutForward(*driver, kDefaultStream, buf.get(), buf.get(), n, DType::kBFloat16, 0.5f, args).ok());
  ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
  const std::vector<std::uint16_t> half = buf.Read<std::uint16_t>();
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool k = UniformFloat(ExpectedWord(5, 0, i, n)) <= 0.5f;
    mismatches += half[i] != (k ? FloatToBFloat16(BFloat16ToFloat(x[i]) * 2.0f) : FloatToBFloat16(0.0f));
  }
  EXPECT_EQ(mismatches, 0u);
  // p = 1: everything dropped.
  ASSERT_TRUE(
      DropoutForward(*driver, kDefaultStream, buf.get(), buf.get(), n, DType::kBFloat16, 1.0f, args).ok());
  ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
  EXPECT_EQ(buf.Read<std::uint16_t>(), std::vector<std::uint16_t>(n, 0));
}

TEST(RandomOpsTest, RejectsBadArguments) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  DeviceBuffer buf(*driver, 64);
  const PhiloxArgs args = PhiloxArgs::Eager(1, 0);
  absl::Status s =
      DropoutForward(*driver, kDefaultStream, buf.get(), buf.get(), 4, DType::kFloat32, 1.5f, args);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("drop probability must be in [0, 1], got 1.5"), std::string::npos) << s;
  s = FillUniform(*driver, kDefaultStream, 0, 4, DType::kFloat32, args);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out is a null device pointer"), std::string::npos) << s;
  s = FillBits(*driver, kDefaultStream, buf.get(), 4, PhiloxArgs::Captured(0, 0, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("null seed or offset slot address"), std::string::npos) << s;
  EXPECT_TRUE(FillBits(*driver, kDefaultStream, 0, 0, args).ok());  // n = 0 is a no-op
}

TEST(RandomOpsTest, CapturedArgsReadTheSlotsWhenTheKernelRuns) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t n = 2048;
  DeviceBuffer slots(*driver, 16), a(*driver, n * 4), b(*driver, n * 4);
  const PhiloxArgs captured = PhiloxArgs::Captured(slots.get(), slots.get() + 8, /*intragraph_offset=*/8);
  // Slot write and kernel are stream-ordered; the kernel sees (seed 9, base 4) + 8.
  ASSERT_TRUE(WritePhiloxSlots(*driver, kDefaultStream, slots.get(), 9, 4).ok());
  ASSERT_TRUE(FillBits(*driver, kDefaultStream, a.get(), n, captured).ok());
  ASSERT_TRUE(WritePhiloxSlots(*driver, kDefaultStream, slots.get(), 10, 100).ok());
  ASSERT_TRUE(FillBits(*driver, kDefaultStream, b.get(), n, captured).ok());
  ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
  const std::vector<std::uint32_t> va = a.Read<std::uint32_t>(), vb = b.Read<std::uint32_t>();
  for (std::size_t i : {std::size_t{0}, std::size_t{1}, std::size_t{777}, n - 1}) {
    EXPECT_EQ(va[i], ExpectedWord(9, 12, i, n)) << i;
    EXPECT_EQ(vb[i], ExpectedWord(10, 108, i, n)) << i;
  }
  EXPECT_EQ(slots.Read<std::uint64_t>(), (std::vector<std::uint64_t>{10, 100}));
}

// The device kernels take a fast path (several subsequences per thread, vector stores, no bounds checks in
// whole iterations) when the offset is a multiple of 4, the counter's low word does not wrap during the
// launch and the buffers are aligned; otherwise the shared per-thread body. Both must equal the host twin
// bit for bit, over several whole iterations plus a partial one (three whole ones; under the sanitizers,
// GRAPHALLOC_TEST_SCALE below 1, one: the loop still runs a whole iteration and a partial one).
constexpr std::size_t kFullThreads = 1056 * 256;
std::size_t ManyIterations() {
  const auto whole = static_cast<std::size_t>(std::min(3, testing::ScaledCount(3)));
  return whole * 4 * kFullThreads + 1001;
}

struct FillCase {
  rng_body::ElementType type;
  rng_body::Distribution dist;
  std::uint64_t offset;
  std::size_t misalign;  // elements
};

TEST(RandomOpsTest, MultiIterationFillsEqualTheHostTwinOnFastAndFallbackPaths) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  using rng_body::Distribution;
  using rng_body::ElementType;
  const std::size_t n = ManyIterations();
  const std::vector<FillCase> cases = {
      {ElementType::kFloat32, Distribution::kUniform, 0, 0},
      {ElementType::kFloat32, Distribution::kUniform, 44, 1},  // misaligned: fallback
      {ElementType::kFloat32, Distribution::kUniform, 6, 0},   // offset % 4 != 0: fallback
      {ElementType::kBFloat16, Distribution::kUniform, 16, 0},
      {ElementType::kBFloat16, Distribution::kUniform, 16, 3},
      {ElementType::kUint32, Distribution::kBits, 4 * 0xfffffffcull, 0},  // low word reaches 0xffffffff
      {ElementType::kUint32, Distribution::kBits, 4 * 0xfffffffeull, 0},  // low word wraps: fallback
      {ElementType::kUint32, Distribution::kBits, 4 * ((5ull << 32) | 7), 0},
      {ElementType::kFloat32, Distribution::kNormal, 20, 0},
      {ElementType::kBFloat16, Distribution::kNormal, 20, 0},
  };
  for (const FillCase& c : cases) {
    const std::size_t esize = c.type == ElementType::kBFloat16 ? 2 : 4;
    DeviceBuffer buf(*driver, (n + c.misalign) * esize);
    const DevicePtr out = buf.get() + c.misalign * esize;
    const PhiloxArgs args = PhiloxArgs::Eager(0xabcdef12345ull + c.offset, c.offset);
    const DType dtype = c.type == ElementType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
    absl::Status s = c.dist == Distribution::kBits ? FillBits(*driver, kDefaultStream, out, n, args)
                     : c.dist == Distribution::kUniform
                         ? FillUniform(*driver, kDefaultStream, out, n, dtype, args)
                         : FillNormal(*driver, kDefaultStream, out, n, dtype, args);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
    const std::vector<std::uint8_t> got = buf.Read<std::uint8_t>();
    std::vector<std::uint8_t> want(n * esize);
    FillOnHost(want.data(), n, c.type, c.dist, args);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n * esize; ++i) mismatches += got[c.misalign * esize + i] != want[i];
    EXPECT_EQ(mismatches, 0u) << "type " << static_cast<int>(c.type) << " dist " << static_cast<int>(c.dist)
                              << " offset " << c.offset << " misalign " << c.misalign;
  }
}

TEST(RandomOpsTest, MultiIterationCapturedFillReadsTheSlots) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t n = ManyIterations();
  DeviceBuffer slots(*driver, 16), buf(*driver, n * 4);
  ASSERT_TRUE(WritePhiloxSlots(*driver, kDefaultStream, slots.get(), 31, 400).ok());
  const PhiloxArgs captured = PhiloxArgs::Captured(slots.get(), slots.get() + 8, /*intragraph_offset=*/16);
  ASSERT_TRUE(FillUniform(*driver, kDefaultStream, buf.get(), n, DType::kFloat32, captured).ok());
  ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
  const std::vector<std::uint32_t> got = buf.Read<std::uint32_t>();
  std::vector<std::uint32_t> want(n);
  FillOnHost(want.data(), n, rng_body::ElementType::kFloat32, rng_body::Distribution::kUniform,
             PhiloxArgs::Eager(31, 416));
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < n; ++i) mismatches += got[i] != want[i];
  EXPECT_EQ(mismatches, 0u);
}

TEST(RandomOpsTest, MultiIterationDropoutEqualsTheHostTwin) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t n = ManyIterations();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const std::size_t esize = DTypeSize(dtype);
    const rng_body::ElementType type =
        dtype == DType::kBFloat16 ? rng_body::ElementType::kBFloat16 : rng_body::ElementType::kFloat32;
    // Input: bit patterns of ordinary values (float32) or bfloat16s, written as bytes.
    std::vector<std::uint8_t> x((n + 1) * esize);
    for (std::size_t i = 0; i < n + 1; ++i) {
      const float v = 0.5f + static_cast<float>(i % 1013) * 0.125f;
      if (dtype == DType::kBFloat16) {
        const std::uint16_t b = FloatToBFloat16(v);
        std::memcpy(&x[i * esize], &b, 2);
      } else {
        std::memcpy(&x[i * esize], &v, 4);
      }
    }
    for (float p : {0.0f, 0.1f, 0.999f, 1.0f}) {
      for (int variant = 0; variant < 3; ++variant) {  // aligned, aligned in place, misaligned
        {
          const std::size_t misalign = variant == 2 ? 1 : 0;
          const bool in_place = variant == 1;
          const PhiloxArgs args = PhiloxArgs::Eager(99, 8);
          DeviceBuffer in(*driver, (n + 1) * esize), out(*driver, (n + 1) * esize);
          in.Write(x);
          const DevicePtr src = in.get() + misalign * esize;
          const DevicePtr dst = in_place ? src : out.get();
          ASSERT_TRUE(DropoutForward(*driver, kDefaultStream, src, dst, n, dtype, p, args).ok());
          ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
          const std::vector<std::uint8_t> got_all = (in_place ? in : out).Read<std::uint8_t>();
          const std::size_t at = in_place ? misalign * esize : 0;
          std::vector<std::uint8_t> want(n * esize);
          DropoutOnHost(x.data() + misalign * esize, want.data(), n, type, DropoutParamsFor(p), args);
          std::size_t mismatches = 0;
          for (std::size_t i = 0; i < n * esize; ++i) mismatches += got_all[at + i] != want[i];
          EXPECT_EQ(mismatches, 0u) << "dtype " << static_cast<int>(dtype) << " p " << p << " misalign "
                                    << misalign << " in_place " << in_place;
        }
      }
    }
  }
}

TEST(RandomOpsTest, AgreesWithRealCurandOnTheGpu) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  if (driver->Kind() != "cuda") GTEST_SKIP() << "real cuRAND runs on the GPU only (the `gpu` test entry)";
#if defined(GRAPHALLOC_RNG_TEST_HAVE_CUDA)
  std::vector<std::uint64_t> seeds, subs, offsets;
  for (std::uint64_t seed : {0ull, 1ull, 42ull, 0x123456789abcdef0ull, ~0ull}) {
    for (std::uint64_t sub : {0ull, 1ull, 5ull, 1023ull, 0xffffffffull, 0x100000000ull, ~0ull}) {
      for (std::uint64_t off :
           {0ull, 1ull, 2ull, 3ull, 4ull, 8ull, 1000ull, 0x3fffffffcull, 0x400000000ull, ~0ull - 3}) {
        seeds.push_back(seed);
        subs.push_back(sub);
        offsets.push_back(off);
      }
    }
  }
  const int count = static_cast<int>(seeds.size()), words = 12;
  std::vector<std::uint32_t> curand(count * words), ours_gpu(count * words);
  int err = rng_test::RunCurandOnGpu(seeds.data(), subs.data(), offsets.data(), count, words, curand.data());
  ASSERT_EQ(err, 0) << rng_test::CudaErrorText(err);
  err = rng_test::RunPhiloxStreamOnGpu(seeds.data(), subs.data(), offsets.data(), count, words,
                                       ours_gpu.data());
  ASSERT_EQ(err, 0) << rng_test::CudaErrorText(err);
  for (int i = 0; i < count; ++i) {
    PhiloxStream host(seeds[i], subs[i], offsets[i]);
    for (int k = 0; k < words; ++k) {
      const std::uint32_t h = host.Next();
      ASSERT_EQ(curand[i * words + k], h) << "cuRAND vs host: seed " << seeds[i] << " subsequence " << subs[i]
                                          << " offset " << offsets[i] << " draw " << k;
      ASSERT_EQ(ours_gpu[i * words + k], h) << "our GPU stream vs host: seed " << seeds[i] << " subsequence "
                                            << subs[i] << " offset " << offsets[i] << " draw " << k;
    }
  }
  // curand_uniform's float conversion, bit for bit.
  const int n = 1 << 16;
  std::vector<float> uniform(n);
  err = rng_test::RunCurandUniformOnGpu(2718, n, uniform.data());
  ASSERT_EQ(err, 0) << rng_test::CudaErrorText(err);
  for (int i = 0; i < n; ++i) {
    PhiloxStream s(2718, i, 0);
    ASSERT_EQ(Bits(uniform[i]), Bits(UniformFloat(s.Next()))) << "thread " << i;
  }
#else
  GTEST_SKIP() << "built without nvcc: no cuRAND reference kernels";
#endif
}

}  // namespace
}  // namespace graphalloc

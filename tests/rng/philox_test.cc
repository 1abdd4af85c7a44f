// Host checks of rng/philox.h: Random123 known-answer vectors, cuRAND stream vectors (docs/rng.md),
// and the exact float conversions.
#include "graphalloc/rng/philox.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>

#include "tests/rng/philox_vectors.h"
#include "tests/rng/rng_test_util.h"

namespace graphalloc {
namespace {

using rng_test::Kat;
using rng_test::kKats;
using rng_test::kStreamRows;
using rng_test::StreamRow;

using rng_test::Bits;

PhiloxWords RunKat(const Kat& k) {
  return k.rounds == 7 ? Philox4x32<7>(k.counter, k.key) : Philox4x32<10>(k.counter, k.key);
}

TEST(PhiloxTest, KnownAnswerVectorsK1ToK5) {
  for (std::size_t i = 0; i < kKats.size(); ++i) {
    const PhiloxWords out = RunKat(kKats[i]);
    EXPECT_EQ(out.x, kKats[i].expected.x) << "K" << i + 1;
    EXPECT_EQ(out.y, kKats[i].expected.y) << "K" << i + 1;
    EXPECT_EQ(out.z, kKats[i].expected.z) << "K" << i + 1;
    EXPECT_EQ(out.w, kKats[i].expected.w) << "K" << i + 1;
  }
}

TEST(PhiloxTest, DefaultRoundsAreTen) {
  EXPECT_EQ(Philox4x32(kKats[2].counter, kKats[2].key), kKats[2].expected);
  EXPECT_FALSE(Philox4x32<9>(kKats[2].counter, kKats[2].key) == kKats[2].expected);
}

TEST(PhiloxTest, RoundAndKeyBumpMatchTheDefinition) {
  const PhiloxKey bumped = PhiloxBumpKey(PhiloxKey{1, 2});
  EXPECT_EQ(bumped.x, 0x9E3779BAu);
  EXPECT_EQ(bumped.y, 0xBB67AE87u);
  // One round of (c0..c3) = (1, 2, 3, 4), key (5, 6):
  // M0*1 = 0xD2511F53 (hi 0), M1*3 = 0x2_68DBA805 (hi 2, lo 0x68DBA805).
  const PhiloxWords r = PhiloxRound(PhiloxWords{1, 2, 3, 4}, PhiloxKey{5, 6});
  EXPECT_EQ(r.x, 2u ^ 2u ^ 5u);
  EXPECT_EQ(r.y, 0x68DBA805u);
  EXPECT_EQ(r.z, 0u ^ 4u ^ 6u);
  EXPECT_EQ(r.w, 0xD2511F53u);
}

TEST(PhiloxStreamTest, MatchesCurandStreamVectorsWithNext) {
  for (const StreamRow& row : kStreamRows) {
    PhiloxStream s(row.seed, row.subsequence, row.offset);
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(s.Next(), row.words[i]) << "seed " << row.seed << " subseq " << row.subsequence << " offset "
                                        << row.offset << " word " << i;
    }
  }
}

TEST(PhiloxStreamTest, MatchesCurandStreamVectorsWithNext4) {
  for (const StreamRow& row : kStreamRows) {
    PhiloxStream s(row.seed, row.subsequence, row.offset);
    const PhiloxWords a = s.Next4();
    const PhiloxWords b = s.Next4();
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(a[i], row.words[i]) << "offset " << row.offset << " word " << i;
      EXPECT_EQ(b[i], row.words[4 + i]) << "offset " << row.offset << " word " << 4 + i;
    }
  }
}

TEST(PhiloxStreamTest, BlockFormulaForOffsetsThatAreMultiplesOfFour) {
  // For offset % 4 == 0, draw k is word k % 4 of Philox(ctr = (offset/4 + k/4, 0, lo(sub), hi(sub)), key).
  const std::uint64_t seed = 0xfeedfacecafebeefull, sub = 0x1'0000'0003ull, offset = 4 * 1000;
  PhiloxStream s(seed, sub, offset);
  for (std::uint32_t k = 0; k < 12; ++k) {
    const PhiloxWords block =
        Philox4x32(PhiloxWords{static_cast<std::uint32_t>(offset / 4 + k / 4), 0,
                               static_cast<std::uint32_t>(sub), static_cast<std::uint32_t>(sub >> 32)},
                   PhiloxKey{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
    EXPECT_EQ(s.Next(), block[static_cast<int>(k % 4)]) << "draw " << k;
  }
}

TEST(PhiloxStreamTest, CounterCarriesAcrossWords) {
  // offset/4 = 2^32 - 1 blocks: the next block carries from ctr.x into ctr.y.
  const std::uint64_t offset = (std::uint64_t{1} << 32) * 4 - 4;
  PhiloxStream s(7, 0, offset);
  EXPECT_EQ(s.counter().x, 0xffffffffu);
  EXPECT_EQ(s.counter().y, 0u);
  s.Next4();
  EXPECT_EQ(s.counter().x, 0u);
  EXPECT_EQ(s.counter().y, 1u);
  const PhiloxWords next = s.Next4();
  EXPECT_EQ(next, Philox4x32(PhiloxWords{0, 1, 0, 0}, PhiloxKey{7, 0}));
}

TEST(UniformFloatTest, ExactValuesAtTheEnds) {
  EXPECT_EQ(Bits(UniformFloat(0)), 0x2f000000u);            // 2^-33
  EXPECT_EQ(Bits(UniformFloat(1)), Bits(0x1.8p-32f));       // 2^-32 + 2^-33
  EXPECT_EQ(Bits(UniformFloat(0x80000000u)), 0x3f000000u);  // 0.5 (+2^-33 rounds away)
  EXPECT_EQ(Bits(UniformFloat(0xffffffffu)), 0x3f800000u);  // float(2^32 - 1) = 2^32 -> 1.0
}

TEST(UniformFloatTest, EqualsCurandFormulaForRandomWords) {
  // curand_uniform = float(x) * 2^-32 + 2^-33 with one rounding; in double the sum is exact.
  std::mt19937 rng(1234);
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t x = rng();
    const float expected = static_cast<float>(static_cast<double>(static_cast<float>(x)) * 0x1p-32 + 0x1p-33);
    ASSERT_EQ(Bits(UniformFloat(x)), Bits(expected)) << "x = " << x;
  }
}

TEST(BFloat16Test, RoundsToNearestEven) {
  auto bf = [](std::uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return FloatToBFloat16(f);
  };
  EXPECT_EQ(bf(0x3f800000u), 0x3f80);           // 1.0
  EXPECT_EQ(bf(0x3f808000u), 0x3f80);           // tie, even stays
  EXPECT_EQ(bf(0x3f818000u), 0x3f82);           // tie, odd rounds up
  EXPECT_EQ(bf(0x3f808001u), 0x3f81);           // above the tie
  EXPECT_EQ(bf(0x3f807fffu), 0x3f80);           // below the tie
  EXPECT_EQ(bf(0x7f7fffffu), 0x7f80);           // max float rounds to +inf
  EXPECT_EQ(bf(0xff800000u), 0xff80);           // -inf
  EXPECT_EQ(bf(0x7fc00000u), 0x7fc0);           // quiet NaN
  EXPECT_EQ(bf(0x7f800001u) & 0x7fc0, 0x7fc0);  // signalling NaN stays NaN (quieted)
  EXPECT_EQ(Bits(BFloat16ToFloat(0x3f82)), 0x3f820000u);
}

TEST(NormalTest, BoxMullerMatchesDoublePrecisionReference) {
  std::mt19937 rng(99);
  double max_err = 0;
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t a = rng(), b = rng();
    const FloatPair p = NormalPair(a, b);
    const double u = static_cast<double>(UniformFloat(a));
    const double t = static_cast<double>(UniformFloat(b));
    const double r = std::sqrt(-2.0 * std::log(u));
    const double ref_sin = r * std::sin(2 * M_PI * t), ref_cos = r * std::cos(2 * M_PI * t);
    max_err = std::max({max_err, std::abs(p.first - ref_sin) / (1 + std::abs(ref_sin)),
                        std::abs(p.second - ref_cos) / (1 + std::abs(ref_cos))});
  }
  EXPECT_LT(max_err, 2e-6);
}

TEST(NormalTest, CloseToCurandHostFormula) {
  // cuRAND's host branch of _curand_box_muller (the device branch uses __sincosf; see rng/philox.h).
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const std::uint32_t x = rng(), y = rng();
    const float u = x * 2.3283064e-10f + (2.3283064e-10f / 2);
    const float v = y * (2.3283064e-10f * 6.2831855f) + ((2.3283064e-10f * 6.2831855f) / 2);
    const float s = std::sqrt(-2.0f * std::log(u));
    const FloatPair p = NormalPair(x, y);
    ASSERT_NEAR(p.first, std::sin(v) * s, 1e-5 * (1 + std::abs(s))) << x << " " << y;
    ASSERT_NEAR(p.second, std::cos(v) * s, 1e-5 * (1 + std::abs(s))) << x << " " << y;
  }
}

TEST(NormalTest, MomentsOfAMillionDraws) {
  PhiloxStream s(2024, 0, 0);
  double sum = 0, sum2 = 0;
  const int n = 1 << 20;
  for (int i = 0; i < n / 2; ++i) {
    const std::uint32_t a = s.Next(), b = s.Next();
    const FloatPair p = NormalPair(a, b);
    sum += p.first + p.second;
    sum2 += static_cast<double>(p.first) * p.first + static_cast<double>(p.second) * p.second;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.005);
  EXPECT_NEAR(sum2 / n, 1.0, 0.005);
}

}  // namespace
}  // namespace graphalloc

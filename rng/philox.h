// Philox4x32-10, the counter-based generator behind cuRAND's Philox and PyTorch's CUDA RNG, in one header
// that compiles as plain C++ (host, simulated device) and as CUDA (device kernels), bit-identical on both.
//
// What is here:
//   - the round function, the key bump and the block function Philox4x32<R>(counter, key) (Random123's
//     philox4x32_R; R = 10 is the default and cuRAND's curand_Philox4x32_10);
//   - PhiloxStream: a cuRAND-compatible stream. PhiloxStream(seed, subsequence, offset) is
//     curand_init(seed, subsequence, offset, &state) for curandStatePhilox4_32_10_t, Next() is curand(),
//     Next4() is curand4() (carry quirks of Philox_State_Incr reproduced);
//   - conversions: UniformFloat (== curand_uniform, bit for bit), NormalPair (the Box-Muller transform of
//     curand_normal / curand_normal4, see below), FloatToBFloat16 (round to nearest even).
//
// Floating point: every float operation goes through GA_FMUL/GA_FADD/GA_FDIV/GA_FSQRT, which on the device
// are the round-to-nearest intrinsics that the compiler never fuses, and on the host are plain IEEE
// operations (ISO C++ mode, which the build uses, does not contract a*b+c). So host and device produce the
// same bits for everything in this header.
//
// Normal draws: cuRAND computes sqrtf(-2 logf(u)) and __sincosf(v) with the GPU's approximate hardware
// sine; no host code can reproduce those bits. NormalPair therefore uses its own logarithm and sine/cosine
// (polynomials in float arithmetic, |error| < 2e-7 relative to the exact values), so our host and device
// agree bit for bit, and our values agree with curand_normal to about 1e-6 (not bit for bit).
#ifndef GRAPHALLOC_RNG_PHILOX_H_
#define GRAPHALLOC_RNG_PHILOX_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GA_HD __host__ __device__
#define GA_INLINE __forceinline__
#else
#define GA_HD
#define GA_INLINE inline
#endif

#if defined(__CUDA_ARCH__)
#define GA_FMUL(a, b) __fmul_rn((a), (b))
#define GA_FADD(a, b) __fadd_rn((a), (b))
#define GA_FDIV(a, b) __fdiv_rn((a), (b))
#define GA_FSQRT(a) __fsqrt_rn(a)
#define GA_U2F(x) __uint2float_rn(x)
#else
#define GA_FMUL(a, b) ((a) * (b))
#define GA_FADD(a, b) ((a) + (b))
#define GA_FDIV(a, b) ((a) / (b))
#define GA_FSQRT(a) ::graphalloc::philox_detail::HostSqrt(a)
#define GA_U2F(x) static_cast<float>(x)
#endif

namespace graphalloc {

#if !defined(__CUDA_ARCH__)
namespace philox_detail {
inline float HostSqrt(float x) { return std::sqrt(x); }  // IEEE: correctly rounded, as __fsqrt_rn
}  // namespace philox_detail
#endif

// Constants (Random123 philox.h).
inline constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
inline constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1
inline constexpr int kPhiloxDefaultRounds = 10;

// Four 32-bit words (a counter or an output block): (x, y, z, w) = (c0, c1, c2, c3).
struct PhiloxWords {
  std::uint32_t x = 0, y = 0, z = 0, w = 0;
  GA_HD constexpr std::uint32_t operator[](int i) const { return i == 0 ? x : i == 1 ? y : i == 2 ? z : w; }
  friend GA_HD constexpr bool operator==(const PhiloxWords& a, const PhiloxWords& b) {
    return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w;
  }
};

// Two 32-bit key words: (x, y) = (k0, k1).
struct PhiloxKey {
  std::uint32_t x = 0, y = 0;
};

GA_HD GA_INLINE std::uint32_t MulHiLo32(std::uint32_t a, std::uint32_t b, std::uint32_t* hi) {
#if defined(__CUDA_ARCH__)
  *hi = __umulhi(a, b);
  return a * b;
#else
  const std::uint64_t product = static_cast<std::uint64_t>(a) * b;
  *hi = static_cast<std::uint32_t>(product >> 32);
  return static_cast<std::uint32_t>(product);
#endif
}

// One round: out = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0) with (hi0, lo0) = M0 * c0, (hi1, lo1) = M1 * c2.
GA_HD GA_INLINE PhiloxWords PhiloxRound(PhiloxWords c, PhiloxKey k) {
  std::uint32_t hi0, hi1;
  const std::uint32_t lo0 = MulHiLo32(kPhiloxM0, c.x, &hi0);
  const std::uint32_t lo1 = MulHiLo32(kPhiloxM1, c.z, &hi1);
  return PhiloxWords{hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0};
}

// The Weyl key schedule applied before rounds 2..R.
GA_HD GA_INLINE PhiloxKey PhiloxBumpKey(PhiloxKey k) { return PhiloxKey{k.x + kPhiloxW0, k.y + kPhiloxW1}; }

// The block function: R rounds of PhiloxRound with the key bumped between rounds.
template <int R = kPhiloxDefaultRounds>
GA_HD GA_INLINE PhiloxWords Philox4x32(PhiloxWords counter, PhiloxKey key) {
  static_assert(R >= 1 && R <= 16, "Philox4x32 is defined for 1 to 16 rounds");
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < R; ++round) {
    if (round > 0) key = PhiloxBumpKey(key);
    counter = PhiloxRound(counter, key);
  }
  return counter;
}

// A cuRAND-compatible Philox4x32-10 stream (curandStatePhilox4_32_10_t without the Box-Muller caches).
// The k-th draw after PhiloxStream(seed, subsequence, offset) equals the k-th curand() after
// curand_init(seed, subsequence, offset): for offset % 4 == 0 it is word (k % 4) of
// Philox4x32(ctr = (lo(offset/4 + k/4), hi(offset/4 + k/4), lo(subsequence), hi(subsequence)),
//            key = (lo(seed), hi(seed))).
class PhiloxStream {
 public:
  GA_HD PhiloxStream(std::uint64_t seed, std::uint64_t subsequence, std::uint64_t offset)
      : key_{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)} {
    // skipahead_sequence: Philox_State_Incr_hi.
    IncrementHigh(subsequence);
    // skipahead.
    state_ += static_cast<std::uint32_t>(offset & 3);
    std::uint64_t blocks = offset / 4;
    if (state_ > 3) {
      blocks += 1;
      state_ -= 4;
    }
    IncrementLow(blocks);
    output_ = Philox4x32(ctr_, key_);
  }

  // curand(): the next 32-bit word.
  GA_HD GA_INLINE std::uint32_t Next() {
    const std::uint32_t ret = output_[static_cast<int>(state_)];
    if (++state_ == 4) {
      IncrementOne();
      output_ = Philox4x32(ctr_, key_);
      state_ = 0;
    }
    return ret;
  }

  // curand4(): the next four words (spanning two blocks when the stream is not at a block boundary).
  GA_HD GA_INLINE PhiloxWords Next4() {
    const PhiloxWords tmp = output_;
    IncrementOne();
    output_ = Philox4x32(ctr_, key_);
    switch (state_) {
      case 1:
        return PhiloxWords{tmp.y, tmp.z, tmp.w, output_.x};
      case 2:
        return PhiloxWords{tmp.z, tmp.w, output_.x, output_.y};
      case 3:
        return PhiloxWords{tmp.w, output_.x, output_.y, output_.z};
      default:
        return tmp;
    }
  }

  GA_HD const PhiloxWords& counter() const { return ctr_; }
  GA_HD PhiloxKey key() const { return key_; }

 private:
  // Philox_State_Incr(s, n): adds n to (ctr.x, ctr.y), carrying into z, w (cuRAND's exact carry logic).
  GA_HD GA_INLINE void IncrementLow(std::uint64_t n) {
    const std::uint32_t nlo = static_cast<std::uint32_t>(n);
    std::uint32_t nhi = static_cast<std::uint32_t>(n >> 32);
    ctr_.x += nlo;
    if (ctr_.x < nlo) nhi++;
    ctr_.y += nhi;
    if (nhi <= ctr_.y) return;
    if (++ctr_.z) return;
    ++ctr_.w;
  }
  // Philox_State_Incr_hi(s, n): adds n to (ctr.z, ctr.w).
  GA_HD GA_INLINE void IncrementHigh(std::uint64_t n) {
    const std::uint32_t nlo = static_cast<std::uint32_t>(n);
    std::uint32_t nhi = static_cast<std::uint32_t>(n >> 32);
    ctr_.z += nlo;
    if (ctr_.z < nlo) nhi++;
    ctr_.w += nhi;
  }
  // Philox_State_Incr(s): the 128-bit increment by one.
  GA_HD GA_INLINE void IncrementOne() {
    if (++ctr_.x) return;
    if (++ctr_.y) return;
    if (++ctr_.z) return;
    ++ctr_.w;
  }

  PhiloxWords ctr_{};
  PhiloxWords output_{};
  PhiloxKey key_{};
  std::uint32_t state_ = 0;
};

// ---- Conversions. ----

inline constexpr float kTwoPow32Inv = 2.3283064e-10f;  // CURAND_2POW32_INV; exactly 2^-32 as a float
static_assert(kTwoPow32Inv == 0x1p-32f, "CURAND_2POW32_INV must round to 2^-32");

// curand_uniform: x * 2^-32 + 2^-33 in float, range (0, 1]. The product is exact (a power-of-two scale),
// so the result has a single rounding whether or not it is fused: the device uses one fused multiply-add
// (one instruction instead of two), the host the separate operations; both give the same bits.
GA_HD GA_INLINE float UniformFloat(std::uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(GA_U2F(x), kTwoPow32Inv, kTwoPow32Inv / 2.0f);
#else
  return GA_FADD(GA_FMUL(GA_U2F(x), kTwoPow32Inv), kTwoPow32Inv / 2.0f);
#endif
}

namespace philox_detail {

GA_HD GA_INLINE std::uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

GA_HD GA_INLINE float BitsFloat(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Natural logarithm for finite x > 0 (normal range; u >= 2^-33 here). x = m * 2^e with m in
// [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(s), s = (m - 1) / (m + 1), by its odd series to s^11
// (|s| < 0.1716, so the truncation error is below 2^-27 relative).
GA_HD GA_INLINE float Log(float x) {
  std::uint32_t bits = FloatBits(x);
  int e = static_cast<int>((bits >> 23) & 0xff) - 127;
  bits = (bits & 0x007fffffu) | 0x3f800000u;  // m in [1, 2)
  float m = BitsFloat(bits);
  if (m > 1.41421356f) {
    m = GA_FMUL(m, 0.5f);
    e += 1;
  }
  const float s = GA_FDIV(GA_FADD(m, -1.0f), GA_FADD(m, 1.0f));
  const float s2 = GA_FMUL(s, s);
  float p = 1.0f / 11.0f;
  p = GA_FADD(GA_FMUL(p, s2), 1.0f / 9.0f);
  p = GA_FADD(GA_FMUL(p, s2), 1.0f / 7.0f);
  p = GA_FADD(GA_FMUL(p, s2), 1.0f / 5.0f);
  p = GA_FADD(GA_FMUL(p, s2), 1.0f / 3.0f);
  // log(m) = 2s + 2s * s2 * p
  const float two_s = GA_FMUL(2.0f, s);
  const float log_m = GA_FADD(two_s, GA_FMUL(two_s, GA_FMUL(s2, p)));
  // e * ln2 split in two parts so the sum stays accurate for large |e|.
  const float fe = static_cast<float>(e);
  return GA_FADD(GA_FADD(GA_FMUL(fe, 0.693145752f), log_m), GA_FMUL(fe, 1.42860677e-06f));
}

// sin(x) and cos(x) for |x| <= pi/4 (Cephes sinf/cosf minimax polynomials).
GA_HD GA_INLINE float SinSmall(float x) {
  const float z = GA_FMUL(x, x);
  float p = -1.9515295891e-4f;
  p = GA_FADD(GA_FMUL(p, z), 8.3321608736e-3f);
  p = GA_FADD(GA_FMUL(p, z), -1.6666654611e-1f);
  return GA_FADD(x, GA_FMUL(GA_FMUL(x, z), p));
}
GA_HD GA_INLINE float CosSmall(float x) {
  const float z = GA_FMUL(x, x);
  float p = 2.443315711809948e-5f;
  p = GA_FADD(GA_FMUL(p, z), -1.388731625493765e-3f);
  p = GA_FADD(GA_FMUL(p, z), 4.166664568298827e-2f);
  return GA_FADD(GA_FADD(1.0f, GA_FMUL(-0.5f, z)), GA_FMUL(GA_FMUL(z, z), p));
}

}  // namespace philox_detail

struct FloatPair {
  float first = 0.0f;
  float second = 0.0f;
};

// Box-Muller as curand_normal / curand_normal4 lay it out: from words (a, b),
// u = UniformFloat(a) in (0, 1], t = UniformFloat(b) in (0, 1] (the angle in turns), r = sqrt(-2 log u);
// returns (r sin(2 pi t), r cos(2 pi t)). curand_normal4 returns (pair(w.x, w.y), pair(w.z, w.w)).
GA_HD GA_INLINE FloatPair NormalPair(std::uint32_t a, std::uint32_t b) {
  const float u = UniformFloat(a);
  const float r = GA_FSQRT(GA_FMUL(-2.0f, philox_detail::Log(u)));
  // Quadrant reduction in turns: t4 = 4t in (0, 4] is exact; q = nearest integer; f = t4 - q in
  // [-1/2, 1/2] is exact; the angle is 2 pi t = q * pi/2 + f * pi/2.
  const float t4 = GA_FMUL(UniformFloat(b), 4.0f);
  const float qf = static_cast<float>(static_cast<int>(GA_FADD(t4, 0.5f)));
  const int q = static_cast<int>(qf) & 3;
  const float x = GA_FMUL(GA_FADD(t4, -qf), 1.57079632679f);
  const float s = philox_detail::SinSmall(x);
  const float c = philox_detail::CosSmall(x);
  float sin_v, cos_v;
  switch (q) {
    case 0:
      sin_v = s;
      cos_v = c;
      break;
    case 1:
      sin_v = c;
      cos_v = -s;
      break;
    case 2:
      sin_v = -s;
      cos_v = -c;
      break;
    default:
      sin_v = -c;
      cos_v = s;
      break;
  }
  return FloatPair{GA_FMUL(r, sin_v), GA_FMUL(r, cos_v)};
}

// bfloat16 bits from a float, rounded to nearest, ties to even; NaN stays a (quiet) NaN.
GA_HD GA_INLINE std::uint16_t FloatToBFloat16(float f) {
  const std::uint32_t bits = philox_detail::FloatBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  const std::uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding_bias) >> 16);
}

GA_HD GA_INLINE float BFloat16ToFloat(std::uint16_t b) {
  return philox_detail::BitsFloat(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace graphalloc

#endif  // GRAPHALLOC_RNG_PHILOX_H_

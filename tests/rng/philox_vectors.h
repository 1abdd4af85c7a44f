// The published Philox4x32 known-answer vectors (Random123 tests/kat_vectors) and the curand stream vectors
// verified on an H100 (docs/rng.md, "Test vectors"), shared by the RNG tests.
#ifndef GRAPHALLOC_TESTS_RNG_PHILOX_VECTORS_H_
#define GRAPHALLOC_TESTS_RNG_PHILOX_VECTORS_H_

#include <array>
#include <cstdint>

#include "graphalloc/rng/philox.h"

namespace graphalloc::rng_test {

struct Kat {
  int rounds;
  PhiloxWords counter;
  PhiloxKey key;
  PhiloxWords expected;
};

// K1-K3: 10 rounds; K4, K5: 7 rounds (they catch a wrong round count).
inline constexpr std::array<Kat, 5> kKats = {{
    {10, {0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {10,
     {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {10,
     {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    {7, {0, 0, 0, 0}, {0, 0}, {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}},
    {7,
     {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}},
}};

struct StreamRow {
  std::uint64_t seed, subsequence, offset;
  std::array<std::uint32_t, 8> words;
};

// The first 8 curand() words after curand_init(seed, subsequence, offset).
inline constexpr std::array<StreamRow, 6> kStreamRows = {{
    {0,
     0,
     0,
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8, 0xf8e4cca4, 0x5cb200db, 0xb1a574eb, 0x097eff67}},
    {42,
     0,
     0,
     {0x9ceaf053, 0x77f5493b, 0x12bf50ad, 0x5742b3d7, 0xfcdb2127, 0x53ba6cfd, 0x838f5a6e, 0x744e06fb}},
    {42,
     1,
     0,
     {0x02933769, 0x2051e913, 0x3b68b038, 0xb62c409c, 0x20ff9139, 0xfdd21d94, 0x1b0af4ec, 0x39c6bd08}},
    {42,
     0,
     4,
     {0xfcdb2127, 0x53ba6cfd, 0x838f5a6e, 0x744e06fb, 0xd36c0225, 0xa8875dcb, 0x9a4d6d99, 0xc609a559}},
    {42,
     0,
     2,
     {0x12bf50ad, 0x5742b3d7, 0xfcdb2127, 0x53ba6cfd, 0x838f5a6e, 0x744e06fb, 0xd36c0225, 0xa8875dcb}},
    {0x123456789abcdef0ull,
     5,
     8,
     {0x63f6cee6, 0xe463b929, 0x5ed79d8f, 0xfecbfd85, 0x7e0c43b7, 0x3039e0a6, 0xaa531e5a, 0x3676c17e}},
}};

}  // namespace graphalloc::rng_test

#endif  // GRAPHALLOC_TESTS_RNG_PHILOX_VECTORS_H_

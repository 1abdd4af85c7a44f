// JsonWriter (allocator/snapshot/json_writer_internal.h), the writer under the snapshot JSON: numbers through
// std::to_chars read back exactly (doubles in their shortest form, the int64 and uint64 extremes), whatever
// the global locale; a snapshot with extreme values survives a JSON round trip unchanged.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <locale>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "graphalloc/allocator/snapshot/json_writer_internal.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "tests/snapshot/snapshot_fixture.h"

namespace graphalloc {
namespace {

using I64Limits = std::numeric_limits<std::int64_t>;
using U64Limits = std::numeric_limits<std::uint64_t>;
using DoubleLimits = std::numeric_limits<double>;

std::string Written(void (JsonWriter::*write)(double), double v) {
  std::string out;
  JsonWriter j(&out);
  (j.*write)(v);
  return out;
}

// Doubles that printf("%g") or a stream's default precision would not give back: near-ties, the smallest and
// largest of each kind, negative zero, integers past 2^53.
std::vector<double> HardDoubles() {
  std::vector<double> v = {0.1,
                           0.2,
                           0.30000000000000004,
                           1.0 / 3.0,
                           2.0 / 3.0,
                           3.141592653589793,
                           -2.718281828459045,
                           1e23,
                           8.41e21,
                           5e-324,
                           -5e-324,
                           DoubleLimits::min(),
                           DoubleLimits::max(),
                           -DoubleLimits::max(),
                           DoubleLimits::epsilon(),
                           9007199254740993.0,
                           18446744073709551616.0,
                           -9223372036854775808.0,
                           123456789.125,
                           1.7976931348623157e308,
                           2.2250738585072009e-308,
                           0.0,
                           -0.0};
  // Random bit patterns over the whole range (a fixed seed: the same values each run).
  std::mt19937_64 rng(18);
  while (v.size() < 20000) {
    const double d = std::bit_cast<double>(rng());
    if (std::isfinite(d)) v.push_back(d);
  }
  return v;
}

TEST(JsonWriterTest, IntegersAtTheirExtremesReadBackExactly) {
  std::string out;
  JsonWriter j(&out);
  j.Char('[');
  j.I64(I64Limits::min());
  j.Char(',');
  j.I64(I64Limits::max());
  j.Char(',');
  j.I64(-1);
  j.Char(',');
  j.I64(0);
  j.Char(',');
  j.U64(U64Limits::max());
  j.Char(',');
  j.U64(0);
  j.Char(']');
  EXPECT_EQ(out, "[-9223372036854775808,9223372036854775807,-1,0,18446744073709551615,0]");
  const nlohmann::json parsed = nlohmann::json::parse(out);
  EXPECT_EQ(parsed[0].get<std::int64_t>(), I64Limits::min());
  EXPECT_EQ(parsed[1].get<std::int64_t>(), I64Limits::max());
  EXPECT_EQ(parsed[4].get<std::uint64_t>(), U64Limits::max());
}

TEST(JsonWriterTest, DoublesReadBackBitForBit) {
  const std::vector<double> values = HardDoubles();
  std::string out;
  JsonWriter j(&out);
  j.Char('[');
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i != 0) j.Char(',');
    j.Double(values[i]);
  }
  j.Char(']');

  // As text, with std::from_chars.
  const std::vector<absl::string_view> texts =
      absl::StrSplit(absl::string_view(out).substr(1, out.size() - 2), ',');
  ASSERT_EQ(texts.size(), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    double back = 0;
    const auto [ptr, ec] = std::from_chars(texts[i].data(), texts[i].data() + texts[i].size(), back);
    ASSERT_EQ(ec, std::errc()) << texts[i];
    ASSERT_EQ(ptr, texts[i].data() + texts[i].size()) << texts[i];
    EXPECT_EQ(std::bit_cast<std::uint64_t>(back), std::bit_cast<std::uint64_t>(values[i]))
        << texts[i] << " is not " << values[i];
  }
  // As JSON, with the parser the snapshot reader uses.
  const nlohmann::json parsed = nlohmann::json::parse(out);
  ASSERT_EQ(parsed.size(), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint64_t>(parsed[i].get<double>()), std::bit_cast<std::uint64_t>(values[i]))
        << texts[i];
  }
}

TEST(JsonWriterTest, DoublesTakeTheirShortestForm) {
  EXPECT_EQ(Written(&JsonWriter::Double, 0.1), "0.1");
  EXPECT_EQ(Written(&JsonWriter::Double, 1.0), "1.0");
  EXPECT_EQ(Written(&JsonWriter::Double, -0.0), "-0.0");
  EXPECT_EQ(Written(&JsonWriter::Double, 1e20), "1e+20");
  EXPECT_EQ(Written(&JsonWriter::Double, 1e300), "1e+300");
  EXPECT_EQ(Written(&JsonWriter::Double, 5e-324), "5e-324");
  EXPECT_EQ(Written(&JsonWriter::Double, -DoubleLimits::max()), "-1.7976931348623157e+308");
}

TEST(JsonWriterTest, NonFiniteDoublesAreNull) {
  EXPECT_EQ(Written(&JsonWriter::Double, DoubleLimits::quiet_NaN()), "null");
  EXPECT_EQ(Written(&JsonWriter::Double, DoubleLimits::infinity()), "null");
  EXPECT_EQ(Written(&JsonWriter::Double, -DoubleLimits::infinity()), "null");
}

// A global locale whose decimal point is a comma and which groups thousands: a writer on streams would
// write "1.234,5"; std::to_chars never looks at it.
TEST(JsonWriterTest, TheGlobalLocaleChangesNothing) {
  struct Comma : std::numpunct<char> {
    char do_decimal_point() const override { return ','; }
    char do_thousands_sep() const override { return '.'; }
    std::string do_grouping() const override { return "\3"; }
  };
  const std::locale previous = std::locale::global(std::locale(std::locale::classic(), new Comma));
  std::string out;
  JsonWriter j(&out);
  j.Double(1234.5);
  j.Char(' ');
  j.I64(-1234567);
  j.Char(' ');
  j.U64(1234567);
  std::locale::global(previous);
  EXPECT_EQ(out, "1234.5 -1234567 1234567");
}

TEST(JsonWriterTest, StringsAreEscapedAndValidUtf8) {
  std::string out;
  JsonWriter j(&out);
  j.String("a\"b\\c\nd\te\x01 \xc3\xa9 \xff");
  EXPECT_EQ(out, "\"a\\\"b\\\\c\\nd\\te\\u0001 \xc3\xa9 \\ufffd\"");
  EXPECT_EQ(nlohmann::json::parse(out).get<std::string>(), "a\"b\\c\nd\te\x01 \xc3\xa9 \xef\xbf\xbd");
}

// The snapshot writer's numbers at their extremes: statistics at the int64 limits, addresses and sizes at
// the uint64 limit, a time before the epoch. (The reader rejects nothing of it: it checks no invariants.)
TEST(JsonWriterTest, SnapshotWithExtremeNumbersRoundTrips) {
  MemorySnapshot s = testing::MakeFixtureSnapshot();
  s.time_us = I64Limits::min();
  s.device.total_memory = U64Limits::max();
  s.stats.allocated_bytes.by_type[0].peak = I64Limits::max();
  s.stats.allocated_bytes.by_type[1].freed = I64Limits::min();
  s.stats.num_ooms = I64Limits::max();
  s.stats.max_split_size = -1;
  s.pools.front().peak_reserved_bytes = U64Limits::max();
  s.history.front().address = U64Limits::max();
  s.history.front().time_us = I64Limits::min();
  absl::StatusOr<MemorySnapshot> back = SnapshotFromJson(SnapshotToJson(s), "extremes.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->time_us, s.time_us);
  EXPECT_EQ(back->device, s.device);
  EXPECT_EQ(back->stats, s.stats);
  EXPECT_EQ(back->pools, s.pools);
  EXPECT_EQ(back->history, s.history);
  EXPECT_EQ(SnapshotToJson(*back), SnapshotToJson(s));
}

}  // namespace
}  // namespace graphalloc

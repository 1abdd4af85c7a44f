// Trace reading and writing: plain and gzip'd round trips through the writer, gzip detected by its magic
// bytes, and every error path with its exact message and line number.
#include "graphalloc/allocator/trace/trace_reader.h"

#include <zlib.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::string_view kExpectedActions =
    "expected one of alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, "
    "segment_unmap";

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "trace_reader_test_" + name; }

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Gzip of arbitrary bytes, independently of the writer under test.
std::string Gzip(absl::string_view data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, static_cast<uLong>(data.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// One event of every kind, with values that need all 64 bits, a second stream and a negative time.
Trace SampleTrace() {
  Trace trace;
  trace.name = "sample";
  const TraceAction actions[] = {TraceAction::kSegmentAlloc,  TraceAction::kAlloc,
                                 TraceAction::kSegmentMap,    TraceAction::kFreeRequested,
                                 TraceAction::kFreeCompleted, TraceAction::kSegmentUnmap,
                                 TraceAction::kSegmentFree};
  std::uint64_t i = 0;
  for (TraceAction action : actions) {
    TraceEvent e;
    e.action = action;
    e.addr = 140014054801408 + i * 512;
    e.size = (i == 1) ? 18446744073709551615ull : 20971520 + i;
    e.stream = (i % 2 == 0) ? 0 : 94812345678912;
    e.time_us = (i == 2) ? -5 : 1795224155661805 + static_cast<std::int64_t>(i);
    trace.events.push_back(e);
    ++i;
  }
  return trace;
}

// What reading SampleTrace() back from `path` should give: the file's base name and line numbers.
Trace ExpectedFromFile(const std::string& base_name) {
  Trace trace = SampleTrace();
  trace.name = base_name;
  for (std::size_t i = 0; i < trace.events.size(); ++i)
    trace.events[i].line = static_cast<std::uint32_t>(i + 2);
  return trace;
}

void ExpectSameTrace(const Trace& got, const Trace& want) {
  EXPECT_EQ(got.name, want.name);
  ASSERT_EQ(got.events.size(), want.events.size());
  for (std::size_t i = 0; i < got.events.size(); ++i)
    EXPECT_EQ(got.events[i], want.events[i]) << "event " << i;
}

TEST(TraceActionTest, NamesRoundTrip) {
  for (absl::string_view name : {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                                 "segment_map", "segment_unmap"}) {
    std::optional<TraceAction> action = ParseTraceAction(name);
    ASSERT_TRUE(action.has_value()) << name;
    EXPECT_EQ(HistoryActionName(*action), name);
  }
  EXPECT_FALSE(ParseTraceAction("alloc2").has_value());
  // History events only: never a trace row.
  EXPECT_FALSE(ParseTraceAction("oom").has_value());
  EXPECT_FALSE(ParseTraceAction("snapshot").has_value());
  EXPECT_FALSE(ParseTraceAction("sleep").has_value());
  EXPECT_FALSE(ParseTraceAction("wake").has_value());
  EXPECT_FALSE(IsTraceAction(HistoryAction::kSleep));
  EXPECT_FALSE(IsTraceAction(HistoryAction::kWake));
  EXPECT_FALSE(ParseTraceAction("").has_value());
}

// A history with a pool's sleep and wake in it gives the trace of its allocations alone: a replay does not
// sleep pools, and its blocks stay allocated throughout a sleep.
TEST(TraceActionTest, TraceFromHistoryLeavesSleepAndWakeOut) {
  MemorySnapshot s;
  s.history_max_entries = 10;
  s.history = {{HistoryAction::kSegmentMap, 0x7f0000000000, 2 << 20, 0, 0, 10, {}, ""},
               {HistoryAction::kAlloc, 0x7f0000000000, 4096, 0, 0, 11, {}, ""},
               {HistoryAction::kSleep, 0x7f0000000000, 2 << 20, 0, 0, 12, {}, ""},
               {HistoryAction::kWake, 0x7f0000000000, 2 << 20, 0, 0, 13, {}, ""},
               {HistoryAction::kFreeCompleted, 0x7f0000000000, 4096, 0, 0, 14, {}, ""}};
  absl::StatusOr<Trace> trace = TraceFromHistory(s, "dir/slept.json");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->name, "slept.json");
  EXPECT_EQ(trace->events,
            (std::vector<TraceEvent>{{0x7f0000000000, 2 << 20, 0, 10, 0, TraceAction::kSegmentMap},
                                     {0x7f0000000000, 4096, 0, 11, 0, TraceAction::kAlloc},
                                     {0x7f0000000000, 4096, 0, 14, 0, TraceAction::kFreeCompleted}}));
}

TEST(TraceReaderTest, PlainRoundTrip) {
  const std::string path = TempPath("plain.csv");
  ASSERT_TRUE(WriteTrace(SampleTrace(), path, /*gzip=*/false).ok());
  const std::string bytes = ReadBytes(path);
  EXPECT_THAT(bytes,
              StartsWith("action,addr,size,stream,time_us\nsegment_alloc,140014054801408,20971520,0,"
                         "1795224155661805\nalloc,140014054801920,18446744073709551615,94812345678912,"));
  absl::StatusOr<Trace> read = ReadTrace(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameTrace(*read, ExpectedFromFile("trace_reader_test_plain.csv"));
}

TEST(TraceReaderTest, GzipRoundTrip) {
  const std::string path = TempPath("zipped.csv.gz");
  ASSERT_TRUE(WriteTrace(SampleTrace(), path, /*gzip=*/true).ok());
  const std::string bytes = ReadBytes(path);
  ASSERT_GE(bytes.size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]), 0x1f);
  EXPECT_EQ(static_cast<unsigned char>(bytes[1]), 0x8b);
  absl::StatusOr<Trace> read = ReadTrace(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameTrace(*read, ExpectedFromFile("trace_reader_test_zipped.csv.gz"));
}

TEST(TraceReaderTest, LargeGzipRoundTripGrowsTheOutputBuffer) {
  Trace trace;
  trace.name = "large";
  for (std::uint64_t i = 0; i < 200000; ++i) {
    trace.events.push_back(
        TraceEvent{.addr = 4096 * (i % 1000),
                   .size = 512,
                   .stream = 0,
                   .time_us = static_cast<std::int64_t>(i),
                   .action = i % 2 == 0 ? TraceAction::kAlloc : TraceAction::kFreeCompleted});
  }
  const std::string path = TempPath("large.csv.gz");
  ASSERT_TRUE(WriteTrace(trace, path, /*gzip=*/true).ok());
  EXPECT_LT(ReadBytes(path).size() * 8, FormatTraceCsv(trace).size());  // compresses well: buffer must grow
  absl::StatusOr<Trace> read = ReadTrace(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->events.size(), trace.events.size());
  EXPECT_EQ(read->events.back().time_us, 199999);
  EXPECT_EQ(read->events.back().line, 200001u);
}

TEST(TraceReaderTest, GzipIsDetectedByMagicBytesNotByName) {
  const std::string zipped_as_csv = TempPath("really_gzip.csv");
  const std::string plain_as_gz = TempPath("really_plain.gz");
  ASSERT_TRUE(WriteTrace(SampleTrace(), zipped_as_csv, /*gzip=*/true).ok());
  ASSERT_TRUE(WriteTrace(SampleTrace(), plain_as_gz, /*gzip=*/false).ok());
  absl::StatusOr<Trace> a = ReadTrace(zipped_as_csv);
  absl::StatusOr<Trace> b = ReadTrace(plain_as_gz);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->events, b->events);
  EXPECT_EQ(a->events.size(), 7u);
}

TEST(TraceReaderTest, FormatThenParseGivesTheSameEvents) {
  absl::StatusOr<Trace> parsed = ParseTrace(FormatTraceCsv(SampleTrace()), "dir/sub/x.csv");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectSameTrace(*parsed, ExpectedFromFile("x.csv"));
}

TEST(TraceReaderTest, HeaderOnlyIsAnEmptyTrace) {
  absl::StatusOr<Trace> t = ParseTrace("action,addr,size,stream,time_us\n", "t.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->events.empty());
  t = ParseTrace("action,addr,size,stream,time_us", "t.csv");  // no final newline
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->events.empty());
}

TEST(TraceReaderTest, CrlfAndBlankLinesAreAcceptedAndLinesStayExact) {
  absl::StatusOr<Trace> t = ParseTrace(
      "action,addr,size,stream,time_us\r\nalloc,4096,512,0,1\r\n\r\nfree_completed,4096,512,0,2\r\n\n",
      "t.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->events.size(), 2u);
  EXPECT_EQ(t->events[0].line, 2u);
  EXPECT_EQ(t->events[1].line, 4u);
  EXPECT_EQ(t->events[1].action, TraceAction::kFreeCompleted);
  EXPECT_EQ(t->Where(1), "t.csv:4");
}

TEST(TraceReaderTest, WhereWithoutLineNumbersNamesTheEventIndex) {
  Trace trace = SampleTrace();
  EXPECT_EQ(trace.Where(3), "sample, event 3");
}

struct ParseErrorCase {
  const char* label;
  const char* csv;
  std::string message;
};

class TraceParseErrorTest : public ::testing::TestWithParam<ParseErrorCase> {};

TEST_P(TraceParseErrorTest, ExactMessage) {
  absl::StatusOr<Trace> t = ParseTrace(GetParam().csv, "trace.csv");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), GetParam().message);
}

const char kHeader[] = "action,addr,size,stream,time_us\n";

INSTANTIATE_TEST_SUITE_P(
    AllErrors, TraceParseErrorTest,
    ::testing::Values(
        ParseErrorCase{"Empty", "",
                       "trace.csv: empty trace; expected the header 'action,addr,size,stream,time_us'"},
        ParseErrorCase{"MissingHeader", "alloc,4096,512,0,1\n",
                       "trace.csv:1: missing header; expected 'action,addr,size,stream,time_us', found "
                       "'alloc,4096,512,0,1'"},
        ParseErrorCase{"WrongHeader", "action,addr,size\n",
                       "trace.csv:1: missing header; expected 'action,addr,size,stream,time_us', found "
                       "'action,addr,size'"},
        ParseErrorCase{"BinaryHeader", "\x01\x02garbage\n",
                       "trace.csv:1: missing header; expected 'action,addr,size,stream,time_us', found "
                       "'??garbage'"},
        ParseErrorCase{"UnknownAction",
                       "action,addr,size,stream,time_us\nalloc,1,2,0,3\nalloc2,4096,512,0,1\n",
                       absl::StrCat("trace.csv:3: unknown action 'alloc2'; ", kExpectedActions)},
        ParseErrorCase{"TooFewFields", "action,addr,size,stream,time_us\nalloc,4096,512,0\n",
                       "trace.csv:2: expected 5 fields (action,addr,size,stream,time_us), found 4"},
        ParseErrorCase{"TooManyFields", "action,addr,size,stream,time_us\nalloc,4096,512,0,1,9\n",
                       "trace.csv:2: expected 5 fields (action,addr,size,stream,time_us), found 6"},
        ParseErrorCase{"NonNumericAddr", "action,addr,size,stream,time_us\nalloc,0x1000,512,0,1\n",
                       "trace.csv:2: field 'addr' is not a non-negative integer: '0x1000'"},
        ParseErrorCase{"NonNumericSize", "action,addr,size,stream,time_us\nalloc,4096,12x,0,1\n",
                       "trace.csv:2: field 'size' is not a non-negative integer: '12x'"},
        ParseErrorCase{"NegativeSize", "action,addr,size,stream,time_us\nalloc,4096,-512,0,1\n",
                       "trace.csv:2: field 'size' is not a non-negative integer: '-512'"},
        ParseErrorCase{"EmptyStream", "action,addr,size,stream,time_us\nalloc,4096,512,,1\n",
                       "trace.csv:2: field 'stream' is not a non-negative integer: ''"},
        ParseErrorCase{"SizeOverflow",
                       "action,addr,size,stream,time_us\nalloc,4096,18446744073709551616,0,1\n",
                       "trace.csv:2: field 'size' is not a non-negative integer: '18446744073709551616'"},
        ParseErrorCase{"FractionalTime", "action,addr,size,stream,time_us\nalloc,4096,512,0,1.5\n",
                       "trace.csv:2: field 'time_us' is not an integer: '1.5'"},
        ParseErrorCase{"SpaceInField", "action,addr,size,stream,time_us\nalloc, 4096,512,0,1\n",
                       "trace.csv:2: field 'addr' is not a non-negative integer: ' 4096'"}),
    [](const ::testing::TestParamInfo<ParseErrorCase>& info) { return std::string(info.param.label); });

TEST(TraceReaderTest, NegativeTimeIsAccepted) {
  absl::StatusOr<Trace> t = ParseTrace(std::string(kHeader) + "alloc,4096,512,0,-7\n", "t.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->events[0].time_us, -7);
}

TEST(TraceReaderTest, MissingFileIsNotFound) {
  const std::string path = TempPath("does_not_exist.csv.gz");
  absl::StatusOr<Trace> t = ReadTrace(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.status().message(), path + ": cannot open the trace: No such file or directory");
}

TEST(TraceReaderTest, TruncatedGzipIsDataLoss) {
  const std::string path = TempPath("truncated.csv.gz");
  ASSERT_TRUE(WriteTrace(SampleTrace(), path, /*gzip=*/true).ok());
  const std::string full = ReadBytes(path);
  // In the middle of the compressed data, and inside the 8-byte trailer (CRC and length).
  for (std::size_t keep : {full.size() / 2, full.size() - 3}) {
    WriteBytes(path, absl::string_view(full).substr(0, keep));
    absl::StatusOr<Trace> t = ReadTrace(path);
    ASSERT_FALSE(t.ok()) << "kept " << keep;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(t.status().message(), absl::StrCat(path, ": truncated gzip file (ends after ", keep,
                                                 " bytes, in the middle of the compressed stream)"));
  }
  WriteBytes(path, absl::string_view(full).substr(0, 2));  // the magic bytes and nothing else
  absl::StatusOr<Trace> t = ReadTrace(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss);
}

TEST(TraceReaderTest, CorruptGzipIsDataLoss) {
  const std::string path = TempPath("corrupt.csv.gz");
  ASSERT_TRUE(WriteTrace(SampleTrace(), path, /*gzip=*/true).ok());
  std::string bytes = ReadBytes(path);
  bytes[bytes.size() - 6] ^= 0x55;  // the stored CRC no longer matches
  WriteBytes(path, bytes);
  absl::StatusOr<Trace> t = ReadTrace(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(t.status().message(), path + ": corrupt gzip data: incorrect data check (code -3)");
}

TEST(TraceReaderTest, GzipMembersConcatenateAndTrailingGarbageIsAnError) {
  Trace part;
  part.events.push_back(TraceEvent{.addr = 1, .size = 2, .stream = 0, .time_us = 3});
  const std::string a = TempPath("member.gz");
  ASSERT_TRUE(WriteTrace(part, a, /*gzip=*/true).ok());
  const std::string member = ReadBytes(a);
  const std::string csv = FormatTraceCsv(part);

  absl::StatusOr<std::string> two = GunzipBytes(member + member, "m");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, csv + csv);

  absl::StatusOr<std::string> garbage = GunzipBytes(member + "xyz", "m");
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().message(), "m: 3 bytes of trailing garbage after the gzip stream");
}

TEST(TraceReaderTest, BadCsvInsideGzipNamesTheFileAndLine) {
  std::string csv = FormatTraceCsv(SampleTrace());
  const std::size_t at = csv.find("segment_map");
  ASSERT_NE(at, std::string::npos);
  csv.replace(at, std::string("segment_map").size(), "segment_mop");
  const std::string path = TempPath("bad_inside.csv.gz");
  WriteBytes(path, Gzip(csv));
  absl::StatusOr<Trace> t = ReadTrace(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), absl::StrCat(path, ":4: unknown action 'segment_mop'; ", kExpectedActions));
}

TEST(TraceReaderTest, WriteToAMissingDirectoryFails) {
  absl::Status s = WriteTrace(SampleTrace(), TempPath("no/such/dir/x.csv"), false);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot create the file"));
}

}  // namespace
}  // namespace graphalloc

// The JSON snapshot format: round trips with every field, and errors (with their locations) for corrupt,
// truncated, wrong-version and mistyped input.
#include "graphalloc/allocator/snapshot/snapshot_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_replace.h"
#include "tests/snapshot/snapshot_fixture.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;
using testing::MakeFixtureSnapshot;
using testing::MakeSleepingSnapshot;

TEST(SnapshotJsonTest, RoundTripKeepsEveryField) {
  const MemorySnapshot s = MakeFixtureSnapshot();
  const std::string json = SnapshotToJson(s);
  absl::StatusOr<MemorySnapshot> back = SnapshotFromJson(json, "fixture.json");
  ASSERT_TRUE(back.ok()) << back.status();
  // Field by field first, for readable failures; then the whole.
  EXPECT_EQ(back->format_version, kSnapshotFormatVersion);
  EXPECT_EQ(back->label, "end");
  EXPECT_EQ(back->source, "graphalloc");
  EXPECT_EQ(back->time_us, s.time_us);
  EXPECT_EQ(back->device, s.device);
  EXPECT_EQ(back->config, s.config);
  EXPECT_EQ(back->stats, s.stats);
  EXPECT_EQ(back->pools, s.pools);
  ASSERT_EQ(back->segments.size(), s.segments.size());
  for (std::size_t i = 0; i < s.segments.size(); ++i) {
    const SegmentSnapshot &x = s.segments[i], &y = back->segments[i];
    EXPECT_EQ(y.address, x.address);
    EXPECT_EQ(y.total_size, x.total_size);
    EXPECT_EQ(y.stream, x.stream);
    EXPECT_EQ(y.pool_id, x.pool_id);
    EXPECT_EQ(y.kind, x.kind);
    EXPECT_EQ(y.expandable, x.expandable);
    EXPECT_EQ(y.mapped, x.mapped);
    EXPECT_EQ(y.frames, x.frames);
    ASSERT_EQ(y.blocks.size(), x.blocks.size());
    for (std::size_t j = 0; j < x.blocks.size(); ++j) EXPECT_EQ(y.blocks[j], x.blocks[j]) << i << "/" << j;
  }
  ASSERT_EQ(back->history.size(), s.history.size());
  for (std::size_t i = 0; i < s.history.size(); ++i) EXPECT_EQ(back->history[i], s.history[i]) << i;
  EXPECT_TRUE(back->history_overflowed);
  EXPECT_EQ(back->history_max_entries, 12u);
  EXPECT_EQ(*back, s);
  // Writing what was read gives the same bytes.
  EXPECT_EQ(SnapshotToJson(*back), json);
}

// The number of times `needle` occurs in `text`.
int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(SnapshotJsonTest, SleepAndWakeEventsAreWrittenByNameAndReadBack) {
  const MemorySnapshot s = MakeSleepingSnapshot();
  const std::string json = SnapshotToJson(s);
  EXPECT_EQ(Count(json, "{\"action\":\"sleep\",\"address\":"), 4);
  EXPECT_EQ(Count(json, "{\"action\":\"wake\",\"address\":"), 2);
  EXPECT_EQ(Count(json, "{\"action\":\"segment_unmap\""), 0);
  absl::StatusOr<MemorySnapshot> back = SnapshotFromJson(json, "asleep.json");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->history.size(), 12u);
  EXPECT_EQ(back->history[4].action, HistoryAction::kSleep);
  EXPECT_EQ(back->history[4].address, testing::kSleepingBase);
  EXPECT_EQ(back->history[4].size, 2u << 20);
  EXPECT_EQ(back->history[7].action, HistoryAction::kWake);
  EXPECT_EQ(back->history[7].address, testing::kSleepingBase + (2u << 20));
  EXPECT_EQ(back->history[7].size, 4u << 20);
  EXPECT_EQ(*back, s);
  EXPECT_EQ(SnapshotToJson(*back), json);
}

TEST(SnapshotJsonTest, StacksAreStoredOnce) {
  const std::string json = SnapshotToJson(MakeFixtureSnapshot());
  // "forward" is the stack of two blocks and one event, "make_segment" of a segment and an event.
  std::size_t count = 0;
  for (std::size_t at = json.find("\"forward\""); at != std::string::npos;
       at = json.find("\"forward\"", at + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 1u);
  EXPECT_THAT(json, HasSubstr("\"format\":\"graphalloc-snapshot\",\"version\":1"));
}

TEST(SnapshotJsonTest, EmptySnapshotRoundTrips) {
  MemorySnapshot empty;
  absl::StatusOr<MemorySnapshot> back = SnapshotFromJson(SnapshotToJson(empty));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, empty);
}

TEST(SnapshotJsonTest, InvalidUtf8IsRepairedAndControlCharactersEscaped) {
  MemorySnapshot s = MakeFixtureSnapshot();
  s.segments[0].blocks[0].annotation = std::string("bad \xff byte, tab\t, nul ") + '\0' + " end";
  absl::StatusOr<MemorySnapshot> back = SnapshotFromJson(SnapshotToJson(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->segments[0].blocks[0].annotation,
            std::string("bad \xEF\xBF\xBD byte, tab\t, nul ") + '\0' + " end");
}

TEST(SnapshotJsonTest, LargeHistoryRoundTrips) {
  MemorySnapshot s;
  s.history_max_entries = 50000;
  for (int i = 0; i < 50000; ++i) {
    s.history.push_back({static_cast<HistoryAction>(i % kNumHistoryActions), 0x1000u + i, 512u * i,
                         static_cast<std::uint64_t>(i % 3), static_cast<std::uint64_t>(i % 2), 1000 + i,
                         i % 100 == 0 ? std::vector<Frame>{{"f", "g.cc", i}} : std::vector<Frame>{},
                         i % 7 == 0 ? "seven" : ""});
  }
  absl::StatusOr<MemorySnapshot> back = SnapshotFromJson(SnapshotToJson(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
}

// The message of reading `json` as "f.json", which must fail with InvalidArgument.
std::string ErrorOf(const std::string& json) {
  absl::StatusOr<MemorySnapshot> s = SnapshotFromJson(json, "f.json");
  EXPECT_FALSE(s.ok());
  if (s.ok()) return "";
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  return std::string(s.status().message());
}

TEST(SnapshotJsonTest, TruncatedFileNamesTheByteOffset) {
  const std::string json = SnapshotToJson(MakeFixtureSnapshot());
  for (std::size_t cut :
       {std::size_t{0}, std::size_t{1}, json.size() / 3, json.size() / 2, json.size() - 3}) {
    const std::string message = ErrorOf(json.substr(0, cut));
    EXPECT_THAT(message, HasSubstr("f.json: not valid JSON at byte ")) << cut;
    EXPECT_THAT(message, HasSubstr("(truncated?)")) << cut;
  }
}

TEST(SnapshotJsonTest, CorruptFileNamesLineAndColumn) {
  std::string json = SnapshotToJson(MakeFixtureSnapshot());
  json[json.find("\"segments\"") + 12] = '#';
  const std::string message = ErrorOf(json);
  EXPECT_THAT(message, HasSubstr("not valid JSON at byte "));
  EXPECT_THAT(message, HasSubstr("line "));
  EXPECT_THAT(message, HasSubstr("column "));
  EXPECT_THAT(ErrorOf(std::string("\x89PNG\r\n\x1a\n", 8)), HasSubstr("not valid JSON at byte "));
}

TEST(SnapshotJsonTest, WrongFormatOrVersion) {
  const std::string json = SnapshotToJson(MakeFixtureSnapshot());
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"version\":1", "\"version\":2"}})),
              HasSubstr("f.json: version: snapshot format version 2 is not supported; this graphalloc reads "
                        "version 1"));
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"version\":1", "\"version\":\"1\""}})),
              HasSubstr("version: expected an integer, found string"));
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"graphalloc-snapshot", "something-else"}})),
              HasSubstr("format: not a graphalloc snapshot"));
  EXPECT_THAT(ErrorOf("[1, 2, 3]"), HasSubstr("(top level): expected a JSON object, found array"));
  EXPECT_THAT(ErrorOf("{}"), HasSubstr("(the field is missing)"));
  // A wrong version wins over errors further in, also in the streamed history.
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(
                  json, {{"\"version\":1", "\"version\":9"}, {"\"action\":\"oom\"", "\"action\":7"}})),
              HasSubstr("version 9 is not supported"));
}

TEST(SnapshotJsonTest, BadFieldsNameTheirJsonPath) {
  const std::string json = SnapshotToJson(MakeFixtureSnapshot());
  // Segment 2's second block is the only block of 3 MiB.
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"size\":3145728", "\"size\":\"big\""}})),
              HasSubstr("f.json: segments[2].blocks[1].size: expected a non-negative integer, found string"));
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"size\":3145728,", ""}})),
              HasSubstr("segments[2].blocks[1]: missing field 'size'"));
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"state\":\"pending_free\"", "\"state\":\"gone\""}})),
              HasSubstr("segments[0].blocks[1].state: unknown state 'gone'"));
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"kind\":\"small\"", "\"kind\":\"tiny\""}})),
              HasSubstr("segments[1].kind: unknown kind 'tiny'"));
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"action\":\"oom\"", "\"action\":\"boom\""}})),
              HasSubstr("history.events[13].action: unknown action 'boom'"));
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"time_us\":1699999999999009", "\"time_us\":-1.5"}})),
              HasSubstr("history.events[12].time_us: expected an integer, found number"));
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"stack\":0", "\"stack\":99"}})),
              HasSubstr(".stack: stack 99 does not exist; the file has 5 stacks"));
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"num_ooms\":1", "\"num_ooms\":true"}})),
              HasSubstr("stats.num_ooms: expected an integer, found boolean"));
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"pools\":[", "\"pools\":[7,"}})),
              HasSubstr("pools[0]: expected an object, found number"));
  EXPECT_THAT(ErrorOf(absl::StrReplaceAll(json, {{"\"events\":[", "\"events\":[5,"}})),
              HasSubstr("history.events"));
}

TEST(SnapshotJsonTest, InvariantViolationsNameThePath) {
  std::string json = SnapshotToJson(MakeFixtureSnapshot());
  // Make segment 0's third block 1 byte shorter: the fourth then does not start where it ends.
  json = absl::StrReplaceAll(
      json, {{"\"size\":524288,\"requested_size\":0", "\"size\":524287,\"requested_size\":0"}});
  EXPECT_THAT(ErrorOf(json), HasSubstr("f.json: segments[0].blocks[3].address: block at 0x7f0000200000 where "
                                       "0x7f00001fffff was expected"));
}

TEST(SnapshotJsonTest, FilesReadAndWrite) {
  const std::string dir = testing::TestDir();
  const MemorySnapshot s = MakeFixtureSnapshot();
  ASSERT_TRUE(WriteSnapshotFile(s, dir + "/s.json").ok());
  absl::StatusOr<MemorySnapshot> back = ReadSnapshotFile(dir + "/s.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
  absl::StatusOr<MemorySnapshot> missing = ReadSnapshotFile(dir + "/missing.json");
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("missing.json: cannot open"));
  EXPECT_FALSE(WriteSnapshotFile(s, dir + "/no/such/dir/s.json").ok());
}

}  // namespace
}  // namespace graphalloc

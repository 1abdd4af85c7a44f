// The views behind `graphalloc snapshot`: the SVG is well-formed XML with one block rect per block, the HTML
// is self-contained, the summary's numbers are the fixture's, the segment map lists every block, the diff
// sees what changed, and the timeline is anchored at the snapshot's totals with the right peak.
#include "tools/snapshot/snapshot_views.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/snapshot/snapshot_fixture.h"

namespace graphalloc::tools {
namespace {

using graphalloc::testing::kFixtureBlocks;
using graphalloc::testing::MakeFixtureSnapshot;
using graphalloc::testing::MakeSleepingSnapshot;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::uint64_t kMiB = 1 << 20;

// A small XML well-formedness check: tags nest and match, attributes are quoted and unique, entities are
// the five predefined ones or numeric references, no '<' or bare '&' in text. Counts each element name and
// the rects whose class is "block".
struct XmlReport {
  std::string error;  // empty when well-formed
  std::map<std::string, int> elements;
  int block_rects = 0;
};

XmlReport CheckXml(const std::string& x) {
  XmlReport r;
  std::vector<std::string> open;
  std::size_t i = 0;
  auto fail = [&](const std::string& what) {
    r.error = what + " at byte " + std::to_string(i);
    return r;
  };
  auto check_entities = [&](std::string_view text) {
    for (std::size_t k = 0; k < text.size(); ++k) {
      if (text[k] == '<') return false;
      if (text[k] != '&') continue;
      const std::size_t semi = text.find(';', k);
      if (semi == std::string_view::npos) return false;
      const std::string_view name = text.substr(k + 1, semi - k - 1);
      if (name != "amp" && name != "lt" && name != "gt" && name != "quot" && name != "apos" &&
          !(name.size() > 1 && name[0] == '#')) {
        return false;
      }
    }
    return true;
  };
  bool root_seen = false;
  while (i < x.size()) {
    if (x[i] != '<') {
      const std::size_t next = x.find('<', i);
      const std::string_view text(x.data() + i, (next == std::string::npos ? x.size() : next) - i);
      if (!check_entities(text)) return fail("bad text");
      if (open.empty() && text.find_first_not_of(" \n\r\t") != std::string_view::npos)
        return fail("text outside root");
      i = next == std::string::npos ? x.size() : next;
      continue;
    }
    if (x.compare(i, 5, "<?xml") == 0) {
      const std::size_t end = x.find("?>", i);
      if (end == std::string::npos || i != 0) return fail("bad declaration");
      i = end + 2;
      continue;
    }
    if (x.compare(i, 4, "<!--") == 0) {
      const std::size_t end = x.find("-->", i);
      if (end == std::string::npos) return fail("unterminated comment");
      i = end + 3;
      continue;
    }
    const std::size_t end = x.find('>', i);
    if (end == std::string::npos) return fail("unterminated tag");
    std::string tag = x.substr(i + 1, end - i - 1);
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return fail("mismatched </" + name + ">");
      open.pop_back();
      i = end + 1;
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    if (self_closing) tag.pop_back();
    std::size_t k = 0;
    while (k < tag.size() && tag[k] != ' ' && tag[k] != '\n') ++k;
    const std::string name = tag.substr(0, k);
    if (name.empty()) return fail("empty tag name");
    if (open.empty() && root_seen) return fail("second root element");
    root_seen = true;
    // Attributes: name="value" ...
    std::map<std::string, std::string> attrs;
    while (k < tag.size()) {
      while (k < tag.size() && (tag[k] == ' ' || tag[k] == '\n')) ++k;
      if (k >= tag.size()) break;
      const std::size_t eq = tag.find('=', k);
      if (eq == std::string::npos || eq + 1 >= tag.size() || tag[eq + 1] != '"')
        return fail("unquoted attribute");
      const std::size_t close = tag.find('"', eq + 2);
      if (close == std::string::npos) return fail("unterminated attribute");
      const std::string attr = tag.substr(k, eq - k), value = tag.substr(eq + 2, close - eq - 2);
      if (!check_entities(value)) return fail("bad attribute value");
      if (!attrs.emplace(attr, value).second) return fail("duplicate attribute " + attr);
      k = close + 1;
    }
    ++r.elements[name];
    if (name == "rect" && attrs["class"] == "block") ++r.block_rects;
    if (!self_closing) open.push_back(name);
    i = end + 1;
  }
  if (!open.empty()) return fail("unclosed <" + open.back() + ">");
  if (!root_seen) return fail("no root element");
  return r;
}

TEST(SnapshotViewsTest, SummaryWithoutStacksSaysSoOnce) {
  MemorySnapshot s = MakeFixtureSnapshot();
  for (SegmentSnapshot& seg : s.segments) {
    for (BlockSnapshot& b : seg.blocks) b.frames.clear();
  }
  const std::string text = RenderSummaryText(s, "fixture.json", 5);
  EXPECT_THAT(text, Not(HasSubstr("(no stack)")));
  EXPECT_THAT(text, HasSubstr("  none: no stacks recorded (history_stacks:True records them)\n"));
}

TEST(SnapshotViewsTest, BriefSummaryKeepsTotalsAndTopAllocations) {
  MemorySnapshot s = MakeFixtureSnapshot();
  s.config = "expandable_segments:False,record_history:True,history_max_entries:100000";
  const std::string text = RenderSummaryText(s, "fixture.json", 2, /*brief=*/true);
  EXPECT_THAT(text, HasSubstr("Config:        defaults but expandable_segments:False,record_history:True\n"));
  EXPECT_THAT(text, HasSubstr("reserved          10.00 MiB (10485760 bytes) in 3 segments"));
  EXPECT_THAT(text, HasSubstr("Top allocations by size\n"));
  EXPECT_THAT(text, HasSubstr("   2. "));
  EXPECT_THAT(text, Not(HasSubstr("   3. ")));
  EXPECT_THAT(text, Not(HasSubstr("Statistics")));
  EXPECT_THAT(text, Not(HasSubstr("Streams")));
  EXPECT_THAT(text, HasSubstr("History:       15 events"));
}

TEST(SnapshotViewsTest, XmlCheckerRejectsBadXml) {
  EXPECT_EQ(CheckXml("<a><b/></a>").error, "");
  EXPECT_NE(CheckXml("<a><b></a>").error, "");
  EXPECT_NE(CheckXml("<a x=1/>").error, "");
  EXPECT_NE(CheckXml("<a>&nbsp;</a>").error, "");
  EXPECT_NE(CheckXml("<a>1 < 2</a>").error, "");
  EXPECT_NE(CheckXml("<a/><b/>").error, "");
  EXPECT_NE(CheckXml("<a x=\"1\" x=\"2\"/>").error, "");
}

TEST(SnapshotViewsTest, SvgIsWellFormedWithOneRectPerBlock) {
  const MemorySnapshot s = MakeFixtureSnapshot();
  const std::string svg = RenderSvg(s, "fixture <end> & \"more\"");
  const XmlReport r = CheckXml(svg);
  ASSERT_EQ(r.error, "") << svg.substr(0, 2000);
  EXPECT_EQ(r.elements.at("svg"), 1);
  EXPECT_EQ(r.block_rects, kFixtureBlocks);
  EXPECT_EQ(r.elements.at("polyline"), 2);  // allocated and reserved over time
  EXPECT_EQ(r.elements.at("circle"), 1);    // the peak
  EXPECT_THAT(svg, HasSubstr("data-state=\"pending_free\""));
  EXPECT_THAT(svg, HasSubstr("data-pool=\"5\""));
  EXPECT_THAT(svg, HasSubstr("step 1 &lt;fwd&gt; &amp; &quot;x&quot;"));  // the annotation, escaped

  MemorySnapshot no_history = s;
  no_history.history.clear();
  const XmlReport r2 = CheckXml(RenderSvg(no_history, "x"));
  ASSERT_EQ(r2.error, "");
  EXPECT_EQ(r2.block_rects, kFixtureBlocks);
  EXPECT_FALSE(r2.elements.contains("polyline"));

  const XmlReport empty = CheckXml(RenderSvg(MemorySnapshot{}, "empty"));
  EXPECT_EQ(empty.error, "");
  EXPECT_EQ(empty.block_rects, 0);
}

TEST(SnapshotViewsTest, HtmlIsSelfContained) {
  const std::string html = RenderHtml(MakeFixtureSnapshot(), "fixture </script>");
  EXPECT_THAT(html, HasSubstr("<!DOCTYPE html>"));
  EXPECT_THAT(html, HasSubstr("<script>"));
  EXPECT_THAT(html, Not(HasSubstr("src=")));
  EXPECT_THAT(html, Not(HasSubstr("href=")));
  EXPECT_THAT(html, Not(HasSubstr("http://")));
  EXPECT_THAT(html, Not(HasSubstr("https://")));
  EXPECT_THAT(html, Not(HasSubstr("GRAPHALLOC_SNAPSHOT_JSON")));  // the data marker was replaced
  // The embedded data: one JSON object, strings escaped so nothing in them can close the script element.
  const std::string open = "<script type=\"application/json\" id=\"graphalloc-data\">";
  const std::size_t from = html.find(open) + open.size();
  const std::size_t to = html.find("</script>", from);
  ASSERT_NE(to, std::string::npos);
  const nlohmann::json data = nlohmann::json::parse(html.substr(from, to - from));
  EXPECT_EQ(data["title"], "fixture </script>");
  ASSERT_EQ(data["segments"].size(), 3u);
  // Addresses are relative to the base (a hex string), so that JavaScript's doubles hold them exactly.
  EXPECT_EQ(data["segments"][1]["a"].get<std::int64_t>() - data["segments"][0]["a"].get<std::int64_t>(),
            0x400000);
  EXPECT_EQ(data["segments"][0]["b"].size(), 5u * 6u);  // 5 blocks, 6 numbers each
  EXPECT_EQ(data["events"]["act"].size(), MakeFixtureSnapshot().history.size());
  EXPECT_EQ(data["events"]["addr"].size(), MakeFixtureSnapshot().history.size());
}

TEST(SnapshotViewsTest, SummaryNumbersAreTheFixtures) {
  const MemorySnapshot s = MakeFixtureSnapshot();
  const nlohmann::json j = nlohmann::json::parse(RenderSummaryJson(s));
  EXPECT_EQ(j["reserved_bytes"], s.stats.reserved_bytes.all().current);
  EXPECT_EQ(j["allocated_bytes"], s.stats.allocated_bytes.all().current);
  EXPECT_EQ(j["active_bytes"], s.stats.active_bytes.all().current);
  EXPECT_EQ(j["requested_bytes"], s.stats.requested_bytes.all().current);
  EXPECT_EQ(j["allocations"], s.stats.allocation.all().current);
  EXPECT_EQ(j["fragmentation_bytes"],
            s.stats.reserved_bytes.all().current - s.stats.allocated_bytes.all().current);
  EXPECT_EQ(j["largest_free_block"], 2 * kMiB);
  EXPECT_EQ(j["stats_consistent"], true);
  EXPECT_EQ(j["stats"]["allocated_bytes"]["peak"], s.stats.allocated_bytes.all().peak);
  EXPECT_EQ(j["stats"]["num_ooms"], 1);
  ASSERT_EQ(j["pools"].size(), 3u);
  EXPECT_EQ(j["pools"][1]["id"], 5);
  EXPECT_EQ(j["pools"][1]["allocated_bytes"], 512);
  EXPECT_EQ(j["pools"][2]["reserved_bytes"], 4 * kMiB);
  // The expandable segment's free blocks span 4 MiB of unmapped address space: not free memory.
  std::uint64_t pool_free = 0;
  for (const auto& pool : j["pools"]) pool_free += pool["free_bytes"].get<std::uint64_t>();
  EXPECT_EQ(pool_free, j["free_bytes"].get<std::uint64_t>());
  ASSERT_EQ(j["streams"].size(), 2u);
  EXPECT_EQ(j["streams"][1]["stream"], 7);
  EXPECT_EQ(j["top_allocations"][0]["size"], kMiB);
  // The call site skips graphalloc's own frame.
  EXPECT_EQ(j["top_call_sites"][0]["call_site"], "forward (model.cc:10)");
  EXPECT_EQ(j["top_call_sites"][0]["bytes"], 2 * kMiB);
  EXPECT_EQ(j["top_call_sites"][0]["blocks"], 2);

  const std::string text = RenderSummaryText(s, "fixture.json");
  EXPECT_THAT(text, HasSubstr("reserved          10.00 MiB (10485760 bytes)"));
  EXPECT_THAT(text, HasSubstr("allocated         3.00 MiB (3146240 bytes) in 4 blocks"));
  EXPECT_THAT(text, HasSubstr("fragmentation     7.00 MiB (7339520 bytes)"));
  EXPECT_THAT(text, HasSubstr("largest free      2.00 MiB (2097152 bytes)"));
  EXPECT_THAT(text, HasSubstr("statistics match the segments"));
  EXPECT_THAT(text, HasSubstr("forward (model.cc:10)"));
  EXPECT_THAT(text, HasSubstr("overflowed"));
}

TEST(SnapshotViewsTest, SegmentsListEveryBlock) {
  const std::string text = RenderSegmentsText(MakeFixtureSnapshot());
  int block_lines = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "  0x")) ++block_lines;
  }
  EXPECT_EQ(block_lines, kFixtureBlocks);
  EXPECT_THAT(text,
              HasSubstr("segment 2: [0x7f0001000000, 0x7f0001800000) 8.00 MiB, large, stream 0x0, pool 6, "
                        "expandable: 4.00 MiB mapped in 2 ranges, 3 blocks"));
  // Segment 0's map: 1 MiB allocated, 512 KiB pending, 512 KiB free, 1 MiB allocated, 1 MiB free.
  EXPECT_THAT(text, HasSubstr("|AAAAAAAAAAAAAAAAPPPPPPPP........AAAAAAAAAAAAAAAA................|"));
  // Segment 2's: 1 MiB allocated, 1 MiB free, 2 MiB unmapped, 2 MiB free, 2 MiB unmapped.
  EXPECT_THAT(text, HasSubstr("|AAAAAAAA........                ................                |"));
}

TEST(SnapshotViewsTest, DiffShowsAddedAndRemoved) {
  const MemorySnapshot before = MakeFixtureSnapshot();
  MemorySnapshot after = before;
  after.segments.erase(after.segments.begin() + 1);            // pool 5's segment is gone
  after.segments[0].blocks[4].state = BlockState::kAllocated;  // a new 1 MiB block
  after.segments[0].blocks[4].frames = {{"backward", "model.cc", 21}};
  const std::string diff = RenderDiffText(before, after, "a.json", "b.json");
  EXPECT_THAT(diff, HasSubstr("Segments added: 0, removed: 1"));
  EXPECT_THAT(diff, HasSubstr("- 0x7f0000400000 2.00 MiB pool 5"));
  EXPECT_THAT(diff, HasSubstr("Allocated blocks added: 1 (1.00 MiB), removed: 1 (512 bytes)"));
  EXPECT_THAT(diff, HasSubstr("+ 0x7f0000300000 1.00 MiB  backward (model.cc:21)"));
  EXPECT_THAT(diff, HasSubstr("+1.00 MiB  backward (model.cc:21)"));
  EXPECT_THAT(diff, HasSubstr("-512 bytes  optimizer (model.cc:30)"));
  const std::size_t pool5 = diff.find("\n  5 ");
  ASSERT_NE(pool5, std::string::npos) << diff;
  const std::string pool_line = diff.substr(pool5 + 1, diff.find('\n', pool5 + 1) - pool5 - 1);
  EXPECT_THAT(pool_line, HasSubstr("-2.00 MiB"));
  EXPECT_THAT(pool_line, HasSubstr("-512 bytes"));
  EXPECT_THAT(RenderDiffText(before, before, "a", "a"), HasSubstr("(no change)"));
}

TEST(SnapshotViewsTest, TimelineIsAnchoredAtTheSnapshotAndFindsThePeak) {
  const MemorySnapshot s = MakeFixtureSnapshot();
  const Timeline t = ComputeTimeline(s);
  ASSERT_EQ(t.points.size(), s.history.size());
  // The last point equals the snapshot's totals.
  const SnapshotTotals totals = ComputeTotals(s);
  EXPECT_EQ(t.points.back().allocated, static_cast<std::int64_t>(totals.allocated_bytes));
  EXPECT_EQ(t.points.back().reserved, static_cast<std::int64_t>(totals.reserved_bytes));
  EXPECT_EQ(t.peak.allocated, static_cast<std::int64_t>(totals.allocated_bytes));
  // Decimation keeps the maxima.
  const Timeline small = ComputeTimeline(s, 4);
  EXPECT_LE(small.points.size(), 4u);
  std::int64_t max_allocated = 0;
  for (const TimelinePoint& p : small.points) max_allocated = std::max(max_allocated, p.allocated);
  EXPECT_EQ(max_allocated, t.peak.allocated);
}

// A sleep gives a chunk's memory back and a wake maps it again: the timeline's reserved bytes fall and rise
// with them, while the blocks, and so the allocated bytes, stay.
TEST(SnapshotViewsTest, TimelineReservedFallsAtASleepAndRisesAtAWake) {
  const MemorySnapshot s = MakeSleepingSnapshot();
  const Timeline t = ComputeTimeline(s);
  ASSERT_EQ(t.points.size(), 12u);
  const std::int64_t allocated_mib[12] = {0, 0, 2, 5, 5, 5, 5, 5, 2, 2, 2, 2};
  for (std::size_t i = 0; i < t.points.size(); ++i) {
    EXPECT_EQ(t.points[i].event, i);
    EXPECT_EQ(t.points[i].reserved,
              graphalloc::testing::kSleepingReservedMiB[i] * static_cast<std::int64_t>(kMiB))
        << i;
    EXPECT_EQ(t.points[i].allocated, allocated_mib[i] * static_cast<std::int64_t>(kMiB)) << i;
  }
  EXPECT_EQ(t.peak.event, 3u);
  EXPECT_EQ(t.peak.reserved, static_cast<std::int64_t>(6 * kMiB));
}

TEST(SnapshotViewsTest, SummaryCountsSleepsAndWakes) {
  const std::string text = RenderSummaryText(MakeSleepingSnapshot(), "asleep.json");
  EXPECT_THAT(text, HasSubstr("History:       12 events (max_entries 100)\n"));
  EXPECT_THAT(text, HasSubstr("\n  sleep           4\n"));
  EXPECT_THAT(text, HasSubstr("\n  wake            2\n"));
  EXPECT_THAT(text, HasSubstr("\n  segment_map     2\n"));
  EXPECT_THAT(text, Not(HasSubstr("segment_unmap")));
}

// The viewer reads actions by number: the page's data carries sleep as 9 and wake as 10.
TEST(SnapshotViewsTest, HtmlCarriesSleepAndWakeByNumber) {
  const std::string html = RenderHtml(MakeSleepingSnapshot(), "asleep");
  EXPECT_THAT(html, HasSubstr("\"act\":[5,5,0,0,9,9,10,10,1,2,9,9]"));
  EXPECT_THAT(html, HasSubstr("'segment_unmap', 'oom', 'snapshot', 'sleep', 'wake']"));
}

TEST(SnapshotViewsTest, Formatting) {
  EXPECT_EQ(FormatBytes(17), "17 bytes");
  EXPECT_EQ(FormatBytes(1024), "1024 bytes");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(3ull << 30), "3.00 GiB");
  EXPECT_EQ(FormatBytes(5ull << 40), "5.00 TiB");
  EXPECT_EQ(CallSite({}), "(no stack)");
  EXPECT_EQ(CallSite({{"graphalloc::X", "a.so", 0}, {"f", "", 0}}), "f");
  EXPECT_EQ(CallSite({{"graphalloc::X", "a.so", 0}}), "graphalloc::X (a.so)");
}

}  // namespace
}  // namespace graphalloc::tools

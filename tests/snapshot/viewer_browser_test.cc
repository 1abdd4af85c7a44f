// The HTML viewer (`graphalloc snapshot plot FILE -o OUT.html`) in a real headless browser: Chromium loads
// the page, runs its script and prints the resulting DOM. The page sets body[data-status] to "ok" when it
// has rendered and to the message of any script error; `#find=0x...` selects the block at that address and
// writes its address and state into #details. Chromium is a test dependency (scripts/setup.sh installs it):
// without it the tests fail, saying so, rather than pass unchecked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "graphalloc/allocator/snapshot/torch_snapshot.h"
#include "tests/snapshot/snapshot_fixture.h"
#include "tests/testing/cli_run.h"
#include "tools/snapshot/snapshot_views.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;
using testing::MakeFixtureSnapshot;
using ::testing::Not;

using Run = testing::CliRun;
using testing::RunCommand;

// GRAPHALLOC_CHROMIUM when set, else the first browser on PATH; "" when there is none.
std::string Chromium() {
  const char* env = std::getenv("GRAPHALLOC_CHROMIUM");
  std::vector<std::string> candidates = {"chromium", "chromium-browser", "google-chrome"};
  if (env != nullptr && *env != '\0') candidates = {env};
  for (const std::string& name : candidates) {
    if (RunCommand(absl::StrCat("command -v '", name, "' 2>/dev/null")).code == 0) return name;
  }
  return "";
}

// Fails the calling test, saying how to install Chromium, when there is none.
::testing::AssertionResult HaveChromium() {
  if (!Chromium().empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "chromium is not installed: run scripts/setup.sh (it installs the "
                                          "Debian package `chromium`), or point GRAPHALLOC_CHROMIUM at a "
                                          "Chromium binary";
}

// The DOM after the page's scripts ran (stdout only: Chromium logs noise on stderr).
std::string RenderedDom(const std::string& html_path, const std::string& hash) {
  const std::string chromium = Chromium();
  const Run r =
      RunCommand(absl::StrCat(chromium,
                              " --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions"
                              " --virtual-time-budget=10000 --dump-dom 'file://",
                              html_path, hash, "' 2>/dev/null"));
  EXPECT_EQ(r.code, 0);
  return r.output;
}

// The opening tags the page writes its results into (body, #state, #details), to match against: short
// enough to print when a check fails, unlike the whole DOM with its embedded data.
std::string ResultTags(const std::string& dom) {
  std::string out;
  for (const char* start : {"<body", "<div id=\"state\"", "<div id=\"details\""}) {
    const std::size_t at = dom.find(start);
    if (at != std::string::npos) absl::StrAppend(&out, dom.substr(at, dom.find('>', at) + 1 - at), "\n");
  }
  return out;
}

std::string Cli(const std::string& args) {
  const Run r = RunCommand(absl::StrCat(GRAPHALLOC_CLI_PATH, " ", args, " 2>&1"));
  EXPECT_EQ(r.code, 0) << args << "\n" << r.output;
  return r.output;
}

// Replays gpt2_train on the simulated device with --snapshot: DIR/train.json (the peak) and
// DIR/train.end.json.
void ReplayGpt2Train(const std::string& dir, MemorySnapshot* peak, MemorySnapshot* end) {
  Cli(absl::StrCat("replay --device sim ", GRAPHALLOC_SOURCE_DIR, "/traces/gpt2_train.csv.gz --snapshot ",
                   dir, "/train.json"));
  absl::StatusOr<MemorySnapshot> p = ReadSnapshotFile(dir + "/train.json");
  absl::StatusOr<MemorySnapshot> e = ReadSnapshotFile(dir + "/train.end.json");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_FALSE(e->history.empty());
  *peak = *std::move(p);
  *end = *std::move(e);
}

TEST(ViewerBrowserTest, FixtureRendersAndFindsBlockByAddress) {
  ASSERT_TRUE(HaveChromium());
  const std::string dir = testing::TestDir();
  const std::string html = dir + "/fixture.html";
  ASSERT_TRUE(WriteFileBytes(html, tools::RenderHtml(MakeFixtureSnapshot(), "fixture <test>")).ok());
  // The pending-free block of segment 0.
  const std::string dom = RenderedDom(html, "#find=0x7f0000100000");
  EXPECT_THAT(dom, HasSubstr("data-status=\"ok\""));
  EXPECT_THAT(dom, HasSubstr("<title>fixture &lt;test&gt;</title>"));
  EXPECT_THAT(dom, HasSubstr("data-address=\"0x7f0000100000\" data-state=\"pending_free\""));
  EXPECT_THAT(dom, HasSubstr("backward (model.cc:20)"));  // the block's stack
  // An address inside the expandable segment's second mapped range (free there).
  const std::string dom2 = ResultTags(RenderedDom(html, "#find=0x7f0001480000"));
  EXPECT_THAT(dom2, HasSubstr("data-status=\"ok\""));
  EXPECT_THAT(dom2, HasSubstr("data-address=\"0x7f0001400000\" data-state=\"free\""));
  // Filtered to pool 5 (segment 1: 2 MiB, one 512 B block allocated).
  const std::string dom3 = ResultTags(RenderedDom(html, "#pool=5"));
  EXPECT_THAT(dom3, HasSubstr("data-status=\"ok\""));
  EXPECT_THAT(dom3, HasSubstr("data-reserved=\"2097152\" data-allocated=\"512\""));
}

// A pool's sleep and wake: at each event the page's reserved bytes fall at a sleep and rise at a wake (the
// viewer rebuilds them from the history backwards from a snapshot taken asleep), while the blocks in the
// chunks, and so the allocated bytes, stay.
TEST(ViewerBrowserTest, ReservedBytesFallAtASleepAndRiseAtAWake) {
  ASSERT_TRUE(HaveChromium());
  const std::string dir = testing::TestDir();
  const std::string html = dir + "/asleep.html";
  ASSERT_TRUE(WriteFileBytes(html, tools::RenderHtml(testing::MakeSleepingSnapshot(), "asleep")).ok());
  constexpr std::int64_t kMiB = 1 << 20;
  const std::int64_t allocated_mib[12] = {0, 0, 2, 5, 5, 5, 5, 5, 2, 2, 2, 2};
  for (int k : {3, 5, 7, 10}) {
    SCOPED_TRACE(::testing::Message() << "event " << k);
    const std::string dom = ResultTags(RenderedDom(html, absl::StrCat("#event=", k)));
    EXPECT_THAT(dom, HasSubstr("data-status=\"ok\""));
    EXPECT_THAT(dom, HasSubstr(absl::StrCat("data-reserved=\"", testing::kSleepingReservedMiB[k] * kMiB,
                                            "\" data-allocated=\"", allocated_mib[k] * kMiB, "\"")));
    EXPECT_THAT(dom, HasSubstr(absl::StrCat("data-event=\"", k, "\"")));
  }
  // The last event is the snapshot itself, taken asleep: nothing mapped. (The page draws mapped ranges
  // only, so the block in the sleeping range is not counted there.)
  const std::string last = ResultTags(RenderedDom(html, "#event=11"));
  EXPECT_THAT(last, HasSubstr("data-reserved=\"0\""));
  EXPECT_THAT(last, HasSubstr("data-event=\"11\""));
}

// A real allocator's history: replay a trace on the simulated device, plot its end snapshot, find a block
// that is allocated there; then the same snapshot as a PyTorch pickle, plotted directly.
TEST(ViewerBrowserTest, ReplayedTraceAndPickle) {
  ASSERT_TRUE(HaveChromium());
  const std::string dir = testing::TestDir();
  MemorySnapshot peak_snapshot, end_snapshot;
  ASSERT_NO_FATAL_FAILURE(ReplayGpt2Train(dir, &peak_snapshot, &end_snapshot));
  const MemorySnapshot* s = &end_snapshot;
  const MemorySnapshot* peak = &peak_snapshot;
  std::uint64_t known = 0;
  for (const SegmentSnapshot& seg : s->segments) {
    for (const BlockSnapshot& b : seg.blocks) {
      if (known == 0 && b.state == BlockState::kAllocated) known = b.address;
    }
  }
  ASSERT_NE(known, 0u);
  const std::string address = absl::StrCat("0x", absl::Hex(known));

  Cli(absl::StrCat("snapshot plot ", dir, "/train.end.json -o ", dir, "/gen.html"));
  std::string dom = ResultTags(RenderedDom(dir + "/gen.html", "#find=" + address));
  EXPECT_THAT(dom, HasSubstr("data-status=\"ok\""));
  EXPECT_THAT(dom, HasSubstr(absl::StrCat("data-events=\"", s->history.size(), "\"")));
  EXPECT_THAT(dom, HasSubstr(absl::StrCat("data-address=\"", address, "\" data-state=\"allocated\"")));

  Cli(absl::StrCat("snapshot export-torch ", dir, "/train.end.json -o ", dir, "/gen.pickle"));
  Cli(absl::StrCat("snapshot plot ", dir, "/gen.pickle -o ", dir, "/torch.html"));
  dom = ResultTags(RenderedDom(dir + "/torch.html", "#find=" + address));
  EXPECT_THAT(dom, HasSubstr("data-status=\"ok\""));
  EXPECT_THAT(dom, HasSubstr(absl::StrCat("data-address=\"", address, "\" data-state=\"allocated\"")));

  // The slider at the peak snapshot's last event: the state the page rebuilds from the end snapshot's
  // history is the peak snapshot's (reserved, allocated, largest free block).
  const std::size_t at = peak->history.size() - 1;
  ASSERT_FALSE(s->history_overflowed);
  // The same event (times may differ: each snapshot converts the clock when it is taken).
  ASSERT_EQ(s->history[at].action, peak->history[at].action);
  ASSERT_EQ(s->history[at].address, peak->history[at].address);
  ASSERT_EQ(s->history[at].size, peak->history[at].size);
  const SnapshotTotals totals = ComputeTotals(*peak);
  // The viewer's largest free run: free blocks clipped to accessible mapped ranges.
  std::uint64_t largest_free_run = 0;
  for (const SegmentSnapshot& seg : peak->segments) {
    std::vector<MappedRange> ranges = seg.mapped;
    if (!seg.expandable) ranges = {{0, seg.total_size, true}};
    for (const BlockSnapshot& b : seg.blocks) {
      for (const MappedRange& r : ranges) {
        const std::uint64_t lo = std::max(b.address, seg.address + r.offset);
        const std::uint64_t hi = std::min(b.address + b.size, seg.address + r.offset + r.size);
        if (b.state == BlockState::kFree && r.accessible && lo < hi) {
          largest_free_run = std::max(largest_free_run, hi - lo);
        }
      }
    }
  }
  EXPECT_EQ(totals.largest_free_block, largest_free_run);  // the summary's figure is the viewer's
  dom = ResultTags(RenderedDom(dir + "/gen.html", absl::StrCat("#event=", at)));
  EXPECT_THAT(dom, HasSubstr("data-status=\"ok\""));
  EXPECT_THAT(dom, HasSubstr(absl::StrCat("data-reserved=\"", totals.reserved_bytes, "\" data-allocated=\"",
                                          totals.allocated_bytes, "\" data-largest-free=\"", largest_free_run,
                                          "\" data-event=\"", at, "\"")));
}

// Mouse and controls, driven by a script appended to the page: hover and click on the timeline (the
// allocation under the pointer becomes the selected block), hover and click on the segment map, the
// slider, zoom, the pool filter and the peak button; any exception ends up in #probe (and a script error in
// body[data-status]).
constexpr char kProbe[] = R"(<script>
(function () {
  var out = [];
  try {
    var tl = document.getElementById('timeline'), sm = document.getElementById('segmap');
    var text = function (id) { return document.getElementById(id).textContent.split('\n')[0]; };
    var fire = function (el, type, x, y, deltaY) {
      var b = el.getBoundingClientRect(), o = {clientX: b.left + x, clientY: b.top + y, deltaY: deltaY};
      el.dispatchEvent(type === 'wheel' ? new WheelEvent(type, o) : new MouseEvent(type, o));
    };
    fire(tl, 'mousemove', tl.width / 3, tl.height - 40);
    out.push('timeline tip: ' + text('tip'));
    fire(tl, 'click', tl.width / 3, tl.height - 40);
    out.push('timeline click: ' + text('details'));
    fire(sm, 'mousemove', 100, 12);
    out.push('segment tip: ' + text('tip'));
    fire(sm, 'click', 100, 12);
    out.push('segment click: ' + text('details'));
    var slider = document.getElementById('slider');
    slider.value = 100;
    slider.dispatchEvent(new Event('input'));
    out.push('slider: ' + text('state'));
    fire(tl, 'wheel', 300, 100, -100);
    fire(tl, 'dblclick', 300, 100);
    var pool = document.getElementById('pool');
    pool.value = '0';
    pool.dispatchEvent(new Event('change'));
    document.getElementById('peak').click();
    out.push('peak: ' + document.getElementById('state').getAttribute('data-event'));
  } catch (e) {
    out.push('exception: ' + e);
  }
  var pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = out.join('\n');
  document.body.appendChild(pre);
})();
</script>)";

TEST(ViewerBrowserTest, MouseAndControls) {
  ASSERT_TRUE(HaveChromium());
  const std::string dir = testing::TestDir();
  MemorySnapshot peak, end;
  ASSERT_NO_FATAL_FAILURE(ReplayGpt2Train(dir, &peak, &end));
  std::string html = tools::RenderHtml(end, "train");
  html.insert(html.rfind("</body>"), kProbe);
  ASSERT_TRUE(WriteFileBytes(dir + "/train.html", html).ok());
  const std::string dom = RenderedDom(dir + "/train.html", "");
  const std::size_t from = dom.find("<pre id=\"probe\">"), to = dom.find("</pre>", from);
  ASSERT_NE(from, std::string::npos) << ResultTags(dom);
  const std::string probe = dom.substr(from, to - from);
  EXPECT_THAT(ResultTags(dom), HasSubstr("data-status=\"ok\""));
  EXPECT_THAT(probe, Not(HasSubstr("exception")));
  EXPECT_THAT(probe, HasSubstr("timeline tip: allocation 0x"));
  EXPECT_THAT(probe, HasSubstr("timeline click: block 0x"));
  EXPECT_THAT(probe, HasSubstr("segment tip: block 0x"));
  EXPECT_THAT(probe, HasSubstr("segment click: block 0x"));
  EXPECT_THAT(probe, HasSubstr("slider: event 100 / "));
  // The peak button goes to the event the peak snapshot was taken after.
  EXPECT_THAT(probe, HasSubstr(absl::StrCat("peak: ", peak.history.size() - 1)));
}

// A million history events (the viewer decimates for drawing and keeps every event in its model): the page
// renders, counts every event and finds a block live at the end.
TEST(ViewerBrowserTest, MillionEventHistory) {
  ASSERT_TRUE(HaveChromium());
  constexpr std::uint64_t kBase = 0x7f0000000000, kSlot = 256 << 10;
  constexpr int kSlots = 4096, kLive = 1000, kSteps = 333'334;
  MemorySnapshot s;
  s.label = "synthetic";
  std::vector<std::uint64_t> requested(kSlots, 0);
  for (int step = 0; step < kSteps; ++step) {
    const std::int64_t t = 1'700'000'000'000'000 + step;
    if (step >= kLive) {
      const int slot = (step - kLive) % kSlots;
      const std::uint64_t size = requested[slot];
      requested[slot] = 0;
      s.history.push_back({HistoryAction::kFreeRequested, kBase + slot * kSlot, size, 0, 0, t, {}, ""});
      s.history.push_back({HistoryAction::kFreeCompleted, kBase + slot * kSlot, size, 0, 0, t, {}, ""});
    }
    const int slot = step % kSlots;
    requested[slot] = 512 + (static_cast<std::uint64_t>(step) * 7919) % (kSlot - 512);
    s.history.push_back({HistoryAction::kAlloc, kBase + slot * kSlot, requested[slot], 0, 0, t, {}, ""});
  }
  SegmentSnapshot seg{kBase, kSlots * kSlot, 0, 0, SegmentKind::kLarge, false, {}, {}, {}};
  for (int slot = 0; slot < kSlots; ++slot) {
    const bool live = requested[slot] != 0;
    seg.blocks.push_back({kBase + slot * kSlot,
                          kSlot,
                          requested[slot],
                          live ? BlockState::kAllocated : BlockState::kFree,
                          0,
                          {},
                          ""});
  }
  s.segments = {seg};
  s.history_max_entries = s.history.size();
  ASSERT_TRUE(ValidateSnapshot(s).ok());

  const std::string dir = testing::TestDir();
  ASSERT_TRUE(WriteFileBytes(dir + "/big.html", tools::RenderHtml(s, "big")).ok());
  const int last_slot = (kSteps - 1) % kSlots;
  const std::string address = absl::StrCat("0x", absl::Hex(kBase + last_slot * kSlot));
  const std::string dom = ResultTags(RenderedDom(dir + "/big.html", absl::StrCat("#find=", address)));
  EXPECT_THAT(dom, HasSubstr("data-status=\"ok\""));
  EXPECT_THAT(dom, HasSubstr(absl::StrCat("data-events=\"", s.history.size(), "\"")));
  EXPECT_THAT(dom, HasSubstr(absl::StrCat("data-address=\"", address, "\" data-state=\"allocated\"")));
}

}  // namespace
}  // namespace graphalloc

// Pickles: the writer and reader against each other, a hand-made pickle with the opcodes CPython's pickler
// emits for torch.cuda.memory._dump_snapshot(), export-torch then import-torch, and bad pickles.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "graphalloc/allocator/snapshot/pickle.h"
#include "graphalloc/allocator/snapshot/torch_snapshot.h"
#include "tests/snapshot/snapshot_fixture.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;
using testing::MakeFixtureSnapshot;
using testing::MakeSleepingSnapshot;
using Kind = PickleValue::Kind;

TEST(PickleTest, WriterAndReaderAgree) {
  PickleWriter w;
  w.BeginDict();
  w.String("ints");
  w.BeginList();
  for (std::int64_t v : {std::int64_t{0}, std::int64_t{255}, std::int64_t{256}, std::int64_t{65535},
                         std::int64_t{65536}, std::int64_t{-1}, std::int64_t{-129}, std::int64_t{1} << 31,
                         -(std::int64_t{1} << 31) - 1, std::int64_t{0x7f0000400000}, INT64_MAX, INT64_MIN}) {
    w.Int(v);
  }
  w.UInt(0xFFFFFFFFFFFFFFF0ull);
  w.EndList();
  w.String("tuple");
  w.BeginTuple();
  w.Int(0);
  w.String("h\xc3\xa9llo");
  w.EndTuple();
  w.String("flags");
  w.BeginList();
  w.Bool(true);
  w.Bool(false);
  w.None();
  w.EndList();
  w.String("empty");
  w.BeginDict();
  w.EndDict();
  w.EndDict();
  absl::StatusOr<std::unique_ptr<PickleDocument>> doc = ParsePickle(w.Finish(), "w");
  ASSERT_TRUE(doc.ok()) << doc.status();
  const PickleValue& root = (*doc)->root;
  ASSERT_EQ(root.kind, Kind::kDict);
  const PickleValue* ints = root.node->Find("ints");
  ASSERT_NE(ints, nullptr);
  const std::vector<std::int64_t> expected = {0,
                                              255,
                                              256,
                                              65535,
                                              65536,
                                              -1,
                                              -129,
                                              std::int64_t{1} << 31,
                                              -(std::int64_t{1} << 31) - 1,
                                              0x7f0000400000,
                                              INT64_MAX,
                                              INT64_MIN,
                                              static_cast<std::int64_t>(0xFFFFFFFFFFFFFFF0ull)};
  ASSERT_EQ(ints->node->items.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(ints->node->items[i].integer, expected[i]) << i;
  const PickleValue* tuple = root.node->Find("tuple");
  ASSERT_EQ(tuple->kind, Kind::kTuple);
  EXPECT_EQ(tuple->node->items[1].text, "h\xc3\xa9llo");
  const PickleValue* flags = root.node->Find("flags");
  EXPECT_EQ(flags->node->items[0].kind, Kind::kBool);
  EXPECT_TRUE(flags->node->items[0].boolean);
  EXPECT_FALSE(flags->node->items[1].boolean);
  EXPECT_EQ(flags->node->items[2].kind, Kind::kNone);
  EXPECT_TRUE(root.node->Find("empty")->node->entries.empty());
}

// A pickle as CPython 3 (protocol 4) writes a one-segment torch snapshot: FRAME, MEMOIZE after every
// container and string, SHORT_BINUNICODE, BININT1/BININT2/LONG1, TUPLE2, NEWFALSE, BINGET for the
// repeated "frames" list and strings, and the older "active_awaiting_free" state.
std::string HandMadeTorchPickle() {
  std::string p;
  int memo = 0;  // the next MEMOIZE index, as CPython numbers them
  auto op = [&](unsigned char c) { p.push_back(static_cast<char>(c)); };
  auto memoize = [&] {
    op(0x94);
    return memo++;
  };
  auto str = [&](const std::string& s) {  // SHORT_BINUNICODE + MEMOIZE; returns the memo index
    op(0x8c);
    op(static_cast<unsigned char>(s.size()));
    p += s;
    return memoize();
  };
  auto get = [&](int index) {  // BINGET
    op('h');
    op(static_cast<unsigned char>(index));
  };
  auto binint = [&](std::uint32_t v) {
    op('J');
    for (int i = 0; i < 4; ++i) op(static_cast<unsigned char>((v >> (8 * i)) & 0xFF));
  };
  auto long1 = [&](std::uint64_t v, int n) {
    op(0x8a);
    op(static_cast<unsigned char>(n));
    for (int i = 0; i < n; ++i) op(static_cast<unsigned char>((v >> (8 * i)) & 0xFF));
  };
  auto dict = [&] {  // EMPTY_DICT MEMOIZE MARK
    op('}');
    memoize();
    op('(');
  };
  op(0x80);
  op(4);  // PROTO 4
  op(0x95);
  for (int i = 0; i < 8; ++i) op(0);  // FRAME (its length is not checked)
  dict();
  str("segments");
  op(']');
  memoize();
  dict();  // the segment
  str("device");
  op('K');
  op(0);
  const int k_address = str("address");
  long1(0x7f3a00000000, 6);
  str("total_size");
  binint(2 << 20);
  const int k_stream = str("stream");
  op('K');
  op(0);
  str("segment_type");
  str("large");
  str("segment_pool_id");
  op('K');
  op(0);
  op('K');
  op(0);
  op(0x86);  // TUPLE2
  memoize();
  str("is_expandable");
  op(0x89);  // NEWFALSE
  const int k_frames = str("frames");
  op(']');
  memoize();
  str("blocks");
  op(']');
  memoize();
  op('(');
  // Block 1: 1 MiB allocated, with one frame.
  dict();
  get(k_address);
  long1(0x7f3a00000000, 6);
  const int k_size = str("size");
  binint(1 << 20);
  const int k_requested = str("requested_size");
  binint(1048480);
  const int k_state = str("state");
  str("active_allocated");
  get(k_frames);
  op(']');
  memoize();
  dict();
  str("filename");
  str("train.py");
  str("line");
  op('M');
  op(0x2A);
  op(0x01);  // BININT2 298
  str("name");
  str("forward");
  op('u');  // SETITEMS: the frame
  op('a');  // APPEND it to the block's frames
  op('u');  // SETITEMS: block 1
  // Block 2: 512 KiB awaiting free (the older spelling), no frames.
  dict();
  get(k_address);
  long1(0x7f3a00100000, 6);
  get(k_size);
  binint(1 << 19);
  get(k_requested);
  binint(1 << 19);
  get(k_state);
  str("active_awaiting_free");
  op('u');
  // Block 3: the remaining 512 KiB, inactive.
  dict();
  get(k_address);
  long1(0x7f3a00180000, 6);
  get(k_size);
  binint(1 << 19);
  get(k_requested);
  op('K');
  op(0);
  get(k_state);
  str("inactive");
  op('u');
  op('e');  // APPENDS: the three blocks
  op('u');  // SETITEMS: the segment
  op('a');  // APPEND it to "segments"
  str("device_traces");
  op(']');
  memoize();
  op(']');
  memoize();
  op('(');
  dict();
  const int k_action = str("action");
  str("alloc");
  str("addr");
  long1(0x7f3a00000000, 6);
  get(k_size);
  binint(1 << 20);
  get(k_stream);
  op('K');
  op(0);
  str("time_us");
  long1(1700000000000000ull, 7);
  get(k_frames);
  op(']');
  memoize();
  str("user_metadata");
  str("");
  op('u');
  dict();
  get(k_action);
  str("snapshot");
  op('u');
  op('e');  // APPENDS: device 0's entries
  op('a');  // APPEND the list to device_traces
  str("allocator_settings");
  dict();
  str("PYTORCH_CUDA_ALLOC_CONF");
  op('N');  // None: unset
  str("max_split_size");
  binint(0xFFFFFFFFu);  // -1
  op('u');
  op('u');  // SETITEMS: the top level
  op('.');  // STOP
  return p;
}

TEST(TorchPickleTest, ImportsAHandMadePytorchPickle) {
  const std::string bytes = HandMadeTorchPickle();
  absl::StatusOr<std::unique_ptr<PickleDocument>> doc = ParsePickle(bytes, "hand.pickle");
  ASSERT_TRUE(doc.ok()) << doc.status();
  absl::StatusOr<MemorySnapshot> s = SnapshotFromTorchPickle(bytes, "hand.pickle");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->segments.size(), 1u);
  const SegmentSnapshot& seg = s->segments[0];
  EXPECT_EQ(seg.address, 0x7f3a00000000u);
  EXPECT_EQ(seg.total_size, 2u << 20);
  EXPECT_EQ(seg.kind, SegmentKind::kLarge);
  EXPECT_EQ(seg.pool_id, 0u);
  EXPECT_FALSE(seg.expandable);
  ASSERT_EQ(seg.blocks.size(), 3u);
  EXPECT_EQ(seg.blocks[0].state, BlockState::kAllocated);
  EXPECT_EQ(seg.blocks[0].size, 1u << 20);
  EXPECT_EQ(seg.blocks[0].requested_size, 1048480u);
  ASSERT_EQ(seg.blocks[0].frames.size(), 1u);
  EXPECT_EQ(seg.blocks[0].frames[0], (Frame{"forward", "train.py", 298}));
  EXPECT_EQ(seg.blocks[1].state, BlockState::kPendingFree);  // "active_awaiting_free"
  EXPECT_EQ(seg.blocks[1].address, 0x7f3a00100000u);
  EXPECT_EQ(seg.blocks[2].state, BlockState::kFree);
  ASSERT_EQ(s->history.size(), 2u);
  EXPECT_EQ(s->history[0].action, HistoryAction::kAlloc);
  EXPECT_EQ(s->history[0].address, 0x7f3a00000000u);
  EXPECT_EQ(s->history[0].size, 1u << 20);
  EXPECT_EQ(s->history[0].time_us, 1700000000000000);
  EXPECT_EQ(s->history[1].action, HistoryAction::kSnapshot);
  EXPECT_EQ(s->stats.max_split_size, -1);
  EXPECT_EQ(s->config, "");
  // Statistics are recomputed from the blocks.
  EXPECT_EQ(s->stats.allocated_bytes.all().current, 1 << 20);
  EXPECT_EQ(s->stats.active_bytes.all().current, (1 << 20) + (1 << 19));
  EXPECT_EQ(s->stats.reserved_bytes.all().current, 2 << 20);
  EXPECT_TRUE(CheckStatsConsistency(*s).ok());
}

TEST(TorchPickleTest, ExportThenImportKeepsSegmentsBlocksAndTraces) {
  const MemorySnapshot s = MakeFixtureSnapshot();
  absl::StatusOr<MemorySnapshot> back = SnapshotFromTorchPickle(SnapshotToTorchPickle(s), "fixture.pickle");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->label, "end");
  EXPECT_EQ(back->config, s.config);
  EXPECT_EQ(back->device.name, s.device.name);
  EXPECT_EQ(back->history_max_entries, s.history_max_entries);
  EXPECT_TRUE(back->history_overflowed);
  EXPECT_EQ(back->history, s.history);
  // The non-expandable segments come back as they were.
  ASSERT_EQ(back->segments.size(), 4u);  // the expandable one is split at its hole
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(back->segments[static_cast<std::size_t>(i)], s.segments[static_cast<std::size_t>(i)]) << i;
  // The expandable segment: one PyTorch segment per mapped range, blocks clipped to them.
  const std::uint64_t c = s.segments[2].address, mib = 1 << 20;
  const SegmentSnapshot& e0 = back->segments[2];
  const SegmentSnapshot& e1 = back->segments[3];
  EXPECT_TRUE(e0.expandable && e1.expandable);
  EXPECT_EQ(e0.address, c);
  EXPECT_EQ(e0.total_size, 2 * mib);
  EXPECT_EQ(e0.pool_id, 6u);
  ASSERT_EQ(e0.blocks.size(), 2u);
  EXPECT_EQ(e0.blocks[0], s.segments[2].blocks[0]);
  EXPECT_EQ(e0.blocks[1].size, mib);
  EXPECT_EQ(e1.address, c + 4 * mib);
  EXPECT_EQ(e1.total_size, 2 * mib);
  // Totals survive, and the recomputed statistics agree with the originals where they are exact.
  const SnapshotTotals a = ComputeTotals(s), b = ComputeTotals(*back);
  EXPECT_EQ(a.reserved_bytes, b.reserved_bytes);
  EXPECT_EQ(a.allocated_bytes, b.allocated_bytes);
  EXPECT_EQ(a.active_bytes, b.active_bytes);
  EXPECT_EQ(a.requested_bytes, b.requested_bytes);
  EXPECT_EQ(back->stats.allocated_bytes.all().current, s.stats.allocated_bytes.all().current);
  EXPECT_EQ(back->stats.reserved_bytes.all().current, s.stats.reserved_bytes.all().current);
  // And a second round trip is exact.
  absl::StatusOr<MemorySnapshot> again = SnapshotFromTorchPickle(SnapshotToTorchPickle(*back), "again");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->segments, back->segments);
  EXPECT_EQ(again->history, back->history);
}

// PyTorch's tools know only PyTorch's actions: a sleep is written as segment_unmap and a wake as
// segment_map (the memory left and came back), and import-torch reads them back as those.
TEST(TorchPickleTest, SleepAndWakeAreExportedAsUnmapAndMap) {
  const MemorySnapshot s = MakeSleepingSnapshot();
  const std::string bytes = SnapshotToTorchPickle(s);
  absl::StatusOr<std::unique_ptr<PickleDocument>> doc = ParsePickle(bytes, "asleep.pickle");
  ASSERT_TRUE(doc.ok()) << doc.status();
  const PickleValue* traces = (*doc)->root.node->Find("device_traces");
  ASSERT_NE(traces, nullptr);
  ASSERT_EQ(traces->node->items.size(), 1u);
  std::vector<std::string> actions;
  for (const PickleValue& e : traces->node->items[0].node->items)
    actions.push_back(e.node->Find("action")->text);
  EXPECT_EQ(actions,
            (std::vector<std::string>{"segment_map", "segment_map", "alloc", "alloc", "segment_unmap",
                                      "segment_unmap", "segment_map", "segment_map", "free_requested",
                                      "free_completed", "segment_unmap", "segment_unmap"}));

  absl::StatusOr<MemorySnapshot> back = SnapshotFromTorchPickle(bytes, "asleep.pickle");
  ASSERT_TRUE(back.ok()) << back.status();
  std::vector<HistoryEvent> expected = s.history;
  for (HistoryEvent& e : expected) {
    if (e.action == HistoryAction::kSleep) e.action = HistoryAction::kSegmentUnmap;
    if (e.action == HistoryAction::kWake) e.action = HistoryAction::kSegmentMap;
  }
  EXPECT_EQ(back->history, expected);
  // Nothing is mapped: no PyTorch segment, as PyTorch would report a pool whose memory is gone.
  EXPECT_TRUE(back->segments.empty());
}

std::string ErrorOf(const std::string& bytes) {
  absl::StatusOr<MemorySnapshot> s = SnapshotFromTorchPickle(bytes, "bad.pickle");
  EXPECT_FALSE(s.ok());
  if (s.ok()) return "";
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  return std::string(s.status().message());
}

TEST(TorchPickleTest, BadPicklesNameTheByteOffset) {
  const std::string good = SnapshotToTorchPickle(MakeFixtureSnapshot());
  EXPECT_THAT(ErrorOf(good.substr(0, good.size() / 2)), HasSubstr("bad.pickle: bad pickle at byte "));
  EXPECT_THAT(ErrorOf(good.substr(0, good.size() - 1)), HasSubstr("ends without a STOP opcode (truncated?)"));
  EXPECT_THAT(ErrorOf(""), HasSubstr("at byte 0: the pickle ends without a STOP"));
  EXPECT_THAT(ErrorOf(std::string("\x80\x02") + "cos\nsystem\n."),
              HasSubstr("at byte 2: opcode GLOBAL is not supported"));
  EXPECT_THAT(ErrorOf(std::string("\x80\x02\xfe", 3)), HasSubstr("at byte 2: unknown opcode 0xfe"));
  EXPECT_THAT(ErrorOf(std::string("\x80\x02h\x05.", 5)), HasSubstr("memo entry 5 was never stored"));
  EXPECT_THAT(ErrorOf(std::string("\x80\x02K\x01K\x02.", 7)), HasSubstr("STOP with 2 values"));
  EXPECT_THAT(ErrorOf(std::string("\x80\x02X\xff\x00\x00\x00"
                                  "ab",
                                  9)),
              HasSubstr("wants 255 more bytes, 2 left"));
  EXPECT_THAT(ErrorOf(std::string("\x80\x02u", 3)), HasSubstr("wants a MARK"));
}

TEST(TorchPickleTest, BadValuesNameTheirPath) {
  const MemorySnapshot s = MakeFixtureSnapshot();
  std::string bytes = SnapshotToTorchPickle(s);
  const std::string inactive = std::string("X\x08\x00\x00\x00", 5) + "inactive";
  const std::size_t first = bytes.find(inactive);
  ASSERT_NE(first, std::string::npos);
  bytes.replace(first, inactive.size(), std::string("X\x08\x00\x00\x00", 5) + "inactivX");
  EXPECT_THAT(ErrorOf(bytes),
              HasSubstr("bad.pickle: segments[0].blocks[2].state: unknown block state 'inactivX'"));

  PickleWriter w;
  w.BeginList();
  w.EndList();
  EXPECT_THAT(ErrorOf(w.Finish()), HasSubstr("(top level): expected a dict, found list"));
  w.BeginDict();
  w.String("segments");
  w.BeginList();
  w.BeginDict();
  w.String("address");
  w.String("0x1000");
  w.EndDict();
  w.EndList();
  w.EndDict();
  EXPECT_THAT(ErrorOf(w.Finish()), HasSubstr("segments[0].address: expected an int, found str"));
}

}  // namespace
}  // namespace graphalloc

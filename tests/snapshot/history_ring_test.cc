// The history ring: bounds and overflow, stacks only when asked, annotations, run-time options, and
// recording from 8 threads at once.
#include "graphalloc/allocator/history/history_ring.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <thread>
#include <vector>

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

HistoryOptions On(std::size_t max_entries, bool stacks = false) { return {true, max_entries, stacks}; }

TEST(HistoryRingTest, DisabledRecordsNothing) {
  HistoryRing ring;
  EXPECT_FALSE(ring.enabled());
  ring.Record(HistoryAction::kAlloc, 1, 2, 3, 4);
  const HistoryContents c = ring.Read();
  EXPECT_TRUE(c.events.empty());
  EXPECT_EQ(c.max_entries, 0u);
  EXPECT_FALSE(c.overflowed);
}

TEST(HistoryRingTest, RecordsEveryFieldInOrder) {
  HistoryRing ring;
  ASSERT_TRUE(ring.RecordHistory(On(16)).ok());
  const auto before = std::chrono::system_clock::now();
  for (int i = 0; i < kNumHistoryActions; ++i) {
    ring.Record(static_cast<HistoryAction>(i), 0x1000 + i, 100 + i, 7, 3);
  }
  const auto after = std::chrono::system_clock::now();
  const HistoryContents c = ring.Read();
  ASSERT_EQ(c.events.size(), static_cast<std::size_t>(kNumHistoryActions));
  EXPECT_FALSE(c.overflowed);
  EXPECT_EQ(c.max_entries, 16u);
  EXPECT_EQ(c.recorded, static_cast<std::uint64_t>(kNumHistoryActions));
  const auto us = [](auto tp) {
    return std::chrono::duration_cast<std::chrono::microseconds>(tp.time_since_epoch()).count();
  };
  for (int i = 0; i < kNumHistoryActions; ++i) {
    const HistoryEvent& e = c.events[static_cast<std::size_t>(i)];
    EXPECT_EQ(e.action, static_cast<HistoryAction>(i));
    EXPECT_EQ(e.address, 0x1000u + i);
    EXPECT_EQ(e.size, 100u + i);
    EXPECT_EQ(e.stream, 7u);
    EXPECT_EQ(e.pool_id, 3u);
    EXPECT_TRUE(e.frames.empty());
    EXPECT_TRUE(e.annotation.empty());
    // Timestamps come from the TSC, converted when read: close to the wall clock, and in order.
    EXPECT_GE(e.time_us, us(before) - 2000);
    EXPECT_LE(e.time_us, us(after) + 2000);
    if (i > 0) {
      EXPECT_GE(e.time_us, c.events[static_cast<std::size_t>(i) - 1].time_us);
    }
  }
}

TEST(HistoryRingTest, KeepsTheNewestMaxEntriesAndFlagsOverflow) {
  HistoryRing ring;
  ASSERT_TRUE(ring.RecordHistory(On(100)).ok());
  for (int i = 0; i < 100; ++i) ring.Record(HistoryAction::kAlloc, i, 1, 0, 0);
  HistoryContents c = ring.Read();
  EXPECT_EQ(c.events.size(), 100u);
  EXPECT_FALSE(c.overflowed);
  ring.Record(HistoryAction::kFreeCompleted, 100, 1, 0, 0);
  for (int i = 101; i < 1050; ++i) ring.Record(HistoryAction::kAlloc, i, 1, 0, 0);
  c = ring.Read();
  ASSERT_EQ(c.events.size(), 100u);
  EXPECT_TRUE(c.overflowed);
  EXPECT_EQ(c.recorded, 1050u);
  for (std::size_t i = 0; i < 100; ++i) EXPECT_EQ(c.events[i].address, 950 + i);  // oldest dropped
  MemorySnapshot s;
  ring.ExportTo(&s);
  EXPECT_EQ(s.history.size(), 100u);
  EXPECT_TRUE(s.history_overflowed);
  EXPECT_EQ(s.history_max_entries, 100u);
}

TEST(HistoryRingTest, ClearDropsEventsAndOverflow) {
  HistoryRing ring;
  ASSERT_TRUE(ring.RecordHistory(On(4)).ok());
  for (int i = 0; i < 10; ++i) ring.Record(HistoryAction::kAlloc, i, 1, 0, 0);
  ring.Clear();
  EXPECT_TRUE(ring.Read().events.empty());
  EXPECT_FALSE(ring.Read().overflowed);
  ring.Record(HistoryAction::kAlloc, 42, 1, 0, 0);
  ASSERT_EQ(ring.Read().events.size(), 1u);
  EXPECT_EQ(ring.Read().events[0].address, 42u);
}

TEST(HistoryRingTest, StacksOnlyWhenAsked) {
  HistoryRing ring;
  ASSERT_TRUE(ring.RecordHistory(On(8, /*stacks=*/false)).ok());
  ring.Record(HistoryAction::kAlloc, 1, 1, 0, 0);
  ASSERT_EQ(ring.Read().events.size(), 1u);
  EXPECT_TRUE(ring.Read().events[0].frames.empty());

  ASSERT_TRUE(ring.RecordHistory(On(8, /*stacks=*/true)).ok());  // a new, empty history
  EXPECT_TRUE(ring.Read().events.empty());
  ring.Record(HistoryAction::kAlloc, 2, 1, 0, 0);
  HistoryContents c = ring.Read();
  ASSERT_EQ(c.events.size(), 1u);
  ASSERT_FALSE(c.events[0].frames.empty());
  EXPECT_LE(c.events[0].frames.size(), static_cast<std::size_t>(kMaxHistoryFrames));
  for (const Frame& f : c.events[0].frames) EXPECT_FALSE(f.function.empty());
  // The innermost frame is the caller of Record(), not the ring's own capture.
  EXPECT_THAT(c.events[0].frames[0].function, ::testing::Not(HasSubstr("CaptureStack")));
  EXPECT_FALSE(c.events[0].frames[0].file.empty());
}

TEST(HistoryRingTest, AnnotationsAreInternedPerThread) {
  HistoryRing ring;
  ASSERT_TRUE(ring.RecordHistory(On(8)).ok());
  {
    ScopedHistoryAnnotation outer("forward");
    ring.Record(HistoryAction::kAlloc, 1, 1, 0, 0);
    {
      ScopedHistoryAnnotation inner("layer 3");
      ring.Record(HistoryAction::kAlloc, 2, 1, 0, 0);
    }
    ring.Record(HistoryAction::kAlloc, 3, 1, 0, 0);
    std::thread([&] { ring.Record(HistoryAction::kAlloc, 4, 1, 0, 0); }).join();  // not annotated there
  }
  ring.Record(HistoryAction::kAlloc, 5, 1, 0, 0, InternAnnotation("explicit"));
  const HistoryContents c = ring.Read();
  ASSERT_EQ(c.events.size(), 5u);
  EXPECT_EQ(c.events[0].annotation, "forward");
  EXPECT_EQ(c.events[1].annotation, "layer 3");
  EXPECT_EQ(c.events[2].annotation, "forward");
  EXPECT_EQ(c.events[3].annotation, "");
  EXPECT_EQ(c.events[4].annotation, "explicit");
  EXPECT_EQ(InternAnnotation("forward"), InternAnnotation("forward"));
  EXPECT_EQ(InternAnnotation(""), 0u);
  EXPECT_EQ(AnnotationText(0), "");
  EXPECT_EQ(AnnotationText(0xFFFFFFF0u), "");
}

TEST(HistoryRingTest, ThreadAnnotationStaysUntilSetAgain) {
  HistoryRing ring;
  ASSERT_TRUE(ring.RecordHistory(On(8)).ok());
  SetThreadAnnotation("metadata test");
  ring.Record(HistoryAction::kSegmentAlloc, 1, 2, 0, 0);
  {
    ScopedHistoryAnnotation inner("inner");
    ring.Record(HistoryAction::kAlloc, 1, 1, 0, 0);
  }
  ring.Record(HistoryAction::kSegmentFree, 1, 2, 0, 0);
  SetThreadAnnotation("");
  ring.Record(HistoryAction::kAlloc, 3, 1, 0, 0);
  const HistoryContents c = ring.Read();
  ASSERT_EQ(c.events.size(), 4u);
  EXPECT_EQ(c.events[0].annotation, "metadata test");
  EXPECT_EQ(c.events[1].annotation, "inner");
  EXPECT_EQ(c.events[2].annotation, "metadata test");
  EXPECT_EQ(c.events[3].annotation, "");
  EXPECT_EQ(CurrentAnnotation(), 0u);
}

TEST(HistoryRingTest, DisableKeepsEventsAndReenableContinues) {
  HistoryRing ring;
  ASSERT_TRUE(ring.RecordHistory(On(8)).ok());
  ring.Record(HistoryAction::kAlloc, 1, 1, 0, 0);
  ASSERT_TRUE(ring.RecordHistory({false, 8, false}).ok());
  EXPECT_FALSE(ring.enabled());
  EXPECT_FALSE(ring.options().enabled);
  ring.Record(HistoryAction::kAlloc, 2, 1, 0, 0);  // ignored
  EXPECT_EQ(ring.Read().events.size(), 1u);
  ASSERT_TRUE(ring.RecordHistory(On(8)).ok());
  ring.Record(HistoryAction::kAlloc, 3, 1, 0, 0);
  const HistoryContents c = ring.Read();
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_EQ(c.events[1].address, 3u);
  EXPECT_EQ(ring.options(), On(8));
  // A different size starts over.
  ASSERT_TRUE(ring.RecordHistory(On(16)).ok());
  EXPECT_TRUE(ring.Read().events.empty());
  EXPECT_EQ(ring.Read().max_entries, 16u);
}

TEST(HistoryRingTest, ZeroMaxEntriesIsAnError) {
  HistoryRing ring;
  const absl::Status s = ring.RecordHistory(On(0));
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_entries must be at least 1"));
  EXPECT_FALSE(ring.enabled());
}

TEST(HistoryRingTest, MaxEntriesBeyondTheLargestRingIsAnError) {
  HistoryRing ring;
  ASSERT_TRUE(ring.RecordHistory(On(4)).ok());
  // PyTorch's "unbounded" default (sys.maxsize) must be refused, not allocated.
  const absl::Status s = ring.RecordHistory(On(std::size_t{1} << 63));
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("exceeds the largest ring, 268435456 events"));
  EXPECT_TRUE(ring.enabled());  // the ring in use is kept
  EXPECT_EQ(ring.options().max_entries, 4u);
}

// Memory follows the events recorded, not max_entries: a ring of 10^8 (PyTorch users ask for more) costs
// nothing until events arrive, then one page of kHistoryPageSlots at a time. (Allocated whole it took 7.35 GB
// and 28 s before the first allocation from Python.)
TEST(HistoryRingTest, TheRingGrowsWithTheEventsNotWithMaxEntries) {
  HistoryRing ring;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(ring.RecordHistory(On(100000000)).ok());
  EXPECT_EQ(ring.AllocatedSlots(), 0u);
  for (std::uint64_t i = 0; i < 10; ++i) ring.Record(HistoryAction::kAlloc, i, 1, 0, 0);
  EXPECT_EQ(ring.AllocatedSlots(), kHistoryPageSlots);
  for (std::uint64_t i = 10; i < 10000; ++i) ring.Record(HistoryAction::kAlloc, i, 1, 0, 0);
  EXPECT_EQ(ring.AllocatedSlots(), 3 * kHistoryPageSlots);
  const HistoryContents c = ring.Read();
  ASSERT_EQ(c.events.size(), 10000u);
  EXPECT_EQ(c.events[9999].address, 9999u);
  EXPECT_FALSE(c.overflowed);
  EXPECT_EQ(c.skipped, 0u);
  EXPECT_EQ(c.max_entries, 100000000u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  // The largest ring is accepted, and it too costs nothing yet.
  ASSERT_TRUE(ring.RecordHistory(On(kMaxHistoryEntries)).ok());
  EXPECT_EQ(ring.AllocatedSlots(), 0u);
}

TEST(HistoryRingTest, ASmallRingIsOneSmallPageAndWrapsInIt) {
  HistoryRing ring;
  ASSERT_TRUE(ring.RecordHistory(On(100)).ok());  // 128 slots
  for (std::uint64_t i = 0; i < 1000; ++i) ring.Record(HistoryAction::kAlloc, i, 1, 0, 0);
  EXPECT_EQ(ring.AllocatedSlots(), 128u);
  const HistoryContents c = ring.Read();
  ASSERT_EQ(c.events.size(), 100u);
  EXPECT_EQ(c.events.front().address, 900u);
  EXPECT_TRUE(c.overflowed);
}

TEST(HistoryRingTest, EightThreadsRecordConcurrently) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  HistoryRing ring;
  ASSERT_TRUE(ring.RecordHistory(On(kThreads * kPerThread)).ok());
  std::vector<std::thread> threads;
  std::atomic<bool> stop_reader{false};
  std::thread reader([&] {  // reads while they write: must never see a torn event
    while (!stop_reader.load()) {
      for (const HistoryEvent& e : ring.Read().events) {
        ASSERT_EQ(e.size, e.address * 2);
        ASSERT_EQ(e.stream, e.address >> 32);
      }
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&ring, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::uint64_t address = (static_cast<std::uint64_t>(t) << 32) | static_cast<std::uint64_t>(i);
        ring.Record(i % 2 == 0 ? HistoryAction::kAlloc : HistoryAction::kFreeRequested, address, address * 2,
                    static_cast<std::uint64_t>(t), 0);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  stop_reader = true;
  reader.join();
  const HistoryContents c = ring.Read();
  EXPECT_EQ(c.events.size(), static_cast<std::size_t>(kThreads * kPerThread));
  EXPECT_FALSE(c.overflowed);
  EXPECT_EQ(c.skipped, 0u);
  std::set<std::uint64_t> seen;
  std::vector<int> last(kThreads, -1);
  for (const HistoryEvent& e : c.events) {
    EXPECT_TRUE(seen.insert(e.address).second);
    const int t = static_cast<int>(e.stream), i = static_cast<int>(e.address & 0xFFFFFFFF);
    EXPECT_GT(i, last[static_cast<std::size_t>(t)]);  // each thread's events stay in its order
    last[static_cast<std::size_t>(t)] = i;
  }
}

TEST(HistoryRingTest, ConcurrentOverflowKeepsMaxEntries) {
  HistoryRing ring;
  ASSERT_TRUE(ring.RecordHistory(On(1000)).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&ring] {
      for (int i = 0; i < 10000; ++i) ring.Record(HistoryAction::kAlloc, 1, 2, 3, 4);
    });
  }
  for (std::thread& th : threads) th.join();
  const HistoryContents c = ring.Read();
  EXPECT_EQ(c.events.size() + c.skipped, 1000u);
  EXPECT_EQ(c.events.size(), 1000u);  // all writers are done: no slot is mid-write
  EXPECT_TRUE(c.overflowed);
  EXPECT_EQ(c.recorded, 80000u);
}

}  // namespace
}  // namespace graphalloc

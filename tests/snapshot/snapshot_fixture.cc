#include "tests/snapshot/snapshot_fixture.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"

namespace graphalloc::testing {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

// Removes the directories TestDir() made for a test when it passes; a failed test's files stay, to look at.
class RemoveDirsOfPassedTests final : public ::testing::EmptyTestEventListener {
 public:
  void Add(std::filesystem::path dir) { dirs_.push_back(std::move(dir)); }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Passed()) {
      std::error_code ignored;
      for (const std::filesystem::path& dir : dirs_) std::filesystem::remove_all(dir, ignored);
    }
    dirs_.clear();
  }

 private:
  std::vector<std::filesystem::path> dirs_;
};

RemoveDirsOfPassedTests& Cleaner() {
  // Owned by GoogleTest's listener list once appended (it deletes its listeners at exit).
  static RemoveDirsOfPassedTests* cleaner = [] {
    auto* listener = new RemoveDirsOfPassedTests;
    ::testing::UnitTest::GetInstance()->listeners().Append(listener);
    return listener;
  }();
  return *cleaner;
}

std::vector<Frame> Stack(const std::string& fn, int line) {
  return {{"graphalloc::CachingAllocator::Allocate", "libgraphalloc.so", 0},
          {fn, "model.cc", line},
          {"main", "main.cc", 7}};
}

// A snapshot of the simulated device with no segments or history yet.
MemorySnapshot EmptySnapshot(const std::string& label, const std::string& config) {
  MemorySnapshot s;
  s.label = label;
  s.source = "graphalloc";
  s.time_us = 1'700'000'000'000'000;
  s.device = {0, "Simulated GPU \"sim0\"", 80ull << 30, 2 * kMiB};
  s.config = config;
  return s;
}

}  // namespace

MemorySnapshot MakeFixtureSnapshot() {
  MemorySnapshot s = EmptySnapshot("end", "expandable_segments:True,max_split_size_mb:256");

  const std::uint64_t a = 0x7f0000000000, b = 0x7f0000400000, c = 0x7f0001000000;
  // Segment 0: large, default pool, stream 0, 4 MiB: allocated 1 MiB, pending 512 KiB, free 512 KiB,
  // allocated 1 MiB, free 1 MiB.
  SegmentSnapshot s0{a, 4 * kMiB, 0, 0, SegmentKind::kLarge, false, {}, {}, Stack("make_segment", 3)};
  s0.blocks = {
      {a, kMiB, kMiB - 100, BlockState::kAllocated, 0, Stack("forward", 10), "step 1 <fwd> & \"x\""},
      {a + kMiB, kMiB / 2, kMiB / 2, BlockState::kPendingFree, 0, Stack("backward", 20), ""},
      {a + kMiB + kMiB / 2, kMiB / 2, 0, BlockState::kFree, 0, {}, ""},
      {a + 2 * kMiB, kMiB, kMiB, BlockState::kAllocated, 0, Stack("forward", 10), "step 1 <fwd> & \"x\""},
      {a + 3 * kMiB, kMiB, 0, BlockState::kFree, 0, {}, ""},
  };
  // Segment 1: small, private pool 5, stream 7, 2 MiB: allocated 512 B, free the rest.
  SegmentSnapshot s1{b, 2 * kMiB, 7, 5, SegmentKind::kSmall, false, {}, {}, {}};
  s1.blocks = {
      {b, 512, 500, BlockState::kAllocated, 7, Stack("optimizer", 30), "graph"},
      {b + 512, 2 * kMiB - 512, 0, BlockState::kFree, 7, {}, ""},
  };
  // Segment 2: expandable, pool 6, 8 MiB reserved virtually, mapped [0, 2 MiB) and [4 MiB, 6 MiB).
  SegmentSnapshot s2{c,  8 * kMiB, 0, 6, SegmentKind::kLarge, true, {{0, 2 * kMiB}, {4 * kMiB, 2 * kMiB}},
                     {}, {}};
  s2.blocks = {
      {c, kMiB, kMiB, BlockState::kAllocated, 0, Stack("attention", 40), ""},
      {c + kMiB, 3 * kMiB, 0, BlockState::kFree, 0, {}, ""},
      {c + 4 * kMiB, 4 * kMiB, 0, BlockState::kFree, 0, {}, ""},
  };
  s.segments = {s0, s1, s2};

  // Statistics that agree with the blocks (current), with larger peaks.
  DeviceStats& st = s.stats;
  auto set = [](StatArray& arr, std::int64_t small, std::int64_t large, std::int64_t extra_peak) {
    arr[StatType::kSmallPool] = {small, small + extra_peak, small + 2 * extra_peak, 2 * extra_peak};
    arr[StatType::kLargePool] = {large, large + extra_peak, large + 2 * extra_peak, 2 * extra_peak};
    arr[StatType::kAggregate] = {small + large, small + large + extra_peak, small + large + 4 * extra_peak,
                                 4 * extra_peak};
  };
  set(st.allocation, 1, 3, 2);
  set(st.segment, 1, 1, 1);
  set(st.active, 1, 4, 2);
  set(st.inactive_split, 1, 2, 1);
  set(st.allocated_bytes, 512, 3 * kMiB, kMiB);
  set(st.reserved_bytes, 2 * kMiB, 8 * kMiB, 4 * kMiB);
  set(st.active_bytes, 512, 3 * kMiB + kMiB / 2, kMiB);
  set(st.inactive_split_bytes, 2 * kMiB - 512, kMiB + kMiB / 2, 0);
  set(st.requested_bytes, 500, 3 * kMiB + kMiB / 2 - 100, kMiB);
  set(st.oversize_allocations, 0, 0, 0);
  set(st.oversize_segments, 0, 0, 0);
  st.num_alloc_retries = 1;
  st.num_ooms = 1;
  st.num_sync_all_streams = 2;
  st.num_device_alloc = 5;
  st.num_device_free = 1;
  st.max_split_size = 256 * kMiB;

  s.pools = {{0, 0, 4 * kMiB, 2 * kMiB, 6 * kMiB, 3 * kMiB},
             {5, 1, 2 * kMiB, 512, 2 * kMiB, 1024},
             {6, 2, 4 * kMiB, kMiB, 6 * kMiB, 2 * kMiB}};

  const std::int64_t t0 = s.time_us - 1000;
  s.history = {
      {HistoryAction::kSegmentAlloc, a, 4 * kMiB, 0, 0, t0, Stack("make_segment", 3), ""},
      {HistoryAction::kAlloc, a, kMiB, 0, 0, t0 + 1, Stack("forward", 10), "step 1 <fwd> & \"x\""},
      {HistoryAction::kAlloc, a + kMiB, kMiB / 2, 0, 0, t0 + 2, Stack("backward", 20), ""},
      {HistoryAction::kAlloc, a + 2 * kMiB, kMiB, 0, 0, t0 + 3, {}, ""},
      {HistoryAction::kFreeRequested, a + kMiB, kMiB / 2, 0, 0, t0 + 4, {}, ""},
      {HistoryAction::kSegmentAlloc, b, 2 * kMiB, 7, 5, t0 + 5, {}, "graph"},
      {HistoryAction::kAlloc, b, 512, 7, 5, t0 + 6, Stack("optimizer", 30), "graph"},
      {HistoryAction::kSegmentMap, c, 2 * kMiB, 0, 6, t0 + 7, {}, ""},
      {HistoryAction::kSegmentMap, c + 4 * kMiB, 2 * kMiB, 0, 6, t0 + 8, {}, ""},
      {HistoryAction::kAlloc, c, kMiB, 0, 6, t0 + 9, Stack("attention", 40), ""},
      {HistoryAction::kOom, 123 * kMiB, 80ull << 30, 0, 0, t0 + 10, {}, ""},
      {HistoryAction::kSnapshot, 0, 0, 0, 0, t0 + 11, {}, ""},
  };
  s.history_overflowed = true;
  s.history_max_entries = 12;
  // Events of the actions the timeline above does not need, for the round trips.
  s.history.insert(s.history.begin(),
                   {{HistoryAction::kSegmentUnmap, c + 2 * kMiB, 2 * kMiB, 0, 6, t0 - 3, {}, ""},
                    {HistoryAction::kSegmentFree, 0x7e0000000000, 2 * kMiB, 0, 0, t0 - 2, {}, ""},
                    {HistoryAction::kFreeCompleted, 0x7e0000000000, 512, 0, 0, t0 - 1, {}, ""}});
  return s;
}

MemorySnapshot MakeSleepingSnapshot() {
  MemorySnapshot s = EmptySnapshot("asleep", "expandable_segments:True");
  constexpr std::uint64_t a = kSleepingBase, b = kSleepingBase + 2 * kMiB;
  SegmentSnapshot seg;
  seg.address = a;
  seg.total_size = 8 * kMiB;
  seg.pool_id = 3;
  seg.kind = SegmentKind::kLarge;
  seg.expandable = true;
  seg.asleep = {{0, 6 * kMiB, true}};
  seg.blocks = {{a, 2 * kMiB, 2 * kMiB, BlockState::kAllocated, 0, {}, ""},
                {b, 6 * kMiB, 0, BlockState::kFree, 0, {}, ""}};
  s.segments = {seg};
  // The allocated block counts in the statistics; the sleeping memory in no reserved bytes.
  DeviceStats& st = s.stats;
  for (StatArray* arr : {&st.allocation, &st.active}) {
    (*arr)[StatType::kAggregate].current = (*arr)[StatType::kLargePool].current = 1;
  }
  for (StatArray* arr : {&st.allocated_bytes, &st.active_bytes, &st.requested_bytes}) {
    (*arr)[StatType::kAggregate].current = (*arr)[StatType::kLargePool].current = 2 * kMiB;
  }
  st.segment[StatType::kAggregate].current = st.segment[StatType::kLargePool].current = 1;
  s.pools = {{0, 0, 0, 0, 0, 0}, {3, 1, 0, 2 * kMiB, 6 * kMiB, 5 * kMiB}};
  const std::int64_t t0 = s.time_us - 100;
  s.history = {
      {HistoryAction::kSegmentMap, a, 2 * kMiB, 0, 0, t0, {}, ""},
      {HistoryAction::kSegmentMap, b, 4 * kMiB, 0, 0, t0 + 1, {}, ""},
      {HistoryAction::kAlloc, a, 2 * kMiB, 0, 0, t0 + 2, {}, ""},
      {HistoryAction::kAlloc, b, 3 * kMiB, 0, 0, t0 + 3, {}, ""},
      {HistoryAction::kSleep, a, 2 * kMiB, 0, 0, t0 + 4, {}, ""},
      {HistoryAction::kSleep, b, 4 * kMiB, 0, 0, t0 + 5, {}, ""},
      {HistoryAction::kWake, a, 2 * kMiB, 0, 0, t0 + 6, {}, ""},
      {HistoryAction::kWake, b, 4 * kMiB, 0, 0, t0 + 7, {}, ""},
      {HistoryAction::kFreeRequested, b, 3 * kMiB, 0, 0, t0 + 8, {}, ""},
      {HistoryAction::kFreeCompleted, b, 3 * kMiB, 0, 0, t0 + 9, {}, ""},
      {HistoryAction::kSleep, a, 2 * kMiB, 0, 0, t0 + 10, {}, ""},
      {HistoryAction::kSleep, b, 4 * kMiB, 0, 0, t0 + 11, {}, ""},
  };
  s.history_max_entries = 100;
  return s;
}

std::string TestDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir =
      std::filesystem::path(base != nullptr ? base : "/tmp") /
      absl::StrCat("graphalloc_snapshot_", getpid(), "_", info->test_suite_name(), "_", info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Cleaner().Add(dir);
  return dir.string();
}

}  // namespace graphalloc::testing

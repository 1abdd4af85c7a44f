// Soak: every shipped trace replayed 20 times through one allocator, on the selected device (the real GPU
// under the `gpu` label), each block written through the device as it is handed out. Nothing may
// accumulate: after each replay nothing is allocated, after emptying the cache nothing is reserved and the
// device's free memory is back where the first replay left it (every handle, mapping and reservation given
// back; on the simulated device its resource counters say so exactly), and every replay reports the same peak
// reserved bytes as the first (a leak of cached memory would show there first).
//
// On the simulated device the repeat count is scaled by GRAPHALLOC_TEST_SCALE (sanitizer stages), at
// least 2, so a second replay still meets what the first left behind.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/trace/trace_reader.h"
#include "graphalloc/allocator/trace/trace_replay.h"
#include "gtest/gtest.h"
#include "tests/testing/test_device.h"
#include "tests/testing/test_scale.h"

#ifndef GRAPHALLOC_TRACES_DIR
#error "GRAPHALLOC_TRACES_DIR must name the folder of the shipped traces"
#endif

namespace graphalloc {
namespace {

constexpr int kRepeats = 20;

int RepeatsHere() {
  if (!testing::OnSimulatedDevice()) return kRepeats;
  return testing::ScaledCount(kRepeats, /*extra=*/1.0, /*at_least=*/2);
}

class TraceSoakTest : public ::testing::TestWithParam<const char*> {};

TEST_P(TraceSoakTest, TwentyReplaysLeaveNothingBehind) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  absl::StatusOr<Trace> trace = ReadTrace(absl::StrCat(GRAPHALLOC_TRACES_DIR, "/", GetParam()));
  ASSERT_TRUE(trace.ok()) << trace.status();
  absl::StatusOr<std::unique_ptr<CachingAllocator>> created = CachingAllocator::Create(driver);
  ASSERT_TRUE(created.ok()) << created.status();
  CachingAllocator& allocator = **created;

  const int repeats = RepeatsHere();
  std::uint64_t first_peak_reserved = 0;
  std::size_t baseline_free = 0;  // after the first replay: the device's own lazy setup (modules, memset
                                  // kernels) happens during it and is not the allocator's
  std::size_t total_ops = 0;
  for (int i = 0; i < repeats; ++i) {
    absl::StatusOr<ReplayResult> r = ReplayTrace(*trace, allocator, ReplayOptions{.touch_memory = true});
    ASSERT_TRUE(r.ok()) << "replay " << i << ": " << r.status();
    ASSERT_TRUE(r->completed) << "replay " << i << ": "
                              << (r->failure.has_value() ? r->failure->where + " " + r->failure->message
                                                         : "");
    total_ops += r->allocs + r->frees;
    if (i == 0) first_peak_reserved = r->peak_reserved_bytes;
    // Each replay starts from an empty cache: the same decisions, so the same peak.
    EXPECT_EQ(r->peak_reserved_bytes, first_peak_reserved) << "replay " << i;
    const DeviceStats stats = allocator.GetStats();
    EXPECT_EQ(stats.allocated_bytes.all().current, 0) << "replay " << i;
    EXPECT_EQ(stats.active.all().current, 0) << "replay " << i;
    ASSERT_TRUE(allocator.CheckInvariants().ok()) << "replay " << i;
    ASSERT_TRUE(allocator.EmptyCache().ok()) << "replay " << i;
    EXPECT_EQ(allocator.GetStats().reserved_bytes.all().current, 0) << "replay " << i;
    absl::StatusOr<MemoryInfo> now = driver->GetMemoryInfo();
    ASSERT_TRUE(now.ok()) << now.status();
    if (i == 0) baseline_free = now->free;
    EXPECT_EQ(now->free, baseline_free) << "replay " << i << ": device memory not given back";
  }
  std::printf("soak %s on %s: %d replays, %zu allocator operations, peak reserved %llu bytes each time\n",
              GetParam(), testing::TestDeviceKind().c_str(), repeats, total_ops,
              static_cast<unsigned long long>(first_peak_reserved));
  created->reset();
  if (SimDriver* sim = testing::AsSim(driver.get())) {
    const SimCounters left = sim->Counters();
    EXPECT_EQ(left.reservations, 0u);
    EXPECT_EQ(left.handles, 0u);
    EXPECT_EQ(left.mappings, 0u);
    EXPECT_EQ(left.allocations, 0u);
    EXPECT_EQ(left.streams, 0u);
    EXPECT_EQ(left.events, 0u);
    EXPECT_EQ(left.illegal_accesses, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(ShippedTraces, TraceSoakTest,
                         ::testing::Values("gpt2_generate_varying.csv.gz", "gpt2_train.csv.gz",
                                           "resnet50_train.csv.gz"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           name = name.substr(0, name.find('.'));
                           return name;
                         });

}  // namespace
}  // namespace graphalloc

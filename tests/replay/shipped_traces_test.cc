// The three traces shipped in traces/ replay to completion on the simulated device, twice each, with the
// same numbers both times (the simulated device is deterministic), and leave nothing behind on the device.
// GRAPHALLOC_TEST_SCALE below 1 (the sanitizer builds) checks the invariants less often.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "graphalloc/allocator/trace/trace_reader.h"
#include "graphalloc/allocator/trace/trace_replay.h"
#include "gtest/gtest.h"
#include "tests/testing/test_scale.h"

#ifndef GRAPHALLOC_TRACES_DIR
#error "GRAPHALLOC_TRACES_DIR must name the folder of the shipped traces"
#endif

namespace graphalloc {
namespace {

struct ShippedTrace {
  const char* name;
  std::size_t allocs;
  std::size_t frees;
  std::uint64_t peak_live_bytes;  // from the trace itself (traces/README.md rounds it to MiB)
  std::size_t check_invariants_every;
};

class ShippedTraceTest : public ::testing::TestWithParam<ShippedTrace> {};

absl::StatusOr<ReplayResult> ReplayOnFreshSim(const Trace& trace, const ReplayOptions& options) {
  absl::StatusOr<std::unique_ptr<SimDriver>> sim = SimDriver::Create();
  if (!sim.ok()) return sim.status();
  std::shared_ptr<SimDriver> driver = std::move(*sim);
  absl::StatusOr<ReplayResult> result;
  {
    absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(driver);
    if (!allocator.ok()) return allocator.status();
    result = ReplayTrace(trace, **allocator, options);
    EXPECT_TRUE((*allocator)->CheckInvariants().ok());
  }
  const SimCounters left = driver->Counters();
  EXPECT_EQ(left.allocations, 0u);
  EXPECT_EQ(left.streams, 0u);
  EXPECT_EQ(left.events, 0u);
  return result;
}

TEST_P(ShippedTraceTest, CompletesWithTheSameNumbersTwice) {
  const ShippedTrace& want = GetParam();
  absl::StatusOr<Trace> trace = ReadTrace(absl::StrCat(GRAPHALLOC_TRACES_DIR, "/", want.name));
  ASSERT_TRUE(trace.ok()) << trace.status();
  // Under the sanitizers (GRAPHALLOC_TEST_SCALE below 1) the invariants, which dominate the run time, are
  // checked that much less often; the replays themselves stay whole.
  const double scale = std::min(1.0, testing::TestScale());
  const ReplayOptions options{.check_invariants_every = static_cast<std::size_t>(
                                  std::ceil(static_cast<double>(want.check_invariants_every) / scale))};
  absl::StatusOr<ReplayResult> first = ReplayOnFreshSim(*trace, options);
  absl::StatusOr<ReplayResult> second = ReplayOnFreshSim(*trace, options);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  for (const ReplayResult* r : {&*first, &*second}) {
    EXPECT_TRUE(r->completed) << (r->failure.has_value() ? r->failure->where + ": " + r->failure->message
                                                         : "");
    EXPECT_EQ(r->events, trace->events.size());
    EXPECT_EQ(r->allocs, want.allocs);
    EXPECT_EQ(r->frees, want.frees);
    EXPECT_EQ(r->peak_live_bytes, want.peak_live_bytes);
    // Regular segments: PyTorch's own default is 1.05-1.19 on these traces; the floor is 1.0.
    EXPECT_GE(r->ratio, 1.0);
    EXPECT_LE(r->ratio, 1.25);
  }
  EXPECT_EQ(first->peak_reserved_bytes, second->peak_reserved_bytes);
  EXPECT_EQ(first->ratio, second->ratio);
  RecordProperty("peak_live_bytes", std::to_string(first->peak_live_bytes));
  RecordProperty("peak_reserved_bytes", std::to_string(first->peak_reserved_bytes));
  std::printf("%s: peak live %llu, peak reserved %llu, ratio %.3f, %.1f ns/op\n", want.name,
              static_cast<unsigned long long>(first->peak_live_bytes),
              static_cast<unsigned long long>(first->peak_reserved_bytes), first->ratio, first->ns_per_op);
}

INSTANTIATE_TEST_SUITE_P(
    Traces, ShippedTraceTest,
    ::testing::Values(ShippedTrace{"gpt2_train.csv.gz", 6179, 6176, 7701353160, 1},
                      ShippedTrace{"resnet50_train.csv.gz", 3552, 3549, 3192592912, 1},
                      // 134k allocations: invariants every 1000 operations keeps the test to a few seconds.
                      ShippedTrace{"gpt2_generate_varying.csv.gz", 134763, 134761, 574953984, 1000}),
    [](const ::testing::TestParamInfo<ShippedTrace>& info) {
      std::string name = info.param.name;
      return name.substr(0, name.find('.'));
    });

}  // namespace
}  // namespace graphalloc

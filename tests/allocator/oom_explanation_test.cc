// An out-of-memory error that explains itself: on three states built to fail for one reason each (a graph
// pool holds the memory; fragmentation; another stream's cache), the error names that reason first, with
// its exact figures and only the remedies that apply, after the first sentence programs match. The C ABI
// carries the same message, and `graphalloc oom-report` says the same from a snapshot (oom_report_cli_test).
#include <string>

#include "gmock/gmock.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/snapshot/oom_report.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"

namespace graphalloc {
namespace {

using testing::AllocatorFixture;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

class OomExplanationTest : public AllocatorFixture {
 protected:
  // A simulated device of 64 MiB.
  void SetUpSmallDevice(Config config) {
    SimDriverOptions sim;
    sim.capacity = 64 * kMiB;
    MakeAllocator(config, sim);
  }
  static Config RegularSegments() {
    Config c;
    c.expandable_segments = false;
    return c;
  }
  // The text after "Why it could not be served, largest first:\n": the causes, one a line.
  static std::string Causes(const std::string& message) {
    const std::string head = "Why it could not be served, largest first:\n";
    const std::size_t at = message.find(head);
    if (at == std::string::npos) return "";
    return message.substr(at + head.size(), message.find("\nLargest", at) - at - head.size());
  }
  static std::string FirstCause(const std::string& message) {
    const std::string causes = Causes(message);
    return causes.substr(0, causes.find('\n'));
  }
  // Three 20 MiB regular segments on `stream`, each holding a 2 MiB live block and 18 MiB free.
  std::vector<DevicePtr> ThreeSplitSegments(Stream stream) {
    std::vector<DevicePtr> live, gone;
    for (int i = 0; i < 3; ++i) {  // each fills a segment: 2 + 9 + 9 MiB
      live.push_back(Alloc(2 * kMiB, stream));
      gone.push_back(Alloc(9 * kMiB, stream));
      gone.push_back(Alloc(9 * kMiB, stream));
    }
    for (DevicePtr p : gone) FreeOk(p);
    EXPECT_EQ(Stats().reserved_bytes.all().current, 60 * kMiB);
    return live;
  }
};

TEST_F(OomExplanationTest, AGraphPoolThatHoldsTheMemoryIsNamedFirst) {
  SetUpSmallDevice(Config{});
  PoolOptions options;
  options.owner = "graph tree 'train_step'";
  absl::StatusOr<PrivatePool> pool = allocator_->CreatePool(options);
  ASSERT_TRUE(pool.ok());
  absl::StatusOr<GraphPin> pin = allocator_->PinForGraph(*pool);
  ASSERT_TRUE(pin.ok());
  {
    absl::StatusOr<PoolRoute> route =
        allocator_->BeginAllocateToPool(*pool, PoolRouteFilter::ForCallingThread());
    ASSERT_TRUE(route.ok());
    const DevicePtr a = Alloc(24 * kMiB);
    const DevicePtr b = Alloc(16 * kMiB);
    FreeOk(a);  // free, but the pin keeps it reserved for the graph's replays
    FreeOk(b);
  }
  const DevicePtr keep = Alloc(4 * kMiB);
  absl::StatusOr<DevicePtr> failed = allocator_->Allocate(32 * kMiB);
  ASSERT_FALSE(failed.ok());
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(failed.status().message());
  EXPECT_THAT(message, StartsWith("out of memory: tried to allocate 32.00 MiB"));
  EXPECT_EQ(
      FirstCause(message),
      "  - 40.00 MiB held by private pool 1 (graph tree 'train_step', pinned by 1 graph), 40.00 MiB of it "
      "free");
  EXPECT_EQ(
      Causes(message),
      "  - 40.00 MiB held by private pool 1 (graph tree 'train_step', pinned by 1 graph), 40.00 MiB of it "
      "free\n  - 4.00 MiB held by 1 live allocation of the default pool (the largest are listed below)");
  EXPECT_THAT(message, HasSubstr("Request: 32.00 MiB on stream 0x0 for the default pool\n"));
  EXPECT_THAT(message,
              HasSubstr("Memory: device total 64.00 MiB, free 20.00 MiB; graphalloc reserved 44.00 MiB, "
                        "allocated 4.00 MiB; not held by graphalloc 0 bytes\n"));
  EXPECT_THAT(message, HasSubstr("Expandable segments: 44.00 MiB mapped of "));
  // The first thing to try is about the graphs, and it comes first on the first line too.
  EXPECT_THAT(message,
              HasSubstr("(cached); private pool 1 stays reserved while the graphs that replay into it "
                        "live"));
  EXPECT_THAT(message, Not(HasSubstr("expandable_segments:True")));  // they are on
  ExpectInvariants();
  FreeOk(keep);
}

TEST_F(OomExplanationTest, FragmentationIsNamedFirstWithItsLargestRunAndRatio) {
  SetUpSmallDevice(RegularSegments());
  const std::vector<DevicePtr> live = ThreeSplitSegments(kDefaultStream);
  absl::StatusOr<DevicePtr> failed = allocator_->Allocate(19 * kMiB);
  ASSERT_FALSE(failed.ok());
  const std::string message(failed.status().message());
  EXPECT_EQ(
      FirstCause(message),
      "  - fragmentation: 54.00 MiB free in the default pool for stream 0x0, but its largest contiguous "
      "run is 18.00 MiB, less than the 19.00 MiB asked (fragmentation 1 - largest / free = 67%)");
  EXPECT_THAT(Causes(message), HasSubstr("\n  - 6.00 MiB held by 3 live allocations of the default pool"));
  // Regular segments: the remedy is expandable segments, and it is the first thing to try.
  EXPECT_THAT(message, HasSubstr("(cached); set GRAPHALLOC_CONF=expandable_segments:True"));
  EXPECT_THAT(message, Not(HasSubstr("raise the allocator's cap")));  // no cap is set
  ExpectInvariants();
  for (DevicePtr p : live) FreeOk(p);
}

TEST_F(OomExplanationTest, AnotherStreamsCacheIsNamedFirstWithEachStream) {
  SetUpSmallDevice(RegularSegments());
  const Stream side = NewStream();
  const std::vector<DevicePtr> live = ThreeSplitSegments(side);
  absl::StatusOr<DevicePtr> failed = allocator_->Allocate(19 * kMiB);  // on the default stream
  ASSERT_FALSE(failed.ok());
  const std::string message(failed.status().message());
  EXPECT_EQ(
      FirstCause(message),
      absl::StrCat("  - 54.00 MiB free in the cache of other streams of the default pool, each block reused "
                   "only by the stream it was allocated on (stream ",
                   HexAddress(static_cast<std::uint64_t>(side)), ": 54.00 MiB, largest run 18.00 MiB)"));
  EXPECT_THAT(message, Not(HasSubstr("fragmentation:")));  // the default stream has no free memory
  EXPECT_THAT(message, HasSubstr("(cached); allocate on fewer streams"));
  ExpectInvariants();
  for (DevicePtr p : live) FreeOk(p);
}

TEST_F(OomExplanationTest, TheSnapshotAtTheFailureExplainsItTheSameWay) {
  SetUpSmallDevice(RegularSegments());
  ASSERT_TRUE(allocator_->RecordHistory({.enabled = true, .max_entries = 1000, .stacks = false}).ok());
  const std::vector<DevicePtr> live = ThreeSplitSegments(kDefaultStream);
  absl::StatusOr<DevicePtr> failed = allocator_->Allocate(19 * kMiB);
  ASSERT_FALSE(failed.ok());
  // Through a snapshot file, as `graphalloc oom-report` reads it.
  absl::StatusOr<MemorySnapshot> read =
      SnapshotFromJson(SnapshotToJson(allocator_->TakeSnapshot("oom")), "oom");
  ASSERT_TRUE(read.ok()) << read.status();
  absl::StatusOr<OomRequest> request = OomRequestFromHistory(*read);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->size, 19 * kMiB);
  const std::string message(failed.status().message());
  EXPECT_EQ(message.substr(message.find('\n') + 1), FormatOomReport(ExplainOutOfMemory(*read, *request)));
  for (DevicePtr p : live) FreeOk(p);
}

TEST_F(OomExplanationTest, AllLiveMemoryAndACapSayOnlyWhatApplies) {
  MakeAllocator(RegularSegments());
  allocator_->SetMemoryLimit(64 * kMiB);
  const DevicePtr a = Alloc(40 * kMiB);
  absl::StatusOr<DevicePtr> failed = allocator_->Allocate(40 * kMiB);
  ASSERT_FALSE(failed.ok());
  const std::string message(failed.status().message());
  EXPECT_EQ(Causes(message),
            "  - 40.00 MiB held by 1 live allocation of the default pool (the largest are listed below)");
  EXPECT_THAT(message, HasSubstr("(cached); raise the allocator's cap (64.00 MiB;"));
  EXPECT_THAT(message, HasSubstr("Largest live allocations:\n  - 40.00 MiB at "));
  EXPECT_THAT(message, Not(HasSubstr("expandable_segments:True")));  // nothing is fragmented
  FreeOk(a);
}

TEST(OomExplanationCApiTest, TheCApiMessageCarriesTheExplanation) {
  void* p = nullptr;
  ASSERT_EQ(graphalloc_set_memory_fraction(0.0001, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_malloc(&p, 64 * kMiB, 0, nullptr), GRAPHALLOC_OUT_OF_MEMORY);
  const std::string message = graphalloc_last_error();
  EXPECT_THAT(message, StartsWith("out of memory: tried to allocate 64.00 MiB"));
  EXPECT_THAT(message, HasSubstr("Why it could not be served, largest first:\n"));
  EXPECT_THAT(message, HasSubstr("What to try:\n  - raise the allocator's cap"));
  ASSERT_EQ(graphalloc_set_memory_fraction(1.0, 0), GRAPHALLOC_OK);
}

}  // namespace
}  // namespace graphalloc

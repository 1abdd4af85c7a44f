// The C ABI: codes, messages and the PyTorch entry points, through the process-wide allocators.
#include <cstddef>
#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "gtest/gtest.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The default allocators follow GRAPHALLOC_DEVICE; run them on the device under test.
    std::string skip;
    if (testing::DefaultAllocatorDriver(&skip) == nullptr) GTEST_SKIP() << skip;
  }
  void TearDown() override { testing::ExpectDefaultAllocatorsHoldNothing(); }
};

TEST(CApiVersionTest, VersionIsTheProjectVersion) {
  EXPECT_EQ(std::string(graphalloc_version()), "graphalloc " GRAPHALLOC_PROJECT_VERSION);
}

TEST_F(CApiTest, MallocAndFreeRoundTrip) {
  void* p = nullptr;
  ASSERT_EQ(graphalloc_malloc(&p, 1000, 0, nullptr), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_NE(p, nullptr);
  EXPECT_STREQ(graphalloc_last_error(), "");
  EXPECT_EQ(graphalloc_free(p, 0), GRAPHALLOC_OK);
}

TEST_F(CApiTest, TorchEntryPointsReuseTheCachedBlock) {
  void* a = graphalloc_torch_malloc(4096, 0, nullptr);
  ASSERT_NE(a, nullptr) << graphalloc_last_error();
  graphalloc_torch_free(a, 4096, 0, nullptr);
  void* b = graphalloc_torch_malloc(4096, 0, nullptr);
  EXPECT_EQ(b, a);
  graphalloc_torch_free(b, 4096, 0, nullptr);
}

TEST_F(CApiTest, FreeOfUnknownPointerReturnsInvalidArgumentWithMessage) {
  int dummy = 0;
  EXPECT_EQ(graphalloc_free(&dummy, 0), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("unknown pointer"));
}

TEST_F(CApiTest, FreeOnTheWrongDeviceIsAnError) {
  void* p = nullptr;
  ASSERT_EQ(graphalloc_malloc(&p, 512, 0, nullptr), GRAPHALLOC_OK);
  // Device 1 may not exist (then its allocator cannot be created); either way the block stays on device 0.
  EXPECT_NE(graphalloc_free(p, 1), GRAPHALLOC_OK);
  EXPECT_STRNE(graphalloc_last_error(), "");
  EXPECT_EQ(graphalloc_free(p, 0), GRAPHALLOC_OK);
}

TEST_F(CApiTest, BadArgumentsGetCodesNotCrashes) {
  EXPECT_EQ(graphalloc_malloc(nullptr, 16, 0, nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("NULL"));
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(graphalloc_malloc(&p, 16, -1, nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("device -1 is out of range"));
  EXPECT_EQ(graphalloc_malloc(&p, 16, 1000, nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_malloc(&p, (size_t{1} << 60) + 1, 0, nullptr), GRAPHALLOC_OUT_OF_MEMORY);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("more than 1 EiB"));
  EXPECT_EQ(graphalloc_torch_malloc((size_t{1} << 60) + 1, 0, nullptr), nullptr);
  EXPECT_EQ(graphalloc_record_stream(nullptr, 0, nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_set_memory_fraction(2.0, 0), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_free(nullptr, 0), GRAPHALLOC_OK);
  graphalloc_torch_free(nullptr, 0, 0, nullptr);
}

TEST_F(CApiTest, ZeroBytesGivesNull) {
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(graphalloc_malloc(&p, 0, 0, nullptr), GRAPHALLOC_OK);
  EXPECT_EQ(p, nullptr);
}

TEST_F(CApiTest, StatsJsonReportsTheAllocationAndChecksTheBufferSize) {
  ASSERT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_OK);
  ASSERT_EQ(graphalloc_reset_accumulated_stats(0), GRAPHALLOC_OK);
  void* p = nullptr;
  ASSERT_EQ(graphalloc_malloc(&p, 3000, 0, nullptr), GRAPHALLOC_OK);
  size_t required = 0;
  char tiny[8];
  EXPECT_EQ(graphalloc_stats_json(0, tiny, sizeof(tiny), &required), GRAPHALLOC_BUFFER_TOO_SMALL);
  ASSERT_GT(required, sizeof(tiny));
  std::string buffer(required, '\0');
  ASSERT_EQ(graphalloc_stats_json(0, buffer.data(), buffer.size(), &required), GRAPHALLOC_OK);
  EXPECT_THAT(buffer, HasSubstr("\"allocated_bytes.all.current\": 3072"));
  EXPECT_THAT(buffer, HasSubstr("\"allocation.all.allocated\": 1"));
  EXPECT_EQ(graphalloc_free(p, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_reset_peak_stats(0), GRAPHALLOC_OK);
}

TEST_F(CApiTest, SnapshotJsonParsesBackAndShowsTheHistory) {
  ASSERT_EQ(graphalloc_record_history(0, 1, 1000, 0), GRAPHALLOC_OK) << graphalloc_last_error();
  void* p = nullptr;
  ASSERT_EQ(graphalloc_malloc(&p, 6000, 0, nullptr), GRAPHALLOC_OK);
  size_t required = 0;
  EXPECT_EQ(graphalloc_snapshot_json(0, nullptr, 0, &required), GRAPHALLOC_BUFFER_TOO_SMALL);
  std::string buffer(required + 4096, '\0');  // the snapshot event itself may add a little
  ASSERT_EQ(graphalloc_snapshot_json(0, buffer.data(), buffer.size(), &required), GRAPHALLOC_OK)
      << graphalloc_last_error();
  absl::StatusOr<MemorySnapshot> snapshot = SnapshotFromJson(buffer.c_str(), "c_api");
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  bool found = false;
  for (const SegmentSnapshot& segment : snapshot->segments) {
    for (const BlockSnapshot& block : segment.blocks) {
      found |= block.address == reinterpret_cast<std::uintptr_t>(p) &&
               block.state == BlockState::kAllocated && block.requested_size == 6000;
    }
  }
  EXPECT_TRUE(found);
  ASSERT_FALSE(snapshot->history.empty());
  // The size query above took a snapshot too: its event is there, after which the allocation is the last
  // action (the snapshot's own event comes after its history).
  const HistoryEvent* last = LastAction(*snapshot);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->action, HistoryAction::kAlloc);
  EXPECT_EQ(last->address, reinterpret_cast<std::uintptr_t>(p));
  EXPECT_EQ(graphalloc_record_history(0, 0, 0, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_record_history(0, 1, 0, 0), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_free(p, 0), GRAPHALLOC_OK);
}

TEST_F(CApiTest, TorchRecordStreamFindsTheOwningAllocator) {
  void* p = nullptr;
  ASSERT_EQ(graphalloc_malloc(&p, 512, 0, nullptr), GRAPHALLOC_OK);
  graphalloc_torch_record_stream(p, nullptr);  // the allocation stream itself: accepted, no effect
  EXPECT_STREQ(graphalloc_last_error(), "");
  int dummy = 0;
  graphalloc_torch_record_stream(&dummy, nullptr);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("unknown pointer"));
  EXPECT_EQ(graphalloc_free(p, 0), GRAPHALLOC_OK);
}

// GRAPHALLOC_SIM_MEMORY_MB is read when a device's allocator is created: this test uses devices 60 and 61,
// which no other test here touches, and restores the environment.
TEST(CApiSimMemoryTest, SimulatedDeviceHasTheMemoryTheEnvironmentGivesIt) {
  if (testing::TestDeviceKind() != "sim")
    GTEST_SKIP() << "GRAPHALLOC_SIM_MEMORY_MB sizes the simulated device";
  ASSERT_EQ(::setenv("GRAPHALLOC_SIM_MEMORY_MB", "64", 1), 0);
  void* first = nullptr;
  ASSERT_EQ(graphalloc_malloc(&first, std::size_t{48} << 20, 60, nullptr), GRAPHALLOC_OK)
      << graphalloc_last_error();
  void* second = nullptr;
  EXPECT_EQ(graphalloc_malloc(&second, std::size_t{48} << 20, 60, nullptr), GRAPHALLOC_OUT_OF_MEMORY);
  EXPECT_EQ(second, nullptr);
  EXPECT_EQ(graphalloc_free(first, 60), GRAPHALLOC_OK);
  ASSERT_EQ(graphalloc_malloc(&second, std::size_t{48} << 20, 60, nullptr), GRAPHALLOC_OK)
      << graphalloc_last_error();
  EXPECT_EQ(graphalloc_free(second, 60), GRAPHALLOC_OK);

  ASSERT_EQ(::setenv("GRAPHALLOC_SIM_MEMORY_MB", "4GiB", 1), 0);
  void* p = nullptr;
  EXPECT_EQ(graphalloc_malloc(&p, 512, 61, nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("GRAPHALLOC_SIM_MEMORY_MB must be a whole number of MiB"));
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("'4GiB'"));
  ASSERT_EQ(::unsetenv("GRAPHALLOC_SIM_MEMORY_MB"), 0);
  ASSERT_EQ(graphalloc_malloc(&p, std::size_t{48} << 20, 61, nullptr), GRAPHALLOC_OK)
      << graphalloc_last_error();
  void* more = nullptr;  // the default 80 GiB device
  ASSERT_EQ(graphalloc_malloc(&more, std::size_t{48} << 20, 61, nullptr), GRAPHALLOC_OK)
      << graphalloc_last_error();
  EXPECT_EQ(graphalloc_free(more, 61), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_free(p, 61), GRAPHALLOC_OK);
  testing::ExpectDefaultAllocatorsHoldNothing();
}

}  // namespace
}  // namespace graphalloc

// The C ABI of sharing blocks (graphalloc_export_block & co.), through the process-wide allocators with
// GRAPHALLOC_CONF=shareable_handles:True: a block exported and imported into this same process (CUDA allows
// importing one's own shareable handles; other processes are block_sharing_test's), the token buffer's
// size, revoking, and bad tokens reported as codes with their reason.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/device/driver.h"
#include "gtest/gtest.h"
#include "tests/ipc/ipc_pattern.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;

class CApiIpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Read when the process-wide allocator is created, which happens below.
    setenv("GRAPHALLOC_CONF", "shareable_handles:True", /*overwrite=*/1);
    std::string skip;
    driver_ = testing::DefaultAllocatorDriver(&skip);
    if (driver_ == nullptr) GTEST_SKIP() << skip;
  }
  void TearDown() override { testing::ExpectDefaultAllocatorsHoldNothing(); }

  Driver* driver_ = nullptr;
};

TEST_F(CApiIpcTest, ExportedBlockImportsAndSharesItsBytes) {
  void* ptr = nullptr;
  ASSERT_EQ(graphalloc_malloc(&ptr, 4 * kMiB, 0, nullptr), GRAPHALLOC_OK) << graphalloc_last_error();
  const std::vector<std::uint8_t> pattern = testing::IpcPattern(4 * kMiB, 9);
  ASSERT_OK(driver_->CopyHostToDevice(reinterpret_cast<DevicePtr>(ptr), pattern.data(), pattern.size()));
  char small[8];
  EXPECT_EQ(graphalloc_export_block(ptr, 0, small, sizeof(small)), GRAPHALLOC_BUFFER_TOO_SMALL);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("bytes"));
  char token[256];
  ASSERT_EQ(graphalloc_export_block(ptr, 0, token, sizeof(token)), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_THAT(std::string(token), ::testing::StartsWith("graphalloc-ipc:1:"));
  void* imported = nullptr;
  graphalloc_import_t* import = nullptr;
  ASSERT_EQ(graphalloc_import_block(0, token, &imported, &import), GRAPHALLOC_OK) << graphalloc_last_error();
  ASSERT_NE(import, nullptr);
  EXPECT_NE(imported, ptr);  // its own mapping of the same memory
  std::vector<std::uint8_t> seen(4 * kMiB);
  ASSERT_OK(driver_->CopyDeviceToHost(seen.data(), reinterpret_cast<DevicePtr>(imported), seen.size()));
  EXPECT_TRUE(seen == pattern);
  EXPECT_EQ(graphalloc_import_close(import), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(graphalloc_export_revoke(ptr, 0), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(graphalloc_export_revoke(ptr, 0), GRAPHALLOC_INVALID_ARGUMENT);  // not exported any more
  EXPECT_EQ(graphalloc_free(ptr, 0), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_OK);
}

TEST_F(CApiIpcTest, BadTokenAndNullArgumentsAreInvalidArgument) {
  void* imported = nullptr;
  graphalloc_import_t* import = nullptr;
  EXPECT_EQ(graphalloc_import_block(0, "garbage", &imported, &import), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("not a graphalloc export token"));
  EXPECT_EQ(import, nullptr);
  EXPECT_EQ(graphalloc_import_block(0, nullptr, &imported, &import), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_import_close(nullptr), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_export_block(nullptr, 0, nullptr, 0), GRAPHALLOC_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace graphalloc

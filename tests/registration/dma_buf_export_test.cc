// dma-buf export (Driver::MemGetDmaBufFd, DmaBufExport) on the simulated device: the descriptor of a mapped
// range holds the range's bytes; the observer hands one descriptor per mapping to its callback once mapped,
// gives it back before the unmap and closes it; a range that is not mapped is an error.
#include "graphalloc/allocator/registration/dma_buf_export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class DmaBufExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SimDriver>> sim = SimDriver::Create();
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = std::shared_ptr<SimDriver>(std::move(*sim));
    absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(sim_);
    ASSERT_TRUE(allocator.ok()) << allocator.status();
    allocator_ = std::move(*allocator);
  }
  DevicePtr Alloc(std::size_t bytes) {
    absl::StatusOr<DevicePtr> p = allocator_->Allocate(bytes);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_OK(allocator_->CheckInvariants());
    return p.ok() ? *p : 0;
  }

  std::shared_ptr<SimDriver> sim_;
  std::unique_ptr<CachingAllocator> allocator_;
};

TEST_F(DmaBufExportTest, TheDescriptorOfAMappedRangeHoldsItsBytes) {
  const DevicePtr p = Alloc(2 * kMiB);
  std::vector<std::uint8_t> data(2 * kMiB);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 7 + 3);
  ASSERT_OK(sim_->CopyHostToDevice(p, data.data(), data.size()));
  // A page-aligned sub-range, as an RDMA registration of part of a chunk would ask.
  absl::StatusOr<int> fd = sim_->MemGetDmaBufFd(p + 4096, 8192);
  ASSERT_TRUE(fd.ok()) << fd.status();
  struct stat st {};
  ASSERT_EQ(fstat(*fd, &st), 0);
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), 8192u);
  std::vector<std::uint8_t> read(8192);
  ASSERT_EQ(pread(*fd, read.data(), read.size(), 0), 8192);
  EXPECT_EQ(read, std::vector<std::uint8_t>(data.begin() + 4096, data.begin() + 4096 + 8192));
  close(*fd);
  EXPECT_EQ(sim_->CallCount(SimCall::kMemGetDmaBufFd), 1u);
  ASSERT_OK(allocator_->Free(p));
}

TEST_F(DmaBufExportTest, ARangeThatIsNotMappedIsAnError) {
  const DevicePtr p = Alloc(2 * kMiB);
  // The reservation goes on past the mapped chunk.
  EXPECT_FALSE(sim_->MemGetDmaBufFd(p, 4 * kMiB).ok());
  EXPECT_FALSE(sim_->MemGetDmaBufFd(p + 1, 4096).ok());  // not page-aligned
  ASSERT_OK(allocator_->Free(p));
}

TEST_F(DmaBufExportTest, EachMappingIsExportedOnceAndClosedWhenItGoes) {
  std::map<DevicePtr, int> exported;  // what the callbacks hold, by mapping
  std::vector<int> released;
  auto observer = std::make_shared<DmaBufExport>(
      *sim_, [&](const MappingEvent& e, int fd) { exported.emplace(e.ptr, fd); },
      [&](const MappingEvent& e, int fd) {
        EXPECT_EQ(exported.at(e.ptr), fd);
        EXPECT_NE(fcntl(fd, F_GETFD), -1);  // still open while the NIC deregisters it
        exported.erase(e.ptr);
        released.push_back(fd);
      });
  ASSERT_OK(allocator_->AddMappingObserver(observer));
  const DevicePtr p = Alloc(2 * kMiB);
  ASSERT_EQ(exported.size(), 1u);
  EXPECT_EQ(exported.begin()->first, p);
  struct stat st {};
  ASSERT_EQ(fstat(exported.begin()->second, &st), 0);
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), 2 * kMiB);
  EXPECT_EQ(observer->exported(), 1u);
  ASSERT_OK(allocator_->Free(p));
  ASSERT_OK(allocator_->EmptyCache());
  EXPECT_TRUE(exported.empty());
  EXPECT_EQ(released.size(), 1u);
  EXPECT_EQ(observer->exported(), 0u);
  EXPECT_OK(observer->status());
  EXPECT_EQ(observer->errors(), 0u);
  ASSERT_OK(allocator_->RemoveMappingObserver(observer.get()));
}

TEST_F(DmaBufExportTest, AFailedExportIsKeptAndTheMappingStillServes) {
  auto observer = std::make_shared<DmaBufExport>(*sim_, [](const MappingEvent&, int) {});
  ASSERT_OK(allocator_->AddMappingObserver(observer));
  sim_->InjectFault(SimCall::kMemGetDmaBufFd, 1, DriverResult::kOutOfMemory);
  const DevicePtr p = Alloc(2 * kMiB);
  EXPECT_NE(p, 0u);
  EXPECT_EQ(observer->errors(), 1u);
  EXPECT_NE(observer->status().message().find("dma-buf export of the mapping at"), std::string::npos)
      << observer->status();
  EXPECT_EQ(observer->exported(), 0u);
  ASSERT_OK(allocator_->Free(p));
  ASSERT_OK(allocator_->EmptyCache());
  ASSERT_OK(allocator_->RemoveMappingObserver(observer.get()));
}

}  // namespace
}  // namespace graphalloc

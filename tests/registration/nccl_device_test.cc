// NcclRegistration with the real NCCL on the real GPU (the gpu twin): a one-rank communicator
// (ncclGetUniqueId + ncclCommInitRank, found with dlsym in the library NcclLibrary loads) registers a
// graphalloc buffer and deregisters it when it is unmapped. Skipped, saying why, on the simulated device or
// where libnccl.so.2 (or GRAPHALLOC_NCCL_LIBRARY) is not found.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/registration/nccl_library.h"
#include "graphalloc/allocator/registration/nccl_registration.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// NCCL's ncclUniqueId (NCCL_UNIQUE_ID_BYTES = 128), passed by value as NCCL declares it.
struct NcclUniqueId {
  char internal[128];
};
using GetUniqueIdFn = int (*)(NcclUniqueId* id);
using CommInitRankFn = int (*)(void** comm, int nranks, NcclUniqueId id, int rank);
using CommDestroyFn = int (*)(void* comm);

TEST(NcclDeviceTest, AOneRankCommunicatorRegistersAGraphallocBuffer) {
  if (testing::OnSimulatedDevice()) GTEST_SKIP() << "needs a real GPU and NCCL (the gpu twin runs it)";
  std::string skip;
  std::shared_ptr<Driver> driver = testing::MakeTestDriver(&skip);
  if (driver == nullptr) GTEST_SKIP() << skip;
  absl::StatusOr<const NcclLibrary*> nccl = NcclLibrary::Load();
  if (!nccl.ok()) GTEST_SKIP() << "NCCL not found: " << nccl.status();
  auto get_unique_id = reinterpret_cast<GetUniqueIdFn>((*nccl)->Symbol("ncclGetUniqueId"));
  auto init_rank = reinterpret_cast<CommInitRankFn>((*nccl)->Symbol("ncclCommInitRank"));
  auto destroy = reinterpret_cast<CommDestroyFn>((*nccl)->Symbol("ncclCommDestroy"));
  ASSERT_TRUE(get_unique_id != nullptr && init_rank != nullptr && destroy != nullptr);
  NcclUniqueId id{};
  const int got = get_unique_id(&id);
  ASSERT_EQ(got, 0) << (*nccl)->Error("ncclGetUniqueId", got);
  void* comm = nullptr;
  const int init = init_rank(&comm, 1, id, 0);
  ASSERT_EQ(init, 0) << (*nccl)->Error("ncclCommInitRank", init);

  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(driver);
  ASSERT_TRUE(allocator.ok()) << allocator.status();
  absl::StatusOr<std::shared_ptr<NcclRegistration>> registration = NcclRegistration::Create(comm);
  ASSERT_TRUE(registration.ok()) << registration.status();
  ASSERT_OK((*allocator)->AddMappingObserver(*registration, /*replay_existing=*/true));
  absl::StatusOr<DevicePtr> p = (*allocator)->Allocate(4 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_OK((*registration)->status());
  EXPECT_GE((*registration)->registered(), 1u);
  ASSERT_OK((*allocator)->Free(*p));
  ASSERT_OK((*allocator)->EmptyCache());
  EXPECT_EQ((*registration)->registered(), 0u);
  EXPECT_OK((*registration)->status());
  ASSERT_OK((*allocator)->RemoveMappingObserver(registration->get()));
  ASSERT_OK((*allocator)->CheckInvariants());
  allocator->reset();
  EXPECT_EQ(destroy(comm), 0);
}

}  // namespace
}  // namespace graphalloc

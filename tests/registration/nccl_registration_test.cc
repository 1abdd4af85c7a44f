// NcclRegistration against a fake libnccl (fake_nccl.cc): every mapping of the allocator is registered
// with the communicator once it is mapped and deregistered before it is unmapped, a late observer registers
// what exists, NCCL's errors are kept with NCCL's error string, and a library that cannot be loaded says
// which and why.
#include "graphalloc/allocator/registration/nccl_registration.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// The fake library's controls, from the same loaded copy NcclLibrary::Load() opens.
struct FakeNccl {
  int (*register_calls)() = nullptr;
  int (*deregister_calls)() = nullptr;
  int (*live)(void** buffer, std::size_t* size) = nullptr;
  void* (*last_comm)() = nullptr;
  void (*fail_next_register)(int result) = nullptr;
};

class NcclRegistrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(setenv("GRAPHALLOC_NCCL_LIBRARY", GRAPHALLOC_FAKE_NCCL, 1), 0);
    void* handle = dlopen(GRAPHALLOC_FAKE_NCCL, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle, nullptr) << dlerror();
    fake_.register_calls = reinterpret_cast<int (*)()>(dlsym(handle, "fake_nccl_register_calls"));
    fake_.deregister_calls = reinterpret_cast<int (*)()>(dlsym(handle, "fake_nccl_deregister_calls"));
    fake_.live = reinterpret_cast<int (*)(void**, std::size_t*)>(dlsym(handle, "fake_nccl_live"));
    fake_.last_comm = reinterpret_cast<void* (*)()>(dlsym(handle, "fake_nccl_last_comm"));
    fake_.fail_next_register = reinterpret_cast<void (*)(int)>(dlsym(handle, "fake_nccl_fail_next_register"));
    ASSERT_TRUE(fake_.register_calls && fake_.deregister_calls && fake_.live && fake_.last_comm &&
                fake_.fail_next_register);
    absl::StatusOr<std::unique_ptr<SimDriver>> sim = SimDriver::Create();
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = std::shared_ptr<SimDriver>(std::move(*sim));
    absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(sim_);
    ASSERT_TRUE(allocator.ok()) << allocator.status();
    allocator_ = std::move(*allocator);
    registered_before_ = fake_.live(nullptr, nullptr);
  }
  void TearDown() override {
    if (allocator_ != nullptr) {
      EXPECT_OK(allocator_->CheckInvariants());
      allocator_.reset();
    }
    unsetenv("GRAPHALLOC_NCCL_LIBRARY");
  }

  DevicePtr Alloc(std::size_t bytes) {
    absl::StatusOr<DevicePtr> p = allocator_->Allocate(bytes);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_OK(allocator_->CheckInvariants());
    return p.ok() ? *p : 0;
  }
  int Live() { return fake_.live(nullptr, nullptr) - registered_before_; }

  FakeNccl fake_;
  std::shared_ptr<SimDriver> sim_;
  std::unique_ptr<CachingAllocator> allocator_;
  int registered_before_ = 0;
  void* const comm_ = reinterpret_cast<void*>(std::uintptr_t{0xc0ffee});
};

TEST_F(NcclRegistrationTest, EveryMappingIsRegisteredWhileItExists) {
  absl::StatusOr<std::shared_ptr<NcclRegistration>> nccl = NcclRegistration::Create(comm_);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  ASSERT_OK(allocator_->AddMappingObserver(*nccl));
  const int calls = fake_.register_calls();
  const DevicePtr p = Alloc(2 * kMiB);
  EXPECT_EQ(fake_.register_calls(), calls + 1);
  EXPECT_EQ(fake_.last_comm(), comm_);
  void* buffer = nullptr;
  std::size_t size = 0;
  EXPECT_EQ(fake_.live(&buffer, &size), registered_before_ + 1);
  EXPECT_EQ(reinterpret_cast<DevicePtr>(buffer), p);
  EXPECT_EQ(size, 2 * kMiB);
  EXPECT_EQ((*nccl)->registered(), 1u);
  ASSERT_OK(allocator_->Free(p));
  EXPECT_EQ(Live(), 1);  // cached: still mapped, still registered
  ASSERT_OK(allocator_->EmptyCache());
  EXPECT_EQ(Live(), 0);
  EXPECT_EQ((*nccl)->registered(), 0u);
  EXPECT_OK((*nccl)->status());
  ASSERT_OK(allocator_->RemoveMappingObserver(nccl->get()));
}

TEST_F(NcclRegistrationTest, APoolsRegistrationRegistersOnlyThatPoolsMappings) {
  PoolOptions options;
  options.communication = true;
  options.handle_aligned = true;
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool(options));
  absl::StatusOr<std::shared_ptr<NcclRegistration>> nccl = NcclRegistration::CreateForPool(comm_, pool.id());
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  ASSERT_OK(allocator_->AddMappingObserver(*nccl, /*replay_existing=*/true));
  const DevicePtr outside = Alloc(4 * kMiB);  // the default pool: not registered
  EXPECT_EQ(Live(), 0);
  DevicePtr inside = 0;
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute route,
                         allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread()));
    inside = Alloc(6 * kMiB);
    ASSERT_OK(route.End());
  }
  void* buffer = nullptr;
  std::size_t size = 0;
  ASSERT_EQ(fake_.live(&buffer, &size), registered_before_ + 1);
  // Handle-aligned: the one registration covers the whole block.
  EXPECT_LE(reinterpret_cast<DevicePtr>(buffer), inside);
  EXPECT_GE(reinterpret_cast<DevicePtr>(buffer) + size, inside + 6 * kMiB);
  ASSERT_OK(allocator_->Free(inside));
  ASSERT_OK(allocator_->EmptyCache());
  EXPECT_EQ(Live(), 1);  // a communication pool's mapping stays, registered
  ASSERT_OK(allocator_->Free(outside));
  ASSERT_OK(allocator_->RemoveMappingObserver(nccl->get()));
  ASSERT_OK((*nccl)->DeregisterAll());
  EXPECT_EQ(Live(), 0);
}

TEST_F(NcclRegistrationTest, ALateRegistrationRegistersWhatIsMappedAndDeregistersAll) {
  const DevicePtr p = Alloc(2 * kMiB);
  const DevicePtr q = Alloc(4 * kMiB);
  absl::StatusOr<std::shared_ptr<NcclRegistration>> nccl = NcclRegistration::Create(comm_);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  ASSERT_OK(allocator_->AddMappingObserver(*nccl, /*replay_existing=*/true));
  EXPECT_EQ(Live(), static_cast<int>((*nccl)->registered()));
  EXPECT_GE(Live(), 1);
  ASSERT_OK(allocator_->RemoveMappingObserver(nccl->get()));
  ASSERT_OK((*nccl)->DeregisterAll());  // before ncclCommDestroy
  EXPECT_EQ(Live(), 0);
  ASSERT_OK(allocator_->Free(p));
  ASSERT_OK(allocator_->Free(q));
}

TEST_F(NcclRegistrationTest, AnNcclErrorIsKeptWithNcclsErrorString) {
  absl::StatusOr<std::shared_ptr<NcclRegistration>> nccl = NcclRegistration::Create(comm_);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  ASSERT_OK(allocator_->AddMappingObserver(*nccl));
  fake_.fail_next_register(5);
  const DevicePtr p = Alloc(2 * kMiB);  // the allocation itself succeeds
  const absl::Status s = (*nccl)->status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("ncclCommRegister of the mapping at"));
  EXPECT_THAT(s.message(), HasSubstr("NCCL error 5 (invalid usage (fake))"));
  EXPECT_EQ((*nccl)->errors(), 1u);
  EXPECT_EQ((*nccl)->registered(), 0u);
  const int deregisters = fake_.deregister_calls();
  ASSERT_OK(allocator_->Free(p));
  ASSERT_OK(allocator_->EmptyCache());
  EXPECT_EQ(fake_.deregister_calls(), deregisters);  // nothing was registered to undo
  EXPECT_EQ((*nccl)->errors(), 1u);
  ASSERT_OK(allocator_->RemoveMappingObserver(nccl->get()));
}

TEST_F(NcclRegistrationTest, ALibraryThatCannotBeLoadedSaysWhichAndWhy) {
  ASSERT_EQ(setenv("GRAPHALLOC_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1), 0);
  absl::StatusOr<std::shared_ptr<NcclRegistration>> nccl = NcclRegistration::Create(comm_);
  EXPECT_TRUE(absl::IsUnavailable(nccl.status())) << nccl.status();
  EXPECT_THAT(nccl.status().message(), HasSubstr("/nonexistent/libnccl.so.2"));
  EXPECT_THAT(nccl.status().message(), HasSubstr("GRAPHALLOC_NCCL_LIBRARY"));
  EXPECT_TRUE(absl::IsInvalidArgument(NcclRegistration::Create(nullptr).status()));
}

}  // namespace
}  // namespace graphalloc

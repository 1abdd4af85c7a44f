#include "tests/testing/allocator_fixture.h"

namespace graphalloc::testing {

void AllocatorFixture::MakeAllocator(Config config, SimDriverOptions sim_options) {
  driver_ = MakeTestDriver(&skip_reason_, sim_options);
  if (driver_ == nullptr) return;
  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(driver_, config);
  ASSERT_TRUE(allocator.ok()) << allocator.status();
  allocator_ = std::move(*allocator);
}

DevicePtr AllocatorFixture::Alloc(std::size_t bytes, Stream stream) {
  absl::StatusOr<DevicePtr> ptr = allocator_->Allocate(bytes, stream);
  EXPECT_TRUE(ptr.ok()) << "Allocate(" << bytes << "): " << ptr.status();
  ExpectInvariants();
  return ptr.ok() ? *ptr : 0;
}

void AllocatorFixture::FreeOk(DevicePtr ptr) {
  absl::Status s = allocator_->Free(ptr);
  EXPECT_TRUE(s.ok()) << s;
  ExpectInvariants();
}

void AllocatorFixture::ExpectInvariants() {
  absl::Status s = allocator_->CheckInvariants();
  EXPECT_TRUE(s.ok()) << s;
}

Stream AllocatorFixture::NewStream() {
  absl::StatusOr<Stream> s = driver_->StreamCreate();
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return kDefaultStream;
  streams_.push_back(*s);
  return *s;
}

void AllocatorFixture::TearDown() {
  if (driver_ == nullptr) return;
  (void)driver_->DeviceSynchronize();
  allocator_.reset();
  // Work that ran on memory unmapped under it would have faulted on a GPU (SimCounters::illegal_accesses).
  if (SimDriver* sim = AsSim(driver_.get())) {
    EXPECT_EQ(sim->Counters().illegal_accesses, 0u);
  }
  for (Stream s : streams_) EXPECT_TRUE(driver_->StreamDestroy(s).ok());
}

}  // namespace graphalloc::testing

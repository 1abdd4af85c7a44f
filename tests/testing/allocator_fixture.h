// A test fixture owning a driver for the selected device and a CachingAllocator on it, with helpers that
// check the allocator's invariants after every step.
#ifndef GRAPHALLOC_TESTS_TESTING_ALLOCATOR_FIXTURE_H_
#define GRAPHALLOC_TESTS_TESTING_ALLOCATOR_FIXTURE_H_

#include <memory>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "gtest/gtest.h"
#include "tests/testing/test_device.h"

namespace graphalloc::testing {

class AllocatorFixture : public ::testing::Test {
 protected:
  // Creates driver_ and allocator_; sets skipped_ when the selected device is unavailable (the caller
  // must then GTEST_SKIP, which the GRAPHALLOC_ALLOCATOR_SETUP macro does).
  void MakeAllocator(Config config = {}, SimDriverOptions sim_options = {});

  // Allocate, expecting success, then check invariants. Returns 0 on failure (the test has failed).
  DevicePtr Alloc(std::size_t bytes, Stream stream = kDefaultStream);
  void FreeOk(DevicePtr ptr);
  void ExpectInvariants();
  DeviceStats Stats() const { return allocator_->GetStats(); }
  Stream NewStream();

  void TearDown() override;

  std::shared_ptr<Driver> driver_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::vector<Stream> streams_;
  std::string skip_reason_;
};

}  // namespace graphalloc::testing

// Builds the allocator for the selected device or skips the test.
#define GRAPHALLOC_ALLOCATOR_SETUP(...)                 \
  MakeAllocator(__VA_ARGS__);                           \
  if (driver_ == nullptr) GTEST_SKIP() << skip_reason_; \
  ASSERT_NE(allocator_, nullptr)

#endif  // GRAPHALLOC_TESTS_TESTING_ALLOCATOR_FIXTURE_H_

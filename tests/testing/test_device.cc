#include "tests/testing/test_device.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/core/default_allocator.h"
#include "graphalloc/allocator/device/cuda_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"

namespace graphalloc::testing {

std::string TestDeviceKind() {
  const char* kind = std::getenv("GRAPHALLOC_TEST_DEVICE");
  return (kind == nullptr || *kind == '\0') ? "sim" : kind;
}

bool OnSimulatedDevice() { return TestDeviceKind() == "sim"; }

std::shared_ptr<Driver> MakeTestDriver(std::string* skip_reason, SimDriverOptions sim_options) {
  const std::string kind = TestDeviceKind();
  if (kind == "sim") {
    auto sim = SimDriver::Create(sim_options);
    if (!sim.ok()) {
      *skip_reason = std::string(sim.status().message());
      return nullptr;
    }
    return std::shared_ptr<Driver>(std::move(*sim));
  }
  if (kind == "cuda") {
    auto cuda = CudaDriver::Create(0);
    if (!cuda.ok()) {
      *skip_reason = "no usable GPU: " + std::string(cuda.status().message());
      return nullptr;
    }
    return std::shared_ptr<Driver>(std::move(*cuda));
  }
  *skip_reason = "GRAPHALLOC_TEST_DEVICE must be 'sim' or 'cuda', not '" + kind + "'";
  return nullptr;
}

Driver* DefaultAllocatorDriver(std::string* skip_reason) {
  ::setenv("GRAPHALLOC_DEVICE", TestDeviceKind().c_str(), 1);
  if (MakeTestDriver(skip_reason) == nullptr) return nullptr;
  absl::StatusOr<CachingAllocator*> allocator = DefaultAllocator(0);
  if (!allocator.ok()) {
    *skip_reason = "the default allocator of device 0: " + std::string(allocator.status().message());
    return nullptr;
  }
  return &(*allocator)->driver();
}

void ExpectDefaultAllocatorsHoldNothing() {
  for (int device = 0; device < kMaxDevices; ++device) {
    CachingAllocator* allocator = ExistingDefaultAllocator(device);
    if (allocator == nullptr) continue;
    SCOPED_TRACE(absl::StrCat("default allocator of device ", device));
    EXPECT_OK(allocator->EmptyCache());
    EXPECT_OK(allocator->CheckInvariants());
    const DeviceStats stats = allocator->GetStats();
    EXPECT_EQ(stats.allocated_bytes.all().current, 0);
    EXPECT_EQ(stats.reserved_bytes.all().current, 0);
  }
}

SimDriver* AsSim(Driver* driver) {
  return driver != nullptr && driver->Kind() == "sim" ? static_cast<SimDriver*>(driver) : nullptr;
}

}  // namespace graphalloc::testing

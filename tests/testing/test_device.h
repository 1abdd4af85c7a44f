// Picks the device a test runs on: the simulated device by default, the real GPU when the environment
// variable GRAPHALLOC_TEST_DEVICE=cuda (CTest's `gpu`-labelled entries set it). Tests are written once
// and run unchanged on both.
#ifndef GRAPHALLOC_TESTS_TESTING_TEST_DEVICE_H_
#define GRAPHALLOC_TESTS_TESTING_TEST_DEVICE_H_

#include <memory>
#include <string>

#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/device/sim_driver.h"

namespace graphalloc::testing {

// "sim" or "cuda", from GRAPHALLOC_TEST_DEVICE (default "sim").
std::string TestDeviceKind();
bool OnSimulatedDevice();

// A driver for the selected device. On "cuda" with no usable GPU it returns nullptr and sets *skip_reason;
// callers GTEST_SKIP() with it. `sim_options` applies to the simulated device only.
std::shared_ptr<Driver> MakeTestDriver(std::string* skip_reason, SimDriverOptions sim_options = {});

// For tests of the process-wide allocators (the C ABI's): points GRAPHALLOC_DEVICE at the device under test
// and returns the driver of device 0's default allocator, or nullptr with *skip_reason set (callers
// GTEST_SKIP() with it) when that device is unavailable.
Driver* DefaultAllocatorDriver(std::string* skip_reason);

// For the teardown of those tests: empties the cache of every default allocator created so far and expects
// each to hold nothing (no live block, no reserved byte) with its invariants intact. They outlive the test,
// so what a test leaves there would otherwise show only as a leak at process exit (compute-sanitizer's).
void ExpectDefaultAllocatorsHoldNothing();

// The driver cast to SimDriver, or nullptr on the real device (for tests that need fault injection or
// manual event completion).
SimDriver* AsSim(Driver* driver);

}  // namespace graphalloc::testing

// Declares `driver_` (std::shared_ptr<Driver>) for the selected device, or skips the test.
#define GRAPHALLOC_REQUIRE_DEVICE(driver_, ...)                                     \
  std::string driver_##_skip_reason;                                                \
  std::shared_ptr<::graphalloc::Driver> driver_ =                                   \
      ::graphalloc::testing::MakeTestDriver(&driver_##_skip_reason, ##__VA_ARGS__); \
  if (driver_ == nullptr) GTEST_SKIP() << driver_##_skip_reason

#endif  // GRAPHALLOC_TESTS_TESTING_TEST_DEVICE_H_

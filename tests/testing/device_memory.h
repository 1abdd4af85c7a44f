// Writes and checks recognisable patterns in device memory, on either device, so tests can prove that
// the allocator never hands out or moves memory that is still in use.
#ifndef GRAPHALLOC_TESTS_TESTING_DEVICE_MEMORY_H_
#define GRAPHALLOC_TESTS_TESTING_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc::testing {

// Fills the block with 64-bit words derived from `id`: all of it up to 64 KiB, and its first, middle and
// last 16 KiB when larger (touching every page of a 64 MiB block on every step would dominate run time).
absl::Status FillPattern(Driver& driver, DevicePtr ptr, std::size_t size, std::uint64_t id);
// OkStatus when the pattern FillPattern wrote for `id` is intact; DataLoss naming the first bad offset.
absl::Status CheckPattern(Driver& driver, DevicePtr ptr, std::size_t size, std::uint64_t id);

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_TESTING_DEVICE_MEMORY_H_

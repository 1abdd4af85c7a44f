// Allocation through the C ABI into a private pool, as a C program routes it: a route of the calling thread
// around one graphalloc_malloc. For the C ABI tests.
#ifndef GRAPHALLOC_TESTS_TESTING_C_API_POOL_MALLOC_H_
#define GRAPHALLOC_TESTS_TESTING_C_API_POOL_MALLOC_H_

#include <cstddef>
#include <cstdint>

#include "graphalloc/allocator/c_api/graphalloc.h"
#include "gtest/gtest.h"

namespace graphalloc::testing {

// `size` bytes on device 0's default stream in `pool` (0: the default pool), expecting success (a failure
// fails the test and returns null).
inline void* MallocInPool(std::uint64_t pool, std::size_t size) {
  std::uint64_t route = 0;
  if (pool != 0) {
    EXPECT_EQ(graphalloc_begin_allocate_to_pool_for_thread(0, pool, &route), GRAPHALLOC_OK)
        << graphalloc_last_error();
  }
  void* p = nullptr;
  EXPECT_EQ(graphalloc_malloc(&p, size, 0, nullptr), GRAPHALLOC_OK) << graphalloc_last_error();
  if (pool != 0) {
    EXPECT_EQ(graphalloc_end_route(route), GRAPHALLOC_OK);
  }
  return p;
}

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_TESTING_C_API_POOL_MALLOC_H_

// Host memory for the allocator's large tables (the block arena's chunks, the pointer map), in whole
// 2 MiB pages that the kernel is asked to back with transparent huge pages.
//
// With 100k live blocks these tables span tens of MiB, and a churn operation touches a few random cache
// lines of them: with 4 KiB pages nearly each of those touches also missed the TLB (a page walk, and a
// two-level one in a virtual machine). Only tables of 2 MiB or more come from here, so small allocators
// keep their small footprint.
#ifndef GRAPHALLOC_ALLOCATOR_BASE_HUGE_PAGE_MEMORY_H_
#define GRAPHALLOC_ALLOCATOR_BASE_HUGE_PAGE_MEMORY_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace graphalloc {

inline constexpr std::size_t kHugePageSize = std::size_t{2} << 20;

// `bytes` rounded up to whole huge pages, 2 MiB-aligned; throws std::bad_alloc like operator new.
inline void* AllocateHugePageMemory(std::size_t bytes) {
  const std::size_t rounded = (bytes + kHugePageSize - 1) / kHugePageSize * kHugePageSize;
  void* p = std::aligned_alloc(kHugePageSize, rounded);
  if (p == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  // Only a hint: without transparent huge pages (or with them off) the memory works the same.
  (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

inline void FreeHugePageMemory(void* p) { std::free(p); }

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_BASE_HUGE_PAGE_MEMORY_H_

// Allocates and frees through an installed graphalloc on the simulated device; exits 0 on success.
#include <graphalloc/allocator/core/caching_allocator.h>
#include <graphalloc/allocator/device/sim_driver.h>
#include <graphalloc/graphalloc.h>

#include <cstdio>

int main() {
  auto driver = graphalloc::SimDriver::Create();
  if (!driver.ok()) return 1;
  auto allocator = graphalloc::CachingAllocator::Create(std::move(*driver));
  if (!allocator.ok()) return 2;
  auto ptr = (*allocator)->Allocate(1 << 20);
  if (!ptr.ok() || !(*allocator)->Free(*ptr).ok()) return 3;
  if ((*allocator)->GetStats().reserved_bytes.all().current != 2 << 20) return 4;
  // The C ABI is reachable too (graphalloc_last_error is always safe to call).
  std::printf("consumer ok (last error: '%s')\n", graphalloc_last_error());
  return 0;
}

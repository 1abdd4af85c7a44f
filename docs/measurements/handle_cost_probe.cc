// The probe for issue 33's open questions about a growth's driver calls (docs/benchmarks.md, "Issue 33"):
//   1. what one handle costs by call (create, map, set access) at 2, 48 and 512 MiB, once the device has
//      settled and right after releasing as much memory as is created: fixed cost per handle, or bytes;
//   2. whether cuMemCreate of a growth's several handles runs faster from helper threads (1, 2, 4
//      threads creating 16 handles of 48 MiB; map and set access stay on the calling thread);
//   3. whether one cuMemSetAccess over several contiguous handles costs less than one call each.
// Each scenario 5 times after a 400 ms pause; median (min-max) in us. Not part of the build (the driver
// API alone, no graphalloc):
//   g++ -std=c++20 -O2 -I/usr/local/cuda/include handle_cost_probe.cc -o probe -lcuda -lpthread && ./probe
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "probe_check.h"
using Clock = std::chrono::steady_clock;
static CUmemAllocationProp prop{};
static CUmemAccessDesc acc{};
static CUcontext ctx;
constexpr size_t kMiB = size_t{1} << 20;

static double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}
static void Pause() {
  CK(cuCtxSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
}
static void Report(const std::string& what, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::printf("%-62s %10.1f us (%.1f-%.1f)\n", what.c_str(), v[v.size() / 2], v.front(), v.back());
}
static std::string Label(const char* format, ...) {
  char buf[160];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

// K handles of `size` mapped back to back into one reservation.
struct Range {
  CUdeviceptr base = 0;
  size_t size = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
};
// A reservation for `k` handles of `size`, none created yet.
static Range Reserve(size_t size, int k) {
  Range r;
  r.size = size;
  r.handles.resize(k);
  CK(cuMemAddressReserve(&r.base, size * k, 0, 0, 0));
  return r;
}
static void Free(Range& r) {
  CK(cuMemUnmap(r.base, r.size * r.handles.size()));
  for (auto h : r.handles) CK(cuMemRelease(h));
  CK(cuMemAddressFree(r.base, r.size * r.handles.size()));
  r = Range{};
}
// Releases `bytes` of memory created and mapped just for that, so that what follows runs right after a
// release, as a cold replay after EmptyCache does.
static void ReleaseFresh(size_t bytes) {
  Range r = Reserve(bytes, 1);
  CK(cuMemCreate(&r.handles[0], bytes, &prop, 0));
  CK(cuMemMap(r.base, bytes, 0, r.handles[0], 0));
  CK(cuMemSetAccess(r.base, bytes, &acc, 1));
  CK(cuCtxSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  Free(r);
}

// Scenario 1: create, map and set access of `k` handles of `size`, each call timed; per handle.
static void PerHandle(size_t size, int k, bool after_release) {
  std::vector<double> create, map, access;
  for (int rep = 0; rep < 5; ++rep) {
    Pause();
    if (after_release) ReleaseFresh(size * k);
    Range r = Reserve(size, k);
    double c = 0, m = 0, a = 0;
    for (int i = 0; i < k; ++i) {
      auto t0 = Clock::now();
      CK(cuMemCreate(&r.handles[i], size, &prop, 0));
      auto t1 = Clock::now();
      CK(cuMemMap(r.base + i * size, size, 0, r.handles[i], 0));
      auto t2 = Clock::now();
      CK(cuMemSetAccess(r.base + i * size, size, &acc, 1));
      auto t3 = Clock::now();
      c += Us(t0, t1);
      m += Us(t1, t2);
      a += Us(t2, t3);
    }
    create.push_back(c / k);
    map.push_back(m / k);
    access.push_back(a / k);
    Free(r);
  }
  const char* when = after_release ? "right after a release" : "settled";
  Report(Label("%zu MiB x %d, %s: cuMemCreate per handle", size / kMiB, k, when), create);
  Report(Label("%zu MiB x %d, %s: cuMemMap per handle", size / kMiB, k, when), map);
  Report(Label("%zu MiB x %d, %s: cuMemSetAccess per handle", size / kMiB, k, when), access);
}

// Scenario 2: 16 handles of 48 MiB created from `threads` threads, then mapped and granted access here.
static void ThreadedCreate(int threads) {
  constexpr int k = 16;
  constexpr size_t size = 48 * kMiB;
  std::vector<double> create, total;
  for (int rep = 0; rep < 5; ++rep) {
    Pause();
    Range r = Reserve(size, k);
    auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        CK(cuCtxSetCurrent(ctx));
        for (int i = t; i < k; i += threads) CK(cuMemCreate(&r.handles[i], size, &prop, 0));
      });
    }
    for (auto& th : pool) th.join();
    auto t1 = Clock::now();
    for (int i = 0; i < k; ++i) CK(cuMemMap(r.base + i * size, size, 0, r.handles[i], 0));
    CK(cuMemSetAccess(r.base, size * k, &acc, 1));
    auto t2 = Clock::now();
    create.push_back(Us(t0, t1));
    total.push_back(Us(t0, t2));
    Free(r);
  }
  Report(Label("16 x 48 MiB created by %d thread(s): the creates", threads), create);
  Report(Label("16 x 48 MiB created by %d thread(s): with map and access", threads), total);
}

// Scenario 3: access over `k` contiguous mapped handles of 48 MiB, in one call or one call each.
static void AccessBatching(int k) {
  constexpr size_t size = 48 * kMiB;
  std::vector<double> one, each;
  for (int rep = 0; rep < 5; ++rep) {
    for (bool batched : {true, false}) {
      Pause();
      Range r = Reserve(size, k);
      for (int i = 0; i < k; ++i) {
        CK(cuMemCreate(&r.handles[i], size, &prop, 0));
        CK(cuMemMap(r.base + i * size, size, 0, r.handles[i], 0));
      }
      auto t0 = Clock::now();
      if (batched) {
        CK(cuMemSetAccess(r.base, size * k, &acc, 1));
      } else {
        for (int i = 0; i < k; ++i) CK(cuMemSetAccess(r.base + i * size, size, &acc, 1));
      }
      (batched ? one : each).push_back(Us(t0, Clock::now()));
      Free(r);
    }
  }
  Report(Label("access over %d x 48 MiB: one call", k), one);
  Report(Label("access over %d x 48 MiB: one call per handle", k), each);
}

int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (bool after_release : {false, true}) {
    PerHandle(2 * kMiB, 64, after_release);
    PerHandle(48 * kMiB, 16, after_release);
    PerHandle(512 * kMiB, 2, after_release);
  }
  for (int threads : {1, 2, 4}) ThreadedCreate(threads);
  AccessBatching(16);
  return 0;
}

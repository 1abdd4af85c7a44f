// The probe behind docs/benchmarks.md's "right after a cuMemRelease, host-to-device copies run slower":
// a pinned host-to-device copy of N GiB timed into long-mapped memory, into freshly created memory, and
// right after (or 300 ms after) releasing another N GiB handle; each scenario 5 times after a 400 ms pause,
// median, min and max of the copy. Not part of the build (the driver API alone, no graphalloc):
//   g++ -std=c++20 -O2 -I/usr/local/cuda/include release_copy_probe.cc -o probe -lcuda && ./probe 1 &&
//   ./probe 4
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "probe_check.h"
using Clock = std::chrono::steady_clock;
static CUmemAllocationProp prop{};
static CUmemAccessDesc acc{};
struct Buf {
  CUdeviceptr p = 0;
  CUmemGenericAllocationHandle h = 0;
  size_t n = 0;
};
static Buf Create(size_t n) {
  Buf b;
  b.n = n;
  CK(cuMemCreate(&b.h, n, &prop, 0));
  CK(cuMemAddressReserve(&b.p, n, 0, 0, 0));
  CK(cuMemMap(b.p, n, 0, b.h, 0));
  CK(cuMemSetAccess(b.p, n, &acc, 1));
  return b;
}
static void Release(Buf& b) {
  CK(cuMemUnmap(b.p, b.n));
  CK(cuMemRelease(b.h));
  CK(cuMemAddressFree(b.p, b.n));
  b = Buf{};
}
static double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
static double CopyMs(CUdeviceptr dst, void* src, size_t n) {
  auto t0 = Clock::now();
  CK(cuMemcpyHtoDAsync(dst, src, n, 0));
  CK(cuStreamSynchronize(0));
  return Ms(t0, Clock::now());
}
static void Pause() {
  CK(cuCtxSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
}
static void Wait(int ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}
static double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One scenario: what happens before the timed copy of n bytes from pinned host memory.
struct Scenario {
  const char* name;
  bool release_before;  // create, fill and release another n-byte handle first (timed as "other")
  int wait_after_release_ms;
  bool fresh;  // copy into a handle created for it (else into the long-mapped one)
  int wait_before_copy_ms;
  std::size_t memset_first;  // bytes of the destination set first (timed as "other"), 0 for none
};

// The copy's time, and in `other` the release's or the memset's.
static double RunOnce(const Scenario& s, const Buf& warm, void* host, std::size_t n, double& other) {
  other = 0;
  if (s.release_before) {
    Buf r = Create(n);
    CK(cuMemsetD8(r.p, 1, n));
    Pause();
    auto t = Clock::now();
    Release(r);
    other = Ms(t, Clock::now());
  } else {
    Pause();
  }
  Wait(s.wait_after_release_ms);
  Buf fresh;
  if (s.fresh) fresh = Create(n);
  const CUdeviceptr dst = s.fresh ? fresh.p : warm.p;
  Wait(s.wait_before_copy_ms);
  if (s.memset_first > 0) {
    auto t = Clock::now();
    CK(cuMemsetD8(dst, 0, s.memset_first));
    CK(cuStreamSynchronize(0));
    other = Ms(t, Clock::now());
  }
  const double ms = CopyMs(dst, host, n);
  if (s.fresh) Release(fresh);
  return ms;
}

int main(int argc, char** argv) {
  const std::size_t gib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1;
  const std::size_t n = gib << 30;
  const int reps = 5;
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  char name[128];
  CK(cuDeviceGetName(name, sizeof name, dev));
  std::printf("device %s\n", name);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  void* host;
  CK(cuMemHostAlloc(&host, n, 0));
  std::memset(host, 7, n);
  Buf warm = Create(n);
  CopyMs(warm.p, host, n);
  const Scenario scenarios[] = {
      {"A long-mapped", false, 0, false, 0, 0},
      {"B fresh (no release before)", false, 0, true, 0, 0},
      {"B2 fresh, 300 ms before copy", false, 0, true, 300, 0},
      {"C long-mapped after release", true, 0, false, 0, 0},
      {"D long-mapped, release, 300 ms", true, 300, false, 0, 0},
      {"E fresh right after release", true, 0, true, 0, 0},
      {"F fresh, release, 300 ms", true, 300, true, 0, 0},
      {"G fresh, memset first", false, 0, true, 0, n},
      {"I fresh, touch 2 MiB first", false, 0, true, 0, std::size_t{2} << 20},
  };
  for (const Scenario& s : scenarios) {
    std::vector<double> copy, other;
    for (int i = 0; i < reps; ++i) {
      double o = 0;
      copy.push_back(RunOnce(s, warm, host, n, o));
      other.push_back(o);
    }
    const double m = Median(copy);
    std::printf(
        "%-32s %5.1f GiB  copy median %8.3f ms (min %.3f max %.3f)  %6.2f GB/s  other-step median %.3f ms\n",
        s.name, static_cast<double>(gib), m, *std::min_element(copy.begin(), copy.end()),
        *std::max_element(copy.begin(), copy.end()), static_cast<double>(n) / m / 1e6, Median(other));
    std::fflush(stdout);
  }
  Release(warm);
  CK(cuMemFreeHost(host));
  return 0;
}

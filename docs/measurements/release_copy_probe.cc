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
#define CK(x)                                \
  do {                                       \
    CUresult rc_ = (x);                      \
    if (rc_ != CUDA_SUCCESS) {               \
      const char* s;                         \
      cuGetErrorString(rc_, &s);             \
      std::printf("%s failed: %s\n", #x, s); \
      std::exit(1);                          \
    }                                        \
  } while (0)
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
static double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
static void Report(const char* name, size_t n, const std::vector<double>& v,
                   const std::vector<double>& extra = {}) {
  double m = Median(v);
  std::printf("%-32s %5.1f GiB  copy median %8.3f ms (min %.3f max %.3f)  %6.2f GB/s", name,
              n / double(1 << 30), m, *std::min_element(v.begin(), v.end()),
              *std::max_element(v.begin(), v.end()), n / m / 1e6);
  if (!extra.empty()) std::printf("  other-step median %.3f ms", Median(extra));
  std::printf("\n");
  std::fflush(stdout);
}
int main(int argc, char** argv) {
  size_t gib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1;
  int reps = 5;
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
  size_t n = gib << 30;
  void* host;
  CK(cuMemHostAlloc(&host, n, 0));
  std::memset(host, 7, n);
  Buf warm = Create(n);
  CopyMs(warm.p, host, n);
  std::vector<double> v, x;
  for (int i = 0; i < reps; ++i) {
    Pause();
    v.push_back(CopyMs(warm.p, host, n));
  }
  Report("A long-mapped", n, v);
  v.clear();
  for (int i = 0; i < reps; ++i) {
    Pause();
    Buf f = Create(n);
    v.push_back(CopyMs(f.p, host, n));
    Release(f);
  }
  Report("B fresh (no release before)", n, v);
  v.clear();
  for (int i = 0; i < reps; ++i) {
    Pause();
    Buf f = Create(n);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    v.push_back(CopyMs(f.p, host, n));
    Release(f);
  }
  Report("B2 fresh, 300 ms before copy", n, v);
  v.clear();
  for (int i = 0; i < reps; ++i) {
    Buf r = Create(n);
    CK(cuMemsetD8(r.p, 1, n));
    Pause();
    auto t = Clock::now();
    Release(r);
    x.push_back(Ms(t, Clock::now()));
    v.push_back(CopyMs(warm.p, host, n));
  }
  Report("C long-mapped after release", n, v, x);
  v.clear();
  x.clear();
  for (int i = 0; i < reps; ++i) {
    Buf r = Create(n);
    CK(cuMemsetD8(r.p, 1, n));
    Pause();
    Release(r);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    v.push_back(CopyMs(warm.p, host, n));
  }
  Report("D long-mapped, release, 300 ms", n, v);
  v.clear();
  for (int i = 0; i < reps; ++i) {
    Buf r = Create(n);
    CK(cuMemsetD8(r.p, 1, n));
    Pause();
    Release(r);
    Buf f = Create(n);
    v.push_back(CopyMs(f.p, host, n));
    Release(f);
  }
  Report("E fresh right after release", n, v);
  v.clear();
  for (int i = 0; i < reps; ++i) {
    Buf r = Create(n);
    CK(cuMemsetD8(r.p, 1, n));
    Pause();
    Release(r);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Buf f = Create(n);
    v.push_back(CopyMs(f.p, host, n));
    Release(f);
  }
  Report("F fresh, release, 300 ms", n, v);
  v.clear();
  for (int i = 0; i < reps; ++i) {
    Pause();
    Buf f = Create(n);
    auto t = Clock::now();
    CK(cuMemsetD8(f.p, 0, n));
    CK(cuStreamSynchronize(0));
    x.push_back(Ms(t, Clock::now()));
    v.push_back(CopyMs(f.p, host, n));
    Release(f);
  }
  Report("G fresh, memset first (other)", n, v, x);
  v.clear();
  x.clear();
  for (int i = 0; i < reps; ++i) {
    Pause();
    auto t = Clock::now();
    CK(cuMemsetD8(warm.p, 0, n));
    CK(cuStreamSynchronize(0));
    x.push_back(Ms(t, Clock::now()));
  }
  Report("H memset long-mapped (other)", n, x, x);
  x.clear();
  // Same as B but with the pool's real pattern: 2 handles of n/2 mapped side by side.
  for (int i = 0; i < reps; ++i) {
    Pause();
    Buf f = Create(n);
    auto t = Clock::now();
    CK(cuMemsetD8(f.p, 0, 2 << 20));
    CK(cuStreamSynchronize(0));
    x.push_back(Ms(t, Clock::now()));
    v.push_back(CopyMs(f.p, host, n));
    Release(f);
  }
  Report("I fresh, touch 2 MiB first", n, v, x);
  v.clear();
  x.clear();
  Release(warm);
  CK(cuMemFreeHost(host));
  return 0;
}

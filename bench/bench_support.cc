#include "bench/bench_support.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <utility>

#include "graphalloc/allocator/device/cuda_driver.h"
#include "graphalloc/allocator/device/sim_driver.h"

namespace graphalloc::bench {
namespace {

constexpr std::size_t kSizeTableEntries = std::size_t{1} << 16;

double ExpectedLogUniformMean(std::size_t lo, std::size_t hi) {
  if (hi <= lo) return static_cast<double>(lo);
  return static_cast<double>(hi - lo) / std::log(static_cast<double>(hi) / static_cast<double>(lo));
}

// Creates the device's shared allocator and streams; an error message when any of it fails.
std::string SetUpDevice(BenchDevice& device) {
  auto allocator = CachingAllocator::Create(device.driver);
  if (!allocator.ok()) return "CachingAllocator::Create: " + allocator.status().ToString();
  device.allocator = std::move(*allocator);
  auto stream = device.driver->StreamCreate();
  if (!stream.ok()) return "StreamCreate: " + stream.status().ToString();
  device.stream = *stream;
  for (int i = 0; i < kThreadCounts.back(); ++i) {
    auto s = device.driver->StreamCreate();
    if (!s.ok()) return "StreamCreate: " + s.status().ToString();
    device.thread_streams.push_back(*s);
  }
  return "";
}

// One allocate+free pair on `stream`; false (and a skip message) on failure.
bool HitPair(benchmark::State& state, CachingAllocator& allocator, std::size_t size, Stream stream) {
  absl::StatusOr<DevicePtr> p = allocator.Allocate(size, stream);
  if (!p.ok()) [[unlikely]] {
    state.SkipWithError(("Allocate failed: " + p.status().ToString()).c_str());
    return false;
  }
  benchmark::DoNotOptimize(*p);
  if (absl::Status s = allocator.Free(*p); !s.ok()) [[unlikely]] {
    state.SkipWithError(("Free failed: " + s.ToString()).c_str());
    return false;
  }
  return true;
}

bool Warmup(benchmark::State& state, CachingAllocator& allocator, std::size_t size, Stream stream) {
  for (int i = 0; i < kWarmupPairs; ++i) {
    if (!HitPair(state, allocator, size, stream)) return false;
  }
  return true;
}

void BM_GraphallocHit(benchmark::State& state, BenchDevice* device, std::size_t size) {
  CachingAllocator& allocator = *device->allocator;
  if (!Warmup(state, allocator, size, device->stream)) {
    for (auto _ : state) {  // skipped: the loop ends at once
    }
    return;
  }
  for (auto _ : state) {
    if (!HitPair(state, allocator, size, device->stream)) break;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_GraphallocThreads(benchmark::State& state, BenchDevice* device) {
  CachingAllocator& allocator = *device->allocator;
  const Stream stream = device->thread_streams[static_cast<std::size_t>(state.thread_index())];
  if (!Warmup(state, allocator, kThreadPairSize, stream)) {
    // Still enter the loop: every thread must reach its start barrier. Skipped, it ends at once.
    for (auto _ : state) {
    }
    return;
  }
  for (auto _ : state) {
    if (!HitPair(state, allocator, kThreadPairSize, stream)) break;
  }
  state.SetItemsProcessed(state.iterations());
}

struct GraphallocChurnState final : ChurnStateBase {
  explicit GraphallocChurnState(std::size_t live_blocks) : live(live_blocks) {}
  // The allocator's destructor returns every segment, live blocks included.
  ~GraphallocChurnState() override = default;
  std::unique_ptr<CachingAllocator> allocator;
  Stream stream = kDefaultStream;
  ChurnLive live;
  std::string error;
};

void BM_GraphallocChurn(benchmark::State& state, BenchDevice* device, std::size_t live_blocks) {
  const std::string key = ChurnName(device->Impl(), live_blocks);
  auto* churn = static_cast<GraphallocChurnState*>(FindChurnState(key));
  if (churn == nullptr) {
    // A fresh allocator per live-set size, so that one churn's cache does not serve another.
    auto owned = std::make_unique<GraphallocChurnState>(live_blocks);
    auto allocator = CachingAllocator::Create(device->driver);
    if (!allocator.ok()) {
      state.SkipWithError(("CachingAllocator::Create failed: " + allocator.status().ToString()).c_str());
      return;
    }
    owned->allocator = std::move(*allocator);
    owned->stream = device->stream;
    GraphallocChurnState& s = *owned;
    const bool filled = s.live.Fill([&s](std::size_t size) -> std::uintptr_t {
      absl::StatusOr<DevicePtr> p = s.allocator->Allocate(size, s.stream);
      if (!p.ok()) {
        s.error = p.status().ToString();
        return 0;
      }
      return *p;
    });
    if (!filled) {
      state.SkipWithError(("churn fill failed: " + s.error).c_str());
      return;
    }
    churn = owned.get();
    SetChurnState(key, std::move(owned));
  }
  GraphallocChurnState& s = *churn;
  CachingAllocator& allocator = *s.allocator;
  ChurnLoop(
      state, s.live,
      [&](std::size_t size) -> std::uintptr_t {
        absl::StatusOr<DevicePtr> p = allocator.Allocate(size, s.stream);
        if (!p.ok()) [[unlikely]] {
          s.error = p.status().ToString();
          return 0;
        }
        return *p;
      },
      [&](std::uintptr_t ptr) {
        absl::Status st = allocator.Free(ptr);
        if (!st.ok()) [[unlikely]] {
          s.error = st.ToString();
          return false;
        }
        return true;
      },
      [&] { return s.error; });
  const DeviceStats stats = allocator.GetStats();
  state.counters["reserved_bytes"] = static_cast<double>(stats.reserved_bytes.all().current);
  state.counters["segments"] = static_cast<double>(stats.segment.all().current);
}

std::unique_ptr<ChurnStateBase>& CurrentChurnState() {
  static auto* state = new std::unique_ptr<ChurnStateBase>();
  return *state;
}
std::string& CurrentChurnKey() {
  static auto* key = new std::string();
  return *key;
}

}  // namespace

BenchDevice::~BenchDevice() {
  if (driver == nullptr) return;
  allocator.reset();
  for (Stream s : thread_streams) (void)driver->StreamDestroy(s);
  if (stream != kDefaultStream) (void)driver->StreamDestroy(stream);
}

std::vector<std::unique_ptr<BenchDevice>> MakeBenchDevices() {
  std::vector<std::unique_ptr<BenchDevice>> devices;

  auto sim = SimDriver::Create();
  if (!sim.ok()) {
    std::fprintf(stderr, "graphalloc bench: simulated device unavailable: %s\n",
                 sim.status().ToString().c_str());
  } else {
    auto device = std::make_unique<BenchDevice>();
    device->kind = "sim";
    device->driver = std::shared_ptr<Driver>(std::move(*sim));
    if (std::string error = SetUpDevice(*device); !error.empty()) {
      std::fprintf(stderr, "graphalloc bench: simulated device setup failed: %s\n", error.c_str());
    } else {
      benchmark::AddCustomContext("sim_device", device->driver->Info().name);
      devices.push_back(std::move(device));
    }
  }

  auto cuda = CudaDriver::Create(0);
  if (!cuda.ok()) {
    std::fprintf(stderr, "graphalloc bench: no GPU, skipping the cuda variants: %s\n",
                 cuda.status().ToString().c_str());
    benchmark::AddCustomContext("cuda_device", "absent: " + cuda.status().ToString());
  } else {
    auto device = std::make_unique<BenchDevice>();
    device->kind = "cuda";
    device->driver = std::shared_ptr<Driver>(std::move(*cuda));
    if (std::string error = SetUpDevice(*device); !error.empty()) {
      std::fprintf(stderr, "graphalloc bench: GPU setup failed, skipping the cuda variants: %s\n",
                   error.c_str());
      benchmark::AddCustomContext("cuda_device", "setup failed: " + error);
    } else {
      benchmark::AddCustomContext("cuda_device", device->driver->Info().name);
      devices.push_back(std::move(device));
    }
  }
  return devices;
}

void RegisterGraphallocHitPath(BenchDevice& device) {
  for (std::size_t size : kHitSizes) {
    benchmark::RegisterBenchmark(HitName(device.Impl(), size).c_str(), BM_GraphallocHit, &device, size);
  }
}

void RegisterGraphallocChurn(BenchDevice& device) {
  for (std::size_t live : kChurnLiveBlocks) {
    benchmark::RegisterBenchmark(ChurnName(device.Impl(), live).c_str(), BM_GraphallocChurn, &device, live);
  }
}

void RegisterGraphallocThreads(BenchDevice& device) {
  auto* b = benchmark::RegisterBenchmark(ThreadsName(device.Impl(), kThreadPairSize).c_str(),
                                         BM_GraphallocThreads, &device);
  for (int n : kThreadCounts) b->Threads(n);
  b->UseRealTime();  // items_per_second is then the total over all threads
}

std::size_t ChurnMaxSize(std::size_t live) {
  std::size_t max_size = kChurnMaxSize;
  while (max_size > 2 * kChurnMinSize &&
         static_cast<double>(live) * ExpectedLogUniformMean(kChurnMinSize, max_size) >
             static_cast<double>(kChurnLiveBudget)) {
    max_size /= 2;
  }
  return max_size;
}

ChurnRandom::ChurnRandom(std::size_t live, std::size_t max_size)
    : state_(0x9E3779B97F4A7C15ULL ^ live), live_(live), max_size_(max_size), sizes_(kSizeTableEntries) {
  std::mt19937_64 gen(20240601);
  std::uniform_real_distribution<double> exponent(std::log(static_cast<double>(kChurnMinSize)),
                                                  std::log(static_cast<double>(max_size) + 1.0));
  for (std::size_t& size : sizes_) {
    size = static_cast<std::size_t>(std::exp(exponent(gen)));
    if (size < kChurnMinSize) size = kChurnMinSize;
    if (size > max_size) size = max_size;
  }
}

ChurnStateBase* FindChurnState(const std::string& key) {
  if (CurrentChurnKey() == key && CurrentChurnState() != nullptr) return CurrentChurnState().get();
  ResetChurnState();
  return nullptr;
}

void SetChurnState(const std::string& key, std::unique_ptr<ChurnStateBase> state) {
  ResetChurnState();
  CurrentChurnKey() = key;
  CurrentChurnState() = std::move(state);
}

void ResetChurnState() {
  CurrentChurnState().reset();
  CurrentChurnKey().clear();
}

std::string HitName(const std::string& impl, std::size_t size) {
  return "hit/" + impl + "/" + std::to_string(size);
}
std::string ChurnName(const std::string& impl, std::size_t live) {
  return "churn/" + impl + "/" + std::to_string(live);
}
std::string ThreadsName(const std::string& impl, std::size_t size) {
  return "threads/" + impl + "/" + std::to_string(size);
}

}  // namespace graphalloc::bench

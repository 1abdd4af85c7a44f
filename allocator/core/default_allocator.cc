#include "graphalloc/allocator/core/default_allocator.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/device/cuda_driver.h"
#include "graphalloc/allocator/device/sim_driver.h"

namespace graphalloc {
namespace {

// Allocators live until the process exits: PyTorch may free tensors from static destructors.
std::array<std::atomic<CachingAllocator*>, kMaxDevices> allocators{};
Mutex creation_mutex;

// GRAPHALLOC_SIM_MEMORY_MB, when set: the simulated device's memory in MiB (80 GiB when unset). A smaller
// device makes memory pressure (out-of-memory retries, releases, the OOM report) reachable with small
// requests.
absl::Status SimMemoryFromEnvironment(SimDriverOptions* options) {
  const char* env = std::getenv("GRAPHALLOC_SIM_MEMORY_MB");
  if (env == nullptr || *env == '\0') return absl::OkStatus();
  constexpr std::uint64_t kMaxMiB = std::uint64_t{1} << 24;  // 16 TiB
  std::uint64_t mib = 0;
  if (!absl::SimpleAtoi(env, &mib) || mib == 0 || mib > kMaxMiB) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GRAPHALLOC_SIM_MEMORY_MB must be a whole number of MiB from 1 to ", kMaxMiB, ", not '", env, "'"));
  }
  options->capacity = static_cast<std::size_t>(mib) << 20;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Driver>> MakeDriver(int device) {
  const char* env = std::getenv("GRAPHALLOC_DEVICE");
  const std::string kind = env == nullptr || *env == '\0' ? "auto" : env;
  if (kind != "auto" && kind != "cuda" && kind != "sim") {
    return absl::InvalidArgumentError(
        absl::StrCat("GRAPHALLOC_DEVICE must be auto, cuda or sim, not '", kind, "'"));
  }
  if (kind != "sim") {
    absl::StatusOr<std::unique_ptr<CudaDriver>> cuda = CudaDriver::Create(device);
    if (cuda.ok()) return std::shared_ptr<Driver>(std::move(*cuda));
    if (kind == "cuda" || !absl::IsUnavailable(cuda.status())) return cuda.status();
  }
  SimDriverOptions options;
  options.ordinal = device;
  absl::Status memory = SimMemoryFromEnvironment(&options);
  if (!memory.ok()) return memory;
  absl::StatusOr<std::unique_ptr<SimDriver>> sim = SimDriver::Create(options);
  if (!sim.ok()) return sim.status();
  return std::shared_ptr<Driver>(std::move(*sim));
}

}  // namespace

CachingAllocator* ExistingDefaultAllocator(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return allocators[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
}

absl::StatusOr<CachingAllocator*> DefaultAllocator(int device) {
  if (device < 0 || device >= kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", device, " is out of range: graphalloc supports devices 0 to ", kMaxDevices - 1));
  }
  if (CachingAllocator* existing = ExistingDefaultAllocator(device)) return existing;
  MutexLock lock(&creation_mutex);
  if (CachingAllocator* existing = ExistingDefaultAllocator(device)) return existing;
  absl::StatusOr<Config> config = Config::FromEnvironment();
  if (!config.ok()) return config.status();
  absl::StatusOr<std::shared_ptr<Driver>> driver = MakeDriver(device);
  if (!driver.ok()) return driver.status();
  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(*driver, *config);
  if (!allocator.ok()) return allocator.status();
  CachingAllocator* raw = allocator->release();
  allocators[static_cast<std::size_t>(device)].store(raw, std::memory_order_release);
  return raw;
}

}  // namespace graphalloc

// A Driver decorator for benchmarks: forwards every call to the wrapped driver (ForwardingDriver) and, while
// a phase is selected, counts the calls an allocator's growth and release are made of, by kind, with their
// wall-clock and thread CPU time: the VMM calls, the synchronizations, and the plain device allocations
// and memory queries (kOther). Benchmarks use it to split an allocator's time by driver call (how much of
// a growth is cuMemCreate, cuMemSetAccess, ...; wall time well above CPU time means the calling thread
// sleeps inside the driver, waiting for the GPU). Every other call (streams, events, copies, graphs) is
// forwarded untimed.
//
// Cost: two steady_clock and two CLOCK_THREAD_CPUTIME_ID reads per recorded call (well under a
// microsecond, against the tens of microseconds of a VMM call), and a virtual call. Nothing of this is in
// the library: the allocator is measured through it only where a benchmark says so (expandable_bench's
// *_split variants; its plain variants use the bare driver, so the two can be compared).
//
// The totals are plain counters, not atomics: for single-threaded benchmarks only (the forwarding itself
// is as thread-safe as the wrapped driver).
#ifndef GRAPHALLOC_BENCH_TIMED_DRIVER_H_
#define GRAPHALLOC_BENCH_TIMED_DRIVER_H_

#include <time.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "graphalloc/allocator/device/forwarding_driver.h"

namespace graphalloc::bench {

// The call kinds told apart. kSync: StreamSynchronize, DeviceSynchronize, EventSynchronize (and
// EventQuery, which polls the same thing); kOther: MemAlloc, MemFree, GetMemoryInfo.
enum class DriverCall : int {
  kAddressReserve,
  kAddressFree,
  kMemCreate,
  kMemRelease,
  kMemMap,
  kMemUnmap,
  kMemSetAccess,
  kSync,
  kOther,
  kCount,
};
inline constexpr int kDriverCallKinds = static_cast<int>(DriverCall::kCount);

// Short names for counters: "reserve", "addr_free", "create", "release", "map", "unmap", "access",
// "sync", "other".
inline const char* DriverCallName(DriverCall call) {
  static constexpr std::array<const char*, kDriverCallKinds> kNames = {
      "reserve", "addr_free", "create", "release", "map", "unmap", "access", "sync", "other"};
  return kNames[static_cast<std::size_t>(call)];
}

// Thread CPU time in nanoseconds.
inline std::int64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}
inline std::int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct CallTotals {
  std::uint64_t calls = 0;
  std::int64_t wall_ns = 0;
  std::int64_t cpu_ns = 0;
};

class TimedDriver final : public ForwardingDriver {
 public:
  // What the recorded calls count towards: nothing (kNone), the timed part of a benchmark iteration or
  // its untimed teardown.
  enum class Phase : int { kNone = -1, kTimed = 0, kTeardown = 1 };

  explicit TimedDriver(std::shared_ptr<Driver> inner) : ForwardingDriver(std::move(inner)) {}

  void SetPhase(Phase phase) { phase_ = phase; }
  void Reset() { totals_ = {}; }
  const CallTotals& Totals(Phase phase, DriverCall call) const {
    return totals_[static_cast<std::size_t>(phase)][static_cast<std::size_t>(call)];
  }
  // Sum over every kind of one phase.
  CallTotals Sum(Phase phase) const {
    CallTotals sum;
    for (const CallTotals& t : totals_[static_cast<std::size_t>(phase)]) {
      sum.calls += t.calls;
      sum.wall_ns += t.wall_ns;
      sum.cpu_ns += t.cpu_ns;
    }
    return sum;
  }

  absl::StatusOr<DevicePtr> AddressReserve(std::size_t size, std::size_t alignment = 0) override {
    return Time(DriverCall::kAddressReserve,
                [&] { return ForwardingDriver::AddressReserve(size, alignment); });
  }
  absl::Status AddressFree(DevicePtr ptr, std::size_t size) override {
    return Time(DriverCall::kAddressFree, [&] { return ForwardingDriver::AddressFree(ptr, size); });
  }
  absl::StatusOr<PhysicalHandle> MemCreate(std::size_t size) override {
    return Time(DriverCall::kMemCreate, [&] { return ForwardingDriver::MemCreate(size); });
  }
  absl::Status MemRelease(PhysicalHandle handle) override {
    return Time(DriverCall::kMemRelease, [&] { return ForwardingDriver::MemRelease(handle); });
  }
  absl::Status MemMap(DevicePtr ptr, std::size_t size, PhysicalHandle handle) override {
    return Time(DriverCall::kMemMap, [&] { return ForwardingDriver::MemMap(ptr, size, handle); });
  }
  absl::Status MemUnmap(DevicePtr ptr, std::size_t size) override {
    return Time(DriverCall::kMemUnmap, [&] { return ForwardingDriver::MemUnmap(ptr, size); });
  }
  absl::Status MemSetAccess(DevicePtr ptr, std::size_t size, std::span<const int> peers = {}) override {
    return Time(DriverCall::kMemSetAccess, [&] { return ForwardingDriver::MemSetAccess(ptr, size, peers); });
  }
  absl::Status StreamSynchronize(Stream stream) override {
    return Time(DriverCall::kSync, [&] { return ForwardingDriver::StreamSynchronize(stream); });
  }
  absl::Status DeviceSynchronize() override {
    return Time(DriverCall::kSync, [&] { return ForwardingDriver::DeviceSynchronize(); });
  }
  absl::StatusOr<bool> EventQuery(Event event) override {
    return Time(DriverCall::kSync, [&] { return ForwardingDriver::EventQuery(event); });
  }
  absl::Status EventSynchronize(Event event) override {
    return Time(DriverCall::kSync, [&] { return ForwardingDriver::EventSynchronize(event); });
  }
  absl::StatusOr<DevicePtr> MemAlloc(std::size_t size) override {
    return Time(DriverCall::kOther, [&] { return ForwardingDriver::MemAlloc(size); });
  }
  absl::Status MemFree(DevicePtr ptr) override {
    return Time(DriverCall::kOther, [&] { return ForwardingDriver::MemFree(ptr); });
  }
  absl::StatusOr<MemoryInfo> GetMemoryInfo() override {
    return Time(DriverCall::kOther, [&] { return ForwardingDriver::GetMemoryInfo(); });
  }

 private:
  template <class F>
  auto Time(DriverCall call, F&& f) -> decltype(f()) {
    if (phase_ == Phase::kNone) return f();
    const std::int64_t wall0 = WallNs();
    const std::int64_t cpu0 = ThreadCpuNs();
    auto result = f();
    const std::int64_t cpu1 = ThreadCpuNs();
    const std::int64_t wall1 = WallNs();
    CallTotals& t = totals_[static_cast<std::size_t>(phase_)][static_cast<std::size_t>(call)];
    ++t.calls;
    t.wall_ns += wall1 - wall0;
    t.cpu_ns += cpu1 - cpu0;
    return result;
  }

  Phase phase_ = Phase::kNone;
  std::array<std::array<CallTotals, kDriverCallKinds>, 2> totals_{};
};

}  // namespace graphalloc::bench

#endif  // GRAPHALLOC_BENCH_TIMED_DRIVER_H_

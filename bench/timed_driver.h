// A Driver decorator for benchmarks: forwards every call to the wrapped driver (ForwardingDriver) and, while
// a phase is selected, counts the calls an allocator's growth, release, sleep and wake are made of, by
// kind, with their wall-clock and thread CPU time: the VMM calls, the synchronizations, pinned host memory
// and copies (a sleep's backup), and the plain device allocations and memory queries (kOther). Benchmarks
// use it to split an allocator's time by driver call (how much of a growth is cuMemCreate,
// cuMemSetAccess, ...; wall time well above CPU time means the calling thread sleeps inside the driver,
// waiting for the GPU). Every other call (streams, events, memsets, graphs) is forwarded untimed.
//
// Cost: two steady_clock and two CLOCK_THREAD_CPUTIME_ID reads per recorded call (well under a
// microsecond, against the tens of microseconds of a VMM call), and a virtual call. Nothing of this is in
// the library: the allocator is measured through it only where a benchmark says so (expandable_bench's
// *_split variants, whose plain variants use the bare driver, so the two can be compared; all of
// sleep_wake_bench, whose bare-driver baselines go through it too).
//
// The totals are plain counters, not atomics: for single-threaded benchmarks only (the forwarding itself
// is as thread-safe as the wrapped driver).
#ifndef GRAPHALLOC_BENCH_TIMED_DRIVER_H_
#define GRAPHALLOC_BENCH_TIMED_DRIVER_H_

#include <benchmark/benchmark.h>
#include <time.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "graphalloc/allocator/device/forwarding_driver.h"

namespace graphalloc::bench {

// The call kinds told apart. kSync: StreamSynchronize, DeviceSynchronize, EventSynchronize (and
// EventQuery, which polls the same thing); kOther: MemAlloc, MemFree, GetMemoryInfo; kCopy: CopyAsync,
// CopyHostToDevice, CopyDeviceToHost (an async copy's wall time is its enqueueing: the wait for it lands in
// the kSync that follows).
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
  kHostAlloc,
  kHostFree,
  kCopy,
  kCount,
};
inline constexpr int kDriverCallKinds = static_cast<int>(DriverCall::kCount);

// Short names for counters: "reserve", "addr_free", "create", "release", "map", "unmap", "access",
// "sync", "other", "host_alloc", "host_free", "copy".
inline const char* DriverCallName(DriverCall call) {
  static constexpr std::array<const char*, kDriverCallKinds> kNames = {
      "reserve", "addr_free", "create", "release",    "map",       "unmap",
      "access",  "sync",      "other",  "host_alloc", "host_free", "copy"};
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
  absl::StatusOr<void*> HostAlloc(std::size_t size) override {
    return Time(DriverCall::kHostAlloc, [&] { return ForwardingDriver::HostAlloc(size); });
  }
  absl::Status HostFree(void* ptr) override {
    return Time(DriverCall::kHostFree, [&] { return ForwardingDriver::HostFree(ptr); });
  }
  absl::Status CopyHostToDevice(DevicePtr dst, const void* src, std::size_t bytes) override {
    return Time(DriverCall::kCopy, [&] { return ForwardingDriver::CopyHostToDevice(dst, src, bytes); });
  }
  absl::Status CopyDeviceToHost(void* dst, DevicePtr src, std::size_t bytes) override {
    return Time(DriverCall::kCopy, [&] { return ForwardingDriver::CopyDeviceToHost(dst, src, bytes); });
  }
  absl::Status CopyAsync(DevicePtr dst, DevicePtr src, std::size_t bytes, Stream stream) override {
    return Time(DriverCall::kCopy, [&] { return ForwardingDriver::CopyAsync(dst, src, bytes, stream); });
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

// Leaves the wrapper recording nothing when a benchmark ends, however it ends.
struct PhaseReset {
  TimedDriver* timed;
  ~PhaseReset() {
    if (timed != nullptr) timed->SetPhase(TimedDriver::Phase::kNone);
  }
};

// Per-iteration counters from the wrapper's totals and the timed part's own clocks (`timed_wall_ns`,
// `timed_cpu_ns`, summed over the iterations): for each kind called, <call>_n, <call>_us, <call>_cpu_us
// of the timed phase and td_<call>_us of the teardown phase; timed_us, timed_cpu_us; driver_us,
// driver_cpu_us (the timed kinds summed); rest_us, rest_cpu_us (timed minus driver: the caller's own
// work).
inline void ReportSplit(benchmark::State& state, const TimedDriver& timed, std::int64_t timed_wall_ns,
                        std::int64_t timed_cpu_ns) {
  using Phase = TimedDriver::Phase;
  if (state.iterations() == 0) return;
  const double n = static_cast<double>(state.iterations());
  auto us = [n](std::int64_t ns) { return static_cast<double>(ns) / 1e3 / n; };
  for (int k = 0; k < kDriverCallKinds; ++k) {
    const auto call = static_cast<DriverCall>(k);
    const std::string name = DriverCallName(call);
    const CallTotals& t = timed.Totals(Phase::kTimed, call);
    if (t.calls != 0) {
      state.counters[name + "_n"] = static_cast<double>(t.calls) / n;
      state.counters[name + "_us"] = us(t.wall_ns);
      state.counters[name + "_cpu_us"] = us(t.cpu_ns);
    }
    const CallTotals& td = timed.Totals(Phase::kTeardown, call);
    if (td.calls != 0) state.counters["td_" + name + "_us"] = us(td.wall_ns);
  }
  const CallTotals driver = timed.Sum(Phase::kTimed);
  state.counters["timed_us"] = us(timed_wall_ns);
  state.counters["timed_cpu_us"] = us(timed_cpu_ns);
  state.counters["driver_us"] = us(driver.wall_ns);
  state.counters["driver_cpu_us"] = us(driver.cpu_ns);
  state.counters["rest_us"] = us(timed_wall_ns - driver.wall_ns);
  state.counters["rest_cpu_us"] = us(timed_cpu_ns - driver.cpu_ns);
}

}  // namespace graphalloc::bench

#endif  // GRAPHALLOC_BENCH_TIMED_DRIVER_H_

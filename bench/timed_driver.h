// A Driver decorator for benchmarks: forwards every call to the wrapped driver and, while a phase is
// selected, counts the calls of each kind with their wall-clock and thread CPU time. Benchmarks use it to
// split an allocator's time by driver call (how much of a growth is cuMemCreate, cuMemSetAccess, ...;
// wall time well above CPU time means the calling thread sleeps inside the driver, waiting for the GPU).
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
#include <utility>

#include "graphalloc/allocator/device/driver.h"

namespace graphalloc::bench {

// The call kinds told apart. kSync: StreamSynchronize, DeviceSynchronize, EventSynchronize (and
// EventQuery, which polls the same thing).
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

class TimedDriver final : public Driver {
 public:
  // What the recorded calls count towards: nothing (kNone), the timed part of a benchmark iteration or
  // its untimed teardown.
  enum class Phase : int { kNone = -1, kTimed = 0, kTeardown = 1 };

  explicit TimedDriver(std::shared_ptr<Driver> inner) : inner_(std::move(inner)) {}

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
  Driver& inner() { return *inner_; }

  std::string_view Kind() const override { return inner_->Kind(); }
  const DeviceInfo& Info() const override { return inner_->Info(); }
  absl::Status EnablePeerAccess(int peer) override {
    return Time(DriverCall::kOther, [&] { return inner_->EnablePeerAccess(peer); });
  }
  absl::StatusOr<MemoryInfo> GetMemoryInfo() override {
    return Time(DriverCall::kOther, [&] { return inner_->GetMemoryInfo(); });
  }
  absl::StatusOr<DevicePtr> AddressReserve(std::size_t size, std::size_t alignment) override {
    return Time(DriverCall::kAddressReserve, [&] { return inner_->AddressReserve(size, alignment); });
  }
  absl::Status AddressFree(DevicePtr ptr, std::size_t size) override {
    return Time(DriverCall::kAddressFree, [&] { return inner_->AddressFree(ptr, size); });
  }
  absl::StatusOr<PhysicalHandle> MemCreate(std::size_t size) override {
    return Time(DriverCall::kMemCreate, [&] { return inner_->MemCreate(size); });
  }
  absl::Status MemRelease(PhysicalHandle handle) override {
    return Time(DriverCall::kMemRelease, [&] { return inner_->MemRelease(handle); });
  }
  absl::Status MemMap(DevicePtr ptr, std::size_t size, PhysicalHandle handle) override {
    return Time(DriverCall::kMemMap, [&] { return inner_->MemMap(ptr, size, handle); });
  }
  absl::Status MemUnmap(DevicePtr ptr, std::size_t size) override {
    return Time(DriverCall::kMemUnmap, [&] { return inner_->MemUnmap(ptr, size); });
  }
  absl::Status MemSetAccess(DevicePtr ptr, std::size_t size, std::span<const int> peers) override {
    return Time(DriverCall::kMemSetAccess, [&] { return inner_->MemSetAccess(ptr, size, peers); });
  }
  absl::StatusOr<DevicePtr> MemAlloc(std::size_t size) override {
    return Time(DriverCall::kOther, [&] { return inner_->MemAlloc(size); });
  }
  absl::Status MemFree(DevicePtr ptr) override {
    return Time(DriverCall::kOther, [&] { return inner_->MemFree(ptr); });
  }
  absl::StatusOr<void*> HostAlloc(std::size_t size) override {
    return Time(DriverCall::kOther, [&] { return inner_->HostAlloc(size); });
  }
  absl::Status HostFree(void* ptr) override {
    return Time(DriverCall::kOther, [&] { return inner_->HostFree(ptr); });
  }
  absl::Status CopyHostToDevice(DevicePtr dst, const void* src, std::size_t bytes) override {
    return Time(DriverCall::kOther, [&] { return inner_->CopyHostToDevice(dst, src, bytes); });
  }
  absl::Status CopyDeviceToHost(void* dst, DevicePtr src, std::size_t bytes) override {
    return Time(DriverCall::kOther, [&] { return inner_->CopyDeviceToHost(dst, src, bytes); });
  }
  absl::Status CopyAsync(DevicePtr dst, DevicePtr src, std::size_t bytes, Stream stream) override {
    return Time(DriverCall::kOther, [&] { return inner_->CopyAsync(dst, src, bytes, stream); });
  }
  absl::Status MemsetAsync(DevicePtr dst, std::uint8_t value, std::size_t bytes, Stream stream) override {
    return Time(DriverCall::kOther, [&] { return inner_->MemsetAsync(dst, value, bytes, stream); });
  }
  absl::StatusOr<Stream> StreamCreate() override {
    return Time(DriverCall::kOther, [&] { return inner_->StreamCreate(); });
  }
  absl::Status StreamDestroy(Stream stream) override {
    return Time(DriverCall::kOther, [&] { return inner_->StreamDestroy(stream); });
  }
  absl::Status StreamSynchronize(Stream stream) override {
    return Time(DriverCall::kSync, [&] { return inner_->StreamSynchronize(stream); });
  }
  absl::Status StreamWaitEvent(Stream stream, Event event) override {
    return Time(DriverCall::kOther, [&] { return inner_->StreamWaitEvent(stream, event); });
  }
  absl::Status LaunchHostFunction(Stream stream, HostFunction fn) override {
    return Time(DriverCall::kOther, [&] { return inner_->LaunchHostFunction(stream, std::move(fn)); });
  }
  absl::Status DeviceSynchronize() override {
    return Time(DriverCall::kSync, [&] { return inner_->DeviceSynchronize(); });
  }
  absl::StatusOr<Event> EventCreate() override {
    return Time(DriverCall::kOther, [&] { return inner_->EventCreate(); });
  }
  absl::Status EventDestroy(Event event) override {
    return Time(DriverCall::kOther, [&] { return inner_->EventDestroy(event); });
  }
  absl::Status EventRecord(Event event, Stream stream) override {
    return Time(DriverCall::kOther, [&] { return inner_->EventRecord(event, stream); });
  }
  absl::StatusOr<bool> EventQuery(Event event) override {
    return Time(DriverCall::kSync, [&] { return inner_->EventQuery(event); });
  }
  absl::Status EventSynchronize(Event event) override {
    return Time(DriverCall::kSync, [&] { return inner_->EventSynchronize(event); });
  }
  absl::Status BeginCapture(Stream stream, CaptureMode mode) override {
    return Time(DriverCall::kOther, [&] { return inner_->BeginCapture(stream, mode); });
  }
  absl::StatusOr<Graph> EndCapture(Stream stream) override {
    return Time(DriverCall::kOther, [&] { return inner_->EndCapture(stream); });
  }
  absl::StatusOr<CaptureInfo> GetCaptureInfo(Stream stream) override {
    return Time(DriverCall::kOther, [&] { return inner_->GetCaptureInfo(stream); });
  }
  absl::StatusOr<CaptureMode> ExchangeCaptureMode(CaptureMode mode) override {
    return Time(DriverCall::kOther, [&] { return inner_->ExchangeCaptureMode(mode); });
  }
  absl::StatusOr<GraphExec> GraphInstantiate(Graph graph) override {
    return Time(DriverCall::kOther, [&] { return inner_->GraphInstantiate(graph); });
  }
  absl::StatusOr<GraphUpdateResult> GraphExecUpdate(GraphExec exec, Graph graph) override {
    return Time(DriverCall::kOther, [&] { return inner_->GraphExecUpdate(exec, graph); });
  }
  absl::Status GraphLaunch(GraphExec exec, Stream stream) override {
    return Time(DriverCall::kOther, [&] { return inner_->GraphLaunch(exec, stream); });
  }
  absl::Status GraphExecDestroy(GraphExec exec) override {
    return Time(DriverCall::kOther, [&] { return inner_->GraphExecDestroy(exec); });
  }
  absl::Status GraphDestroy(Graph graph) override {
    return Time(DriverCall::kOther, [&] { return inner_->GraphDestroy(graph); });
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

  std::shared_ptr<Driver> inner_;
  Phase phase_ = Phase::kNone;
  std::array<std::array<CallTotals, kDriverCallKinds>, 2> totals_{};
};

}  // namespace graphalloc::bench

#endif  // GRAPHALLOC_BENCH_TIMED_DRIVER_H_

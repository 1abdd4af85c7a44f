// Device-layer tests written once against the Driver interface; they run on the simulated device and,
// with GRAPHALLOC_TEST_DEVICE=cuda (CTest label `gpu`), unchanged on the real GPU. Sizes come from the
// device's own granularity. What only the simulated device can show (fault injection, counters, a death
// test on a stale mapping) uses AsSim() and skips on the real one.
#include "graphalloc/allocator/device/driver.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "graphalloc/allocator/base/bytes.h"
#include "graphalloc/allocator/device/driver_error.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using ::graphalloc::testing::AsSim;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

std::vector<std::uint8_t> Pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed + i * 31);
  return v;
}

void ExpectAllZero(const SimCounters& c) {
  EXPECT_EQ(c.reservations, 0u);
  EXPECT_EQ(c.reserved_bytes, 0u);
  EXPECT_EQ(c.handles, 0u);
  EXPECT_EQ(c.handle_bytes, 0u);
  EXPECT_EQ(c.mappings, 0u);
  EXPECT_EQ(c.mapped_bytes, 0u);
  EXPECT_EQ(c.allocations, 0u);
  EXPECT_EQ(c.allocated_bytes, 0u);
  EXPECT_EQ(c.streams, 0u);
  EXPECT_EQ(c.events, 0u);
  EXPECT_EQ(c.graphs, 0u);
  EXPECT_EQ(c.graph_execs, 0u);
  EXPECT_EQ(c.pending_work, 0u);
  EXPECT_EQ(c.host_allocations, 0u);
  EXPECT_EQ(c.host_bytes, 0u);
}

TEST(DriverTest, ReservesMapsThreeHandlesAndReadsBackWhatWasWritten) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t gran = driver->Info().granularity;
  ASSERT_GT(gran, 0u);
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, driver->AddressReserve(kGiB, 0));
  EXPECT_EQ(base % gran, 0u);
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, driver->MemCreate(gran));
    ASSERT_OK(driver->MemMap(base + i * gran, gran, h));
    handles.push_back(h);
  }
  ASSERT_OK(driver->MemSetAccess(base, 3 * gran, {}));
  if (SimDriver* sim = AsSim(driver.get())) {
    EXPECT_EQ(sim->Counters().mappings, 3u);
    EXPECT_EQ(sim->Counters().mapped_bytes, 3 * gran);
    EXPECT_EQ(sim->Counters().handles, 3u);
  }
  const std::vector<std::uint8_t> written = Pattern(3 * gran, 7);
  ASSERT_OK(driver->CopyHostToDevice(base, written.data(), written.size()));
  std::vector<std::uint8_t> read(3 * gran, 0);
  ASSERT_OK(driver->CopyDeviceToHost(read.data(), base, read.size()));
  EXPECT_TRUE(read == written);
  // The middle handle alone, at an offset that is not a page boundary.
  std::uint8_t four[4] = {};
  ASSERT_OK(driver->CopyDeviceToHost(four, base + gran + 5, 4));
  EXPECT_THAT(four, ElementsAre(written[gran + 5], written[gran + 6], written[gran + 7], written[gran + 8]));

  ASSERT_OK(driver->MemUnmap(base, 3 * gran));  // one call may cover adjacent mappings
  for (PhysicalHandle h : handles) ASSERT_OK(driver->MemRelease(h));
  ASSERT_OK(driver->AddressFree(base, kGiB));
  if (SimDriver* sim = AsSim(driver.get())) ExpectAllZero(sim->Counters());
}

TEST(DriverTest, OneHandleMappedAtTwoAddressesAliases) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t gran = driver->Info().granularity;
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, driver->AddressReserve(4 * gran, 0));
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, driver->MemCreate(gran));
  const DevicePtr first = base;
  const DevicePtr second = base + 2 * gran;
  ASSERT_OK(driver->MemMap(first, gran, h));
  ASSERT_OK(driver->MemMap(second, gran, h));
  ASSERT_OK(driver->MemSetAccess(first, gran, {}));
  ASSERT_OK(driver->MemSetAccess(second, gran, {}));
  const std::uint64_t value = 0x0123456789abcdefULL;
  ASSERT_OK(driver->CopyHostToDevice(first + 64, &value, sizeof(value)));
  std::uint64_t seen = 0;
  ASSERT_OK(driver->CopyDeviceToHost(&seen, second + 64, sizeof(seen)));
  EXPECT_EQ(seen, value);
  ASSERT_OK(driver->MemUnmap(first, gran));
  ASSERT_OK(driver->MemUnmap(second, gran));
  ASSERT_OK(driver->MemRelease(h));
  ASSERT_OK(driver->AddressFree(base, 4 * gran));
}

TEST(DriverTest, UnmappedAccessFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t gran = driver->Info().granularity;
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, driver->AddressReserve(gran, 0));
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, driver->MemCreate(gran));
  ASSERT_OK(driver->MemMap(base, gran, h));
  ASSERT_OK(driver->MemSetAccess(base, gran, {}));
  const std::uint32_t value = 42;
  ASSERT_OK(driver->CopyHostToDevice(base, &value, sizeof(value)));
  ASSERT_OK(driver->MemUnmap(base, gran));
  std::uint32_t out = 0;
  if (AsSim(driver.get()) != nullptr) {
    // Device addresses are host addresses on the simulated device: a stale one faults like an illegal
    // address on a GPU, whether touched directly or through a copy.
    EXPECT_DEATH({ std::printf("%d\n", static_cast<int>(*reinterpret_cast<volatile std::uint32_t*>(base))); },
                 "");
    EXPECT_DEATH({ (void)driver->CopyDeviceToHost(&out, base, sizeof(out)); }, "");
  } else {
    EXPECT_FALSE(driver->CopyDeviceToHost(&out, base, sizeof(out)).ok());
  }
  ASSERT_OK(driver->MemRelease(h));
  ASSERT_OK(driver->AddressFree(base, gran));
}

TEST(DriverTest, MappedMemoryIsInaccessibleUntilAccessIsSet) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  if (AsSim(driver.get()) == nullptr) GTEST_SKIP() << "a death test needs host-visible device addresses";
  const std::size_t gran = driver->Info().granularity;
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, driver->AddressReserve(gran, 0));
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, driver->MemCreate(gran));
  ASSERT_OK(driver->MemMap(base, gran, h));
  EXPECT_DEATH({ *reinterpret_cast<volatile std::uint32_t*>(base) = 1; }, "");
  ASSERT_OK(driver->MemUnmap(base, gran));
  ASSERT_OK(driver->MemRelease(h));
  ASSERT_OK(driver->AddressFree(base, gran));
}

TEST(DriverTest, CreatingMoreThanTheDeviceHoldsIsOutOfMemory) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t gran = driver->Info().granularity;
  const std::size_t too_much = RoundUp(driver->Info().total_memory + gran, gran);
  const absl::StatusOr<PhysicalHandle> handle = driver->MemCreate(too_much);
  ASSERT_FALSE(handle.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(handle.status())) << handle.status();
  EXPECT_THAT(DriverErrorCode(handle.status()), Optional(static_cast<int>(DriverResult::kOutOfMemory)));
  EXPECT_EQ(handle.status().message(), "cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  const absl::StatusOr<DevicePtr> plain = driver->MemAlloc(too_much);
  ASSERT_FALSE(plain.ok());
  EXPECT_THAT(DriverErrorCode(plain.status()), Optional(static_cast<int>(DriverResult::kOutOfMemory)));
  if (SimDriver* sim = AsSim(driver.get())) ExpectAllZero(sim->Counters());
}

TEST(DriverTest, InjectedFaultFailsExactlyTheThirdMap) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  SimDriver* sim = AsSim(driver.get());
  if (sim == nullptr) GTEST_SKIP() << "fault injection needs the simulated device";
  const std::size_t gran = driver->Info().granularity;
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, driver->AddressReserve(4 * gran, 0));
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, driver->MemCreate(gran));
    handles.push_back(h);
  }
  sim->InjectFault(SimCall::kMemMap, 3, DriverResult::kOutOfMemory);
  std::vector<bool> ok;
  for (int i = 0; i < 4; ++i) ok.push_back(driver->MemMap(base + i * gran, gran, handles[i]).ok());
  EXPECT_THAT(ok, ElementsAre(true, true, false, true));
  EXPECT_EQ(sim->InjectedFaultCount(), 1u);
  EXPECT_EQ(sim->CallCount(SimCall::kMemMap), 4u);
  // The failed call had no effect: that range is still free, so the same map succeeds now.
  EXPECT_EQ(sim->Counters().mappings, 3u);
  ASSERT_OK(driver->MemMap(base + 2 * gran, gran, handles[2]));
  ASSERT_OK(driver->MemUnmap(base, 4 * gran));
  for (PhysicalHandle h : handles) ASSERT_OK(driver->MemRelease(h));
  ASSERT_OK(driver->AddressFree(base, 4 * gran));
  ExpectAllZero(sim->Counters());
}

TEST(DriverTest, CapturedClosuresRunOnlyWhenTheGraphLaunchesInOrder) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  ASSERT_OK_AND_ASSIGN(const Stream stream, driver->StreamCreate());
  std::vector<int> ran;
  ASSERT_OK(driver->BeginCapture(stream, CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(const CaptureInfo info, driver->GetCaptureInfo(stream));
  EXPECT_EQ(info.status, CaptureStatus::kActive);
  EXPECT_NE(info.id, 0u);
  for (int i = 0; i < 3; ++i) ASSERT_OK(driver->LaunchHostFunction(stream, [&ran, i] { ran.push_back(i); }));
  ASSERT_OK_AND_ASSIGN(const Graph graph, driver->EndCapture(stream));
  ASSERT_OK_AND_ASSIGN(const CaptureInfo after, driver->GetCaptureInfo(stream));
  EXPECT_EQ(after.status, CaptureStatus::kNone);
  EXPECT_TRUE(ran.empty());
  ASSERT_OK_AND_ASSIGN(const GraphExec exec, driver->GraphInstantiate(graph));
  ASSERT_OK(driver->StreamSynchronize(stream));
  EXPECT_TRUE(ran.empty());
  ASSERT_OK(driver->GraphLaunch(exec, stream));
  ASSERT_OK(driver->StreamSynchronize(stream));
  EXPECT_THAT(ran, ElementsAre(0, 1, 2));
  ASSERT_OK(driver->GraphLaunch(exec, stream));
  ASSERT_OK(driver->StreamSynchronize(stream));
  EXPECT_THAT(ran, ElementsAre(0, 1, 2, 0, 1, 2));
  ASSERT_OK(driver->GraphExecDestroy(exec));
  ASSERT_OK(driver->GraphDestroy(graph));
  ASSERT_OK(driver->StreamDestroy(stream));
  if (SimDriver* sim = AsSim(driver.get())) ExpectAllZero(sim->Counters());
}

TEST(DriverTest, EventQueryOnCapturingStreamFailsAndInvalidatesTheCapture) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  ASSERT_OK_AND_ASSIGN(const Stream stream, driver->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Event event, driver->EventCreate());
  bool ran = false;
  ASSERT_OK(driver->BeginCapture(stream, CaptureMode::kGlobal));
  ASSERT_OK(driver->LaunchHostFunction(stream, [&ran] { ran = true; }));
  ASSERT_OK(driver->EventRecord(event, stream));
  const absl::StatusOr<bool> query = driver->EventQuery(event);
  ASSERT_FALSE(query.ok());
  if (AsSim(driver.get()) != nullptr) {
    EXPECT_EQ(
        query.status().message(),
        "cuEventQuery failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (operation not permitted when stream "
        "is capturing)");
  } else {
    // The real driver may report the captured-event error (907) rather than the unsupported one.
    EXPECT_THAT(DriverErrorCode(query.status()),
                Optional(AnyOf(static_cast<int>(DriverResult::kStreamCaptureUnsupported), 907)));
  }
  ASSERT_OK_AND_ASSIGN(const CaptureInfo info, driver->GetCaptureInfo(stream));
  EXPECT_EQ(info.status, CaptureStatus::kInvalidated);
  const absl::StatusOr<Graph> graph = driver->EndCapture(stream);
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(DriverErrorCode(graph.status()),
              Optional(static_cast<int>(DriverResult::kStreamCaptureInvalidated)));
  ASSERT_OK_AND_ASSIGN(const CaptureInfo after, driver->GetCaptureInfo(stream));
  EXPECT_EQ(after.status, CaptureStatus::kNone);
  ASSERT_OK(driver->StreamSynchronize(stream));
  EXPECT_FALSE(ran);
  ASSERT_OK(driver->EventDestroy(event));
  ASSERT_OK(driver->StreamDestroy(stream));
  if (SimDriver* sim = AsSim(driver.get())) ExpectAllZero(sim->Counters());
}

TEST(DriverTest, MisalignedReserveIsInvalidArgumentNamingTheCall) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const absl::StatusOr<DevicePtr> ptr = driver->AddressReserve(driver->Info().granularity + 1, 0);
  ASSERT_FALSE(ptr.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ptr.status())) << ptr.status();
  EXPECT_EQ(ptr.status().message(),
            "cuMemAddressReserve failed: CUDA_ERROR_INVALID_VALUE (invalid argument)");
}

TEST(DriverTest, PlainAllocationRoundTripsAndRejectsAnUnknownPointer) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  ASSERT_OK_AND_ASSIGN(const DevicePtr ptr, driver->MemAlloc(1000));
  EXPECT_NE(ptr, 0u);
  const std::vector<std::uint8_t> written = Pattern(1000, 3);
  ASSERT_OK(driver->CopyHostToDevice(ptr, written.data(), written.size()));
  std::vector<std::uint8_t> read(1000);
  ASSERT_OK(driver->CopyDeviceToHost(read.data(), ptr, read.size()));
  EXPECT_TRUE(read == written);
  if (SimDriver* sim = AsSim(driver.get())) {
    EXPECT_EQ(sim->Counters().allocations, 1u);
    EXPECT_EQ(sim->Counters().allocated_bytes, driver->Info().granularity);
  }
  ASSERT_OK(driver->MemFree(ptr));
  const absl::Status again = driver->MemFree(ptr);
  EXPECT_THAT(DriverErrorCode(again), Optional(static_cast<int>(DriverResult::kInvalidValue)));
  if (SimDriver* sim = AsSim(driver.get())) ExpectAllZero(sim->Counters());
}

TEST(DriverTest, PinnedHostMemoryIsACopyEndpointBothWays) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  constexpr std::size_t kBytes = 3 * 4096 + 100;
  ASSERT_OK_AND_ASSIGN(void* host, driver->HostAlloc(kBytes));
  ASSERT_NE(host, nullptr);
  if (SimDriver* sim = AsSim(driver.get())) {
    EXPECT_EQ(sim->Counters().host_allocations, 1u);
    EXPECT_EQ(sim->Counters().host_bytes, kBytes);
  }
  ASSERT_OK_AND_ASSIGN(const DevicePtr device, driver->MemAlloc(kBytes));
  ASSERT_OK_AND_ASSIGN(const Stream stream, driver->StreamCreate());
  // Host -> device and back through CopyAsync, with the pinned memory's address as a DevicePtr.
  const std::vector<std::uint8_t> written = Pattern(kBytes, 11);
  std::memcpy(host, written.data(), kBytes);
  ASSERT_OK(driver->CopyAsync(device, reinterpret_cast<DevicePtr>(host), kBytes, stream));
  ASSERT_OK(driver->MemsetAsync(reinterpret_cast<DevicePtr>(host), 0, kBytes, stream));
  ASSERT_OK(driver->CopyAsync(reinterpret_cast<DevicePtr>(host), device, kBytes, stream));
  ASSERT_OK(driver->StreamSynchronize(stream));
  EXPECT_EQ(std::memcmp(host, written.data(), kBytes), 0);
  ASSERT_OK(driver->StreamDestroy(stream));
  ASSERT_OK(driver->MemFree(device));
  ASSERT_OK(driver->HostFree(host));
  const absl::Status again = driver->HostFree(host);
  EXPECT_FALSE(again.ok());
  if (SimDriver* sim = AsSim(driver.get())) {
    EXPECT_THAT(DriverErrorCode(again), Optional(static_cast<int>(DriverResult::kInvalidValue)));
    EXPECT_EQ(sim->Counters().illegal_accesses, 0u);
    ExpectAllZero(sim->Counters());
  }
}

TEST(DriverTest, EventCompletesAfterTheWorkBeforeIt) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  ASSERT_OK_AND_ASSIGN(const Stream stream, driver->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Event event, driver->EventCreate());
  ASSERT_OK_AND_ASSIGN(const bool never_recorded, driver->EventQuery(event));
  EXPECT_TRUE(never_recorded);
  std::vector<int> ran;
  ASSERT_OK(driver->LaunchHostFunction(stream, [&ran] { ran.push_back(1); }));
  ASSERT_OK(driver->EventRecord(event, stream));
  ASSERT_OK(driver->EventSynchronize(event));
  EXPECT_THAT(ran, ElementsAre(1));
  ASSERT_OK_AND_ASSIGN(const bool done, driver->EventQuery(event));
  EXPECT_TRUE(done);
  ASSERT_OK(driver->EventDestroy(event));
  ASSERT_OK(driver->StreamDestroy(stream));
}

TEST(DriverTest, AsyncCopyAndMemsetAreStreamOrdered) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  ASSERT_OK_AND_ASSIGN(const Stream stream, driver->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const DevicePtr a, driver->MemAlloc(4096));
  ASSERT_OK_AND_ASSIGN(const DevicePtr b, driver->MemAlloc(4096));
  ASSERT_OK(driver->MemsetAsync(a, 0x5a, 4096, stream));
  ASSERT_OK(driver->CopyAsync(b, a, 4096, stream));
  ASSERT_OK(driver->MemsetAsync(a, 0x11, 16, stream));
  ASSERT_OK(driver->StreamSynchronize(stream));
  std::uint8_t from_a[17] = {};
  std::uint8_t from_b[2] = {};
  ASSERT_OK(driver->CopyDeviceToHost(from_a, a, sizeof(from_a)));
  ASSERT_OK(driver->CopyDeviceToHost(from_b, b + 4094, sizeof(from_b)));
  EXPECT_EQ(from_a[0], 0x11);
  EXPECT_EQ(from_a[15], 0x11);
  EXPECT_EQ(from_a[16], 0x5a);
  EXPECT_THAT(from_b, ElementsAre(0x5a, 0x5a));
  ASSERT_OK(driver->MemFree(a));
  ASSERT_OK(driver->MemFree(b));
  ASSERT_OK(driver->StreamDestroy(stream));
}

// Captures `count` closures that append `base + i`.
absl::StatusOr<Graph> CaptureAppends(Driver& driver, Stream stream, std::vector<int>& out, int base,
                                     int count) {
  if (absl::Status s = driver.BeginCapture(stream, CaptureMode::kGlobal); !s.ok()) return s;
  for (int i = 0; i < count; ++i) {
    if (absl::Status s = driver.LaunchHostFunction(stream, [&out, v = base + i] { out.push_back(v); });
        !s.ok()) {
      return s;
    }
  }
  return driver.EndCapture(stream);
}

TEST(DriverTest, GraphExecUpdateSwapsParametersWhenTheTopologyMatches) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  ASSERT_OK_AND_ASSIGN(const Stream stream, driver->StreamCreate());
  std::vector<int> ran;
  ASSERT_OK_AND_ASSIGN(const Graph first, CaptureAppends(*driver, stream, ran, 0, 2));
  ASSERT_OK_AND_ASSIGN(const Graph second, CaptureAppends(*driver, stream, ran, 10, 2));
  ASSERT_OK_AND_ASSIGN(const GraphExec exec, driver->GraphInstantiate(first));
  ASSERT_OK_AND_ASSIGN(const GraphUpdateResult result, driver->GraphExecUpdate(exec, second));
  EXPECT_EQ(result, GraphUpdateResult::kSuccess);
  // The exec no longer needs either graph.
  ASSERT_OK(driver->GraphDestroy(first));
  ASSERT_OK(driver->GraphDestroy(second));
  ASSERT_OK(driver->GraphLaunch(exec, stream));
  ASSERT_OK(driver->StreamSynchronize(stream));
  EXPECT_THAT(ran, ElementsAre(10, 11));
  ASSERT_OK(driver->GraphExecDestroy(exec));
  ASSERT_OK(driver->StreamDestroy(stream));
  if (SimDriver* sim = AsSim(driver.get())) ExpectAllZero(sim->Counters());
}

TEST(DriverTest, GraphExecUpdateReportsATopologyChangeAndKeepsTheExec) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  ASSERT_OK_AND_ASSIGN(const Stream stream, driver->StreamCreate());
  std::vector<int> ran;
  ASSERT_OK_AND_ASSIGN(const Graph two, CaptureAppends(*driver, stream, ran, 0, 2));
  ASSERT_OK_AND_ASSIGN(const Graph three, CaptureAppends(*driver, stream, ran, 10, 3));
  ASSERT_OK_AND_ASSIGN(const GraphExec exec, driver->GraphInstantiate(two));
  ASSERT_OK_AND_ASSIGN(const GraphUpdateResult result, driver->GraphExecUpdate(exec, three));
  EXPECT_EQ(result, GraphUpdateResult::kTopologyChanged);
  ASSERT_OK(driver->GraphLaunch(exec, stream));
  ASSERT_OK(driver->StreamSynchronize(stream));
  EXPECT_THAT(ran, ElementsAre(0, 1));
  ASSERT_OK(driver->GraphExecDestroy(exec));
  ASSERT_OK(driver->GraphDestroy(two));
  ASSERT_OK(driver->GraphDestroy(three));
  ASSERT_OK(driver->StreamDestroy(stream));
}

TEST(DriverTest, ClosureThatEnqueuesMoreWorkDoesNotDeadlock) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  // CUDA forbids driver calls inside a host function; only the simulated device lets a "kernel" enqueue.
  if (AsSim(driver.get()) == nullptr) GTEST_SKIP() << "host functions may not call the real driver";
  ASSERT_OK_AND_ASSIGN(const Stream stream, driver->StreamCreate());
  std::vector<int> ran;
  Driver* d = driver.get();
  ASSERT_OK(driver->LaunchHostFunction(stream, [&ran, d, stream] {
    ran.push_back(1);
    EXPECT_TRUE(d->LaunchHostFunction(stream, [&ran] { ran.push_back(3); }).ok());
    ran.push_back(2);
  }));
  ASSERT_OK(driver->LaunchHostFunction(stream, [&ran] { ran.push_back(4); }));
  ASSERT_OK(driver->StreamSynchronize(stream));
  // Work a closure enqueues runs after it, behind what was already queued.
  EXPECT_THAT(ran, ElementsAre(1, 2, 3, 4));
  ASSERT_OK(driver->StreamDestroy(stream));
}

TEST(DriverTest, CountersReturnToZeroAfterTeardown) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  SimDriver* sim = AsSim(driver.get());
  if (sim == nullptr) GTEST_SKIP() << "counters are a simulated-device feature";
  const std::size_t gran = driver->Info().granularity;
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, driver->AddressReserve(2 * gran, 0));
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, driver->MemCreate(gran));
  ASSERT_OK(driver->MemMap(base, gran, h));
  ASSERT_OK_AND_ASSIGN(const DevicePtr plain, driver->MemAlloc(3 * gran));
  ASSERT_OK_AND_ASSIGN(const Stream stream, driver->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Event event, driver->EventCreate());
  std::vector<int> ran;
  ASSERT_OK_AND_ASSIGN(const Graph graph, CaptureAppends(*driver, stream, ran, 0, 1));
  ASSERT_OK_AND_ASSIGN(const GraphExec exec, driver->GraphInstantiate(graph));
  const SimCounters held = sim->Counters();
  EXPECT_EQ(held.reservations, 1u);
  EXPECT_EQ(held.reserved_bytes, 2 * gran);
  EXPECT_EQ(held.handles, 1u);
  EXPECT_EQ(held.handle_bytes, gran);
  EXPECT_EQ(held.mappings, 1u);
  EXPECT_EQ(held.mapped_bytes, gran);
  EXPECT_EQ(held.allocations, 1u);
  EXPECT_EQ(held.allocated_bytes, 3 * gran);
  EXPECT_EQ(held.streams, 1u);
  EXPECT_EQ(held.events, 1u);
  EXPECT_EQ(held.graphs, 1u);
  EXPECT_EQ(held.graph_execs, 1u);
  EXPECT_EQ(sim->UsedBytes(), 4 * gran);
  ASSERT_OK(driver->GraphExecDestroy(exec));
  ASSERT_OK(driver->GraphDestroy(graph));
  ASSERT_OK(driver->EventDestroy(event));
  ASSERT_OK(driver->StreamDestroy(stream));
  ASSERT_OK(driver->MemFree(plain));
  ASSERT_OK(driver->MemUnmap(base, gran));
  ASSERT_OK(driver->MemRelease(h));
  ASSERT_OK(driver->AddressFree(base, 2 * gran));
  ExpectAllZero(sim->Counters());
  EXPECT_EQ(sim->UsedBytes(), 0u);
}

// ---- Sharing with other processes. Importing into the exporting process is what CUDA allows for
// shareable handles, so these run unchanged on the GPU; two processes are tests/ipc's. ----

TEST(DriverTest, ShareableHandleExportedAndImportedAliasesTheSameMemory) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t gran = driver->Info().granularity;
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, driver->MemCreateShareable(gran));
  ASSERT_OK_AND_ASSIGN(Driver::ShareableHandle shared, driver->MemExportToShareableHandle(h));
  ASSERT_GE(shared.fd, 0);
  if (shared.size == 0) shared.size = gran;  // CUDA cannot tell the size: the creator fills it in
  EXPECT_EQ(shared.size, gran);
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle imported, driver->MemImportFromShareableHandle(shared));
  ASSERT_EQ(close(shared.fd), 0);  // the import holds the memory, not the descriptor
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, driver->AddressReserve(2 * gran, 0));
  ASSERT_OK(driver->MemMap(base, gran, h));
  ASSERT_OK(driver->MemMap(base + gran, gran, imported));
  ASSERT_OK(driver->MemSetAccess(base, 2 * gran, {}));
  const std::vector<std::uint8_t> written = Pattern(gran, 3);
  ASSERT_OK(driver->CopyHostToDevice(base, written.data(), gran));
  std::vector<std::uint8_t> read(gran, 0);
  ASSERT_OK(driver->CopyDeviceToHost(read.data(), base + gran, gran));
  EXPECT_TRUE(read == written);
  const std::uint8_t back = 0xA5;
  ASSERT_OK(driver->CopyHostToDevice(base + gran + 17, &back, 1));
  std::uint8_t seen = 0;
  ASSERT_OK(driver->CopyDeviceToHost(&seen, base + 17, 1));
  EXPECT_EQ(seen, 0xA5);
  ASSERT_OK(driver->MemUnmap(base, 2 * gran));
  ASSERT_OK(driver->MemRelease(imported));
  ASSERT_OK(driver->MemRelease(h));
  ASSERT_OK(driver->AddressFree(base, 2 * gran));
  if (SimDriver* sim = AsSim(driver.get())) {
    ExpectAllZero(sim->Counters());
    EXPECT_EQ(sim->UsedBytes(), 0u);
  }
}

TEST(DriverTest, ImportedMemoryOutlivesTheCreatorsRelease) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t gran = driver->Info().granularity;
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, driver->MemCreateShareable(gran));
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, driver->AddressReserve(gran, 0));
  ASSERT_OK(driver->MemMap(base, gran, h));
  ASSERT_OK(driver->MemSetAccess(base, gran, {}));
  const std::vector<std::uint8_t> written = Pattern(gran, 11);
  ASSERT_OK(driver->CopyHostToDevice(base, written.data(), gran));
  ASSERT_OK_AND_ASSIGN(Driver::ShareableHandle shared, driver->MemExportToShareableHandle(h));
  if (shared.size == 0) shared.size = gran;
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle imported, driver->MemImportFromShareableHandle(shared));
  ASSERT_EQ(close(shared.fd), 0);
  ASSERT_OK(driver->MemUnmap(base, gran));
  ASSERT_OK(driver->MemRelease(h));
  ASSERT_OK(driver->MemMap(base, gran, imported));
  ASSERT_OK(driver->MemSetAccess(base, gran, {}));
  std::vector<std::uint8_t> read(gran, 0);
  ASSERT_OK(driver->CopyDeviceToHost(read.data(), base, gran));
  EXPECT_TRUE(read == written);
  ASSERT_OK(driver->MemUnmap(base, gran));
  ASSERT_OK(driver->MemRelease(imported));
  ASSERT_OK(driver->AddressFree(base, gran));
  if (SimDriver* sim = AsSim(driver.get())) {
    ExpectAllZero(sim->Counters());
    EXPECT_EQ(sim->UsedBytes(), 0u);
  }
}

TEST(DriverTest, HandleNotCreatedShareableDoesNotExport) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t gran = driver->Info().granularity;
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, driver->MemCreate(gran));
  const absl::StatusOr<Driver::ShareableHandle> shared = driver->MemExportToShareableHandle(h);
  EXPECT_FALSE(shared.ok());
  EXPECT_THAT(shared.status().message(), HasSubstr("cuMemExportToShareableHandle failed"));
  ASSERT_OK(driver->MemRelease(h));
}

TEST(DriverTest, RetainedAllocationHandleIsAnotherReferenceToTheMappedHandle) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t gran = driver->Info().granularity;
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, driver->AddressReserve(2 * gran, 0));
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, driver->MemCreateShareable(gran));
  ASSERT_OK(driver->MemMap(base + gran, gran, h));
  ASSERT_OK(driver->MemSetAccess(base + gran, gran, {}));
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle retained, driver->MemRetainAllocationHandle(base + gran + 4096));
  ASSERT_OK(driver->MemRelease(h));
  // The retained reference alone exports the memory and keeps the handle valid.
  ASSERT_OK_AND_ASSIGN(Driver::ShareableHandle shared, driver->MemExportToShareableHandle(retained));
  EXPECT_GE(shared.fd, 0);
  ASSERT_EQ(close(shared.fd), 0);
  EXPECT_FALSE(driver->MemRetainAllocationHandle(base).ok());  // nothing mapped there
  ASSERT_OK(driver->MemUnmap(base + gran, gran));
  ASSERT_OK(driver->MemRelease(retained));
  ASSERT_OK(driver->AddressFree(base, 2 * gran));
  if (SimDriver* sim = AsSim(driver.get())) {
    EXPECT_EQ(retained, h);
    ExpectAllZero(sim->Counters());
  }
}

TEST(DriverTest, PlainAllocationHasAnIpcHandle) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  const std::size_t gran = driver->Info().granularity;
  ASSERT_OK_AND_ASSIGN(const DevicePtr plain, driver->MemAlloc(gran));
  ASSERT_OK_AND_ASSIGN(const Driver::IpcMemHandle handle, driver->IpcGetMemHandle(plain));
  if (handle.fd >= 0) {
    ASSERT_EQ(close(handle.fd), 0);
  }
  EXPECT_FALSE(driver->IpcCloseMemHandle(plain).ok());  // not opened through a handle
  ASSERT_OK(driver->MemFree(plain));
}

}  // namespace
}  // namespace graphalloc

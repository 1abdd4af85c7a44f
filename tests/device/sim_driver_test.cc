// Behaviours only the simulated device has or can show: options, manual completion, cross-stream waits,
// deferred release, fault injection determinism, capture refusals by mode, capture joins, resource
// counters and scale (tens of thousands of handles on one memfd).
#include "graphalloc/allocator/device/sim_driver.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "graphalloc/allocator/device/driver_error.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Optional;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGran = 2 * kMiB;

std::unique_ptr<SimDriver> MakeSim(SimDriverOptions options = {}) {
  auto sim = SimDriver::Create(std::move(options));
  EXPECT_TRUE(sim.ok()) << sim.status();
  return sim.ok() ? std::move(*sim) : nullptr;
}

std::unique_ptr<SimDriver> MakeManualSim() {
  SimDriverOptions options;
  options.manual_completion = true;
  return MakeSim(options);
}

std::optional<int> Code(const absl::Status& s) { return DriverErrorCode(s); }
int Result(DriverResult r) { return static_cast<int>(r); }

int OpenFds() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir) != nullptr) ++n;
    closedir(dir);
  }
  return n;
}

TEST(SimDriverTest, CreateRejectsBadOptions) {
  SimDriverOptions odd;
  odd.granularity = 3 * 4096;
  EXPECT_TRUE(absl::IsInvalidArgument(SimDriver::Create(odd).status()));
  SimDriverOptions tiny;
  tiny.granularity = 512;
  EXPECT_TRUE(absl::IsInvalidArgument(SimDriver::Create(tiny).status()));
  SimDriverOptions empty;
  empty.capacity = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(SimDriver::Create(empty).status()));
}

TEST(SimDriverTest, InfoReportsTheOptions) {
  SimDriverOptions options;
  options.capacity = std::size_t{3} << 30;
  options.granularity = 64 * 1024;
  options.ordinal = 2;
  options.name = "test device";
  auto sim = MakeSim(options);
  const DeviceInfo& info = sim->Info();
  EXPECT_EQ(sim->Kind(), "sim");
  EXPECT_EQ(info.name, "test device");
  EXPECT_EQ(info.ordinal, 2);
  EXPECT_EQ(info.total_memory, std::size_t{3} << 30);
  EXPECT_EQ(info.granularity, 64u * 1024);
  EXPECT_EQ(info.recommended_granularity, 64u * 1024);
  EXPECT_EQ(info.compute_capability_major, 9);
  EXPECT_EQ(info.compute_capability_minor, 0);
  ASSERT_OK_AND_ASSIGN(const MemoryInfo mem, sim->GetMemoryInfo());
  EXPECT_EQ(mem.total, std::size_t{3} << 30);
  EXPECT_EQ(mem.free, std::size_t{3} << 30);
}

TEST(SimDriverTest, CapacityIsEnforcedByBytesAndFreedBytesCanBeReused) {
  SimDriverOptions options;
  options.capacity = 4 * kGran;
  auto sim = MakeSim(options);
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, sim->MemCreate(kGran));
    handles.push_back(h);
  }
  ASSERT_OK_AND_ASSIGN(const DevicePtr plain, sim->MemAlloc(1));
  EXPECT_EQ(sim->UsedBytes(), 4 * kGran);
  ASSERT_OK_AND_ASSIGN(const MemoryInfo full, sim->GetMemoryInfo());
  EXPECT_EQ(full.free, 0u);
  EXPECT_THAT(Code(sim->MemCreate(kGran).status()), Optional(Result(DriverResult::kOutOfMemory)));
  EXPECT_THAT(Code(sim->MemAlloc(1).status()), Optional(Result(DriverResult::kOutOfMemory)));
  ASSERT_OK(sim->MemRelease(handles.back()));
  handles.pop_back();
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle again, sim->MemCreate(kGran));
  handles.push_back(again);
  for (PhysicalHandle h : handles) ASSERT_OK(sim->MemRelease(h));
  ASSERT_OK(sim->MemFree(plain));
  EXPECT_EQ(sim->UsedBytes(), 0u);
}

TEST(SimDriverTest, MappingRulesMatchCuda) {
  auto sim = MakeSim();
  Driver& d = *sim;
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, d.AddressReserve(4 * kGran, 0));
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, d.MemCreate(2 * kGran));
  const int invalid = Result(DriverResult::kInvalidValue);
  EXPECT_THAT(Code(d.MemMap(base, kGran, h)), Optional(invalid));                  // size != handle size
  EXPECT_THAT(Code(d.MemMap(base + 4096, 2 * kGran, h)), Optional(invalid));       // misaligned
  EXPECT_THAT(Code(d.MemMap(base + 3 * kGran, 2 * kGran, h)), Optional(invalid));  // past the reservation
  ASSERT_OK(d.MemMap(base, 2 * kGran, h));
  EXPECT_THAT(Code(d.MemMap(base + kGran, 2 * kGran, h)), Optional(invalid));  // overlaps a mapping
  EXPECT_THAT(Code(d.MemSetAccess(base, 3 * kGran, {})), Optional(invalid));   // not all mapped
  const int peers[] = {1};
  EXPECT_THAT(Code(d.MemSetAccess(base, 2 * kGran, peers)), Optional(Result(DriverResult::kInvalidDevice)));
  ASSERT_OK(d.EnablePeerAccess(1));
  EXPECT_THAT(Code(d.EnablePeerAccess(1)), Optional(Result(DriverResult::kPeerAccessAlreadyEnabled)));
  ASSERT_OK(d.MemSetAccess(base, 2 * kGran, peers));
  EXPECT_THAT(Code(d.MemUnmap(base, kGran)), Optional(invalid));         // half a mapping
  EXPECT_THAT(Code(d.AddressFree(base, 4 * kGran)), Optional(invalid));  // still mapped
  EXPECT_THAT(Code(d.AddressFree(base, 2 * kGran)), Optional(invalid));  // not the reserved size
  ASSERT_OK(d.MemUnmap(base, 2 * kGran));
  ASSERT_OK(d.MemRelease(h));
  EXPECT_THAT(Code(d.MemRelease(h)), Optional(invalid));
  ASSERT_OK(d.AddressFree(base, 4 * kGran));
}

TEST(SimDriverTest, ReservationHonoursAlignment) {
  auto sim = MakeSim();
  Driver& d = *sim;
  const std::size_t align = std::size_t{1} << 30;
  ASSERT_OK_AND_ASSIGN(const DevicePtr ptr, d.AddressReserve(kGran, align));
  EXPECT_EQ(ptr % align, 0u);
  EXPECT_EQ(sim->Counters().reserved_bytes, kGran);
  ASSERT_OK(d.AddressFree(ptr, kGran));
  EXPECT_THAT(Code(d.AddressReserve(kGran, 3 * kGran).status()),
              Optional(Result(DriverResult::kInvalidValue)));
}

TEST(SimDriverTest, ReleaseWhileMappedKeepsTheDataUntilUnmap) {
  auto sim = MakeSim();
  Driver& d = *sim;
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, d.AddressReserve(kGran, 0));
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, d.MemCreate(kGran));
  ASSERT_OK(d.MemMap(base, kGran, h));
  ASSERT_OK(d.MemSetAccess(base, kGran, {}));
  const std::uint64_t value = 0xfeedfacecafebeefULL;
  ASSERT_OK(d.CopyHostToDevice(base + 128, &value, sizeof(value)));
  ASSERT_OK(d.MemRelease(h));
  EXPECT_EQ(sim->Counters().handles, 0u);
  EXPECT_EQ(sim->Counters().mappings, 1u);
  EXPECT_EQ(sim->UsedBytes(), kGran);
  std::uint64_t seen = 0;
  ASSERT_OK(d.CopyDeviceToHost(&seen, base + 128, sizeof(seen)));
  EXPECT_EQ(seen, value);
  ASSERT_OK(d.MemUnmap(base, kGran));
  EXPECT_EQ(sim->UsedBytes(), 0u);
  // The freed range was given back: a new handle (reusing its offset) reads zeros.
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle fresh, d.MemCreate(kGran));
  ASSERT_OK(d.MemMap(base, kGran, fresh));
  ASSERT_OK(d.MemSetAccess(base, kGran, {}));
  ASSERT_OK(d.CopyDeviceToHost(&seen, base + 128, sizeof(seen)));
  EXPECT_EQ(seen, 0u);
  ASSERT_OK(d.MemUnmap(base, kGran));
  ASSERT_OK(d.MemRelease(fresh));
  ASSERT_OK(d.AddressFree(base, kGran));
}

TEST(SimDriverTest, ManualCompletionHoldsWorkAndEventsUntilRun) {
  auto sim = MakeManualSim();
  ASSERT_OK_AND_ASSIGN(const Stream s, sim->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Event e, sim->EventCreate());
  std::vector<int> ran;
  for (int i = 0; i < 3; ++i) ASSERT_OK(sim->LaunchHostFunction(s, [&ran, i] { ran.push_back(i); }));
  ASSERT_OK(sim->EventRecord(e, s));
  EXPECT_EQ(sim->Counters().pending_work, 3u);
  ASSERT_OK_AND_ASSIGN(bool done, sim->EventQuery(e));
  EXPECT_FALSE(done);
  EXPECT_EQ(sim->RunPendingWork(s, 2), 2u);
  EXPECT_THAT(ran, ElementsAre(0, 1));
  ASSERT_OK_AND_ASSIGN(done, sim->EventQuery(e));
  EXPECT_FALSE(done);
  EXPECT_EQ(sim->RunPendingWork(s), 1u);
  EXPECT_THAT(ran, ElementsAre(0, 1, 2));
  ASSERT_OK_AND_ASSIGN(done, sim->EventQuery(e));
  EXPECT_TRUE(done);
  EXPECT_EQ(sim->Counters().pending_work, 0u);
  EXPECT_EQ(sim->RunPendingWork(s), 0u);
}

TEST(SimDriverTest, StreamWaitEventBlocksTheQueueUntilTheEventsStreamRuns) {
  auto sim = MakeManualSim();
  ASSERT_OK_AND_ASSIGN(const Stream producer, sim->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Stream consumer, sim->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Event e, sim->EventCreate());
  std::vector<std::string> ran;
  ASSERT_OK(sim->LaunchHostFunction(producer, [&ran] { ran.push_back("produce"); }));
  ASSERT_OK(sim->EventRecord(e, producer));
  ASSERT_OK(sim->StreamWaitEvent(consumer, e));
  ASSERT_OK(sim->LaunchHostFunction(consumer, [&ran] { ran.push_back("consume"); }));
  // Re-recording later does not move the wait: it waits for the record it saw.
  ASSERT_OK(sim->LaunchHostFunction(producer, [&ran] { ran.push_back("later"); }));
  ASSERT_OK(sim->EventRecord(e, producer));
  EXPECT_EQ(sim->RunPendingWork(consumer), 0u);
  EXPECT_THAT(ran, IsEmpty());
  EXPECT_EQ(sim->RunPendingWork(producer, 1), 1u);
  EXPECT_EQ(sim->RunPendingWork(consumer), 1u);
  EXPECT_THAT(ran, ElementsAre("produce", "consume"));
  EXPECT_EQ(sim->RunAllPendingWork(), 1u);
  EXPECT_THAT(ran, ElementsAre("produce", "consume", "later"));
}

TEST(SimDriverTest, SynchronizingRunsOnlyWhatItWaitsFor) {
  auto sim = MakeManualSim();
  ASSERT_OK_AND_ASSIGN(const Stream producer, sim->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Stream consumer, sim->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Event e, sim->EventCreate());
  ASSERT_OK_AND_ASSIGN(const Event tail, sim->EventCreate());
  std::vector<int> ran;
  ASSERT_OK(sim->LaunchHostFunction(producer, [&ran] { ran.push_back(1); }));
  ASSERT_OK(sim->EventRecord(e, producer));
  ASSERT_OK(sim->LaunchHostFunction(producer, [&ran] { ran.push_back(9); }));
  ASSERT_OK(sim->StreamWaitEvent(consumer, e));
  ASSERT_OK(sim->LaunchHostFunction(consumer, [&ran] { ran.push_back(2); }));
  ASSERT_OK(sim->EventRecord(tail, consumer));
  ASSERT_OK(sim->LaunchHostFunction(consumer, [&ran] { ran.push_back(3); }));
  ASSERT_OK(sim->EventSynchronize(tail));
  EXPECT_THAT(ran, ElementsAre(1, 2));
  ASSERT_OK(sim->StreamSynchronize(consumer));
  EXPECT_THAT(ran, ElementsAre(1, 2, 3));
  EXPECT_EQ(sim->Counters().pending_work, 1u);
  ASSERT_OK(sim->DeviceSynchronize());
  EXPECT_THAT(ran, ElementsAre(1, 2, 3, 9));
}

TEST(SimDriverTest, LeavingManualModeRunsWhatWasHeldBack) {
  auto sim = MakeManualSim();
  ASSERT_OK_AND_ASSIGN(const Stream s, sim->StreamCreate());
  int runs = 0;
  ASSERT_OK(sim->LaunchHostFunction(s, [&runs] { ++runs; }));
  EXPECT_EQ(runs, 0);
  sim->SetManualCompletion(false);
  EXPECT_EQ(runs, 1);
  ASSERT_OK(sim->LaunchHostFunction(s, [&runs] { ++runs; }));
  EXPECT_EQ(runs, 2);
}

TEST(SimDriverTest, DestroyedStreamStillRunsItsQueuedWork) {
  auto sim = MakeManualSim();
  ASSERT_OK_AND_ASSIGN(const Stream s, sim->StreamCreate());
  int runs = 0;
  ASSERT_OK(sim->LaunchHostFunction(s, [&runs] { ++runs; }));
  ASSERT_OK(sim->StreamDestroy(s));
  EXPECT_EQ(sim->Counters().streams, 0u);
  EXPECT_THAT(Code(sim->LaunchHostFunction(s, [] {})), Optional(Result(DriverResult::kInvalidHandle)));
  EXPECT_EQ(sim->RunAllPendingWork(), 1u);
  EXPECT_EQ(runs, 1);
}

TEST(SimDriverTest, ClosureMayNotSynchronize) {
  auto sim = MakeSim();
  ASSERT_OK_AND_ASSIGN(const Stream s, sim->StreamCreate());
  absl::Status inside;
  ASSERT_OK(sim->LaunchHostFunction(s, [&] { inside = sim->StreamSynchronize(s); }));
  EXPECT_THAT(Code(inside), Optional(Result(DriverResult::kNotPermitted)));
}

TEST(SimDriverTest, UnknownHandlesAreInvalidHandle) {
  auto sim = MakeSim();
  const int invalid = Result(DriverResult::kInvalidHandle);
  EXPECT_THAT(Code(sim->StreamSynchronize(Stream{12345})), Optional(invalid));
  EXPECT_THAT(Code(sim->StreamDestroy(kDefaultStream)), Optional(invalid));
  EXPECT_THAT(Code(sim->EventQuery(Event{12345}).status()), Optional(invalid));
  EXPECT_THAT(Code(sim->GraphInstantiate(Graph{12345}).status()), Optional(invalid));
  EXPECT_THAT(Code(sim->GraphLaunch(GraphExec{12345}, kDefaultStream)), Optional(invalid));
  EXPECT_THAT(Code(sim->GraphDestroy(Graph{12345})), Optional(invalid));
}

// Which calls of 200 MemCreates fail under random faults.
std::vector<bool> FailurePattern(std::uint64_t seed) {
  auto sim = MakeSim();
  const SimCall calls[] = {SimCall::kMemCreate};
  sim->SetRandomFaults(0.25, seed, calls);
  std::vector<bool> failed;
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<PhysicalHandle> h = sim->MemCreate(kGran);
    failed.push_back(!h.ok());
    if (h.ok()) {
      EXPECT_TRUE(sim->MemRelease(*h).ok());
    } else {
      EXPECT_THAT(Code(h.status()), Optional(Result(DriverResult::kOutOfMemory)));
    }
  }
  EXPECT_EQ(sim->InjectedFaultCount(),
            static_cast<std::uint64_t>(std::count(failed.begin(), failed.end(), true)));
  EXPECT_EQ(sim->Counters().handles, 0u);
  return failed;
}

TEST(SimDriverTest, RandomFaultsAreDeterministicForASeed) {
  const std::vector<bool> a = FailurePattern(42);
  const std::vector<bool> b = FailurePattern(42);
  const std::vector<bool> c = FailurePattern(43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  const auto failures = std::count(a.begin(), a.end(), true);
  EXPECT_GT(failures, 25);  // about 50 expected at rate 0.25
  EXPECT_LT(failures, 80);
}

TEST(SimDriverTest, ClearFaultsStopsInjection) {
  auto sim = MakeSim();
  sim->InjectFault(SimCall::kStreamCreate, 1, DriverResult::kUnknown);
  sim->ClearFaults();
  ASSERT_OK_AND_ASSIGN(const Stream s, sim->StreamCreate());
  ASSERT_OK(sim->StreamDestroy(s));
  EXPECT_EQ(sim->InjectedFaultCount(), 0u);
  EXPECT_EQ(sim->CallCount(SimCall::kStreamCreate), 1u);
}

TEST(SimDriverTest, CaptureIdsStartAtOneAndIncrease) {
  auto sim = MakeSim();
  ASSERT_OK_AND_ASSIGN(const Stream s, sim->StreamCreate());
  for (std::uint64_t expected = 1; expected <= 2; ++expected) {
    ASSERT_OK(sim->BeginCapture(s, CaptureMode::kGlobal));
    ASSERT_OK_AND_ASSIGN(const CaptureInfo info, sim->GetCaptureInfo(s));
    EXPECT_EQ(info.id, expected);
    EXPECT_THAT(Code(sim->BeginCapture(s, CaptureMode::kGlobal)),
                Optional(Result(DriverResult::kStreamCaptureUnsupported)));
    ASSERT_OK_AND_ASSIGN(const Graph g, sim->EndCapture(s));
    ASSERT_OK(sim->GraphDestroy(g));
  }
  EXPECT_THAT(Code(sim->BeginCapture(kDefaultStream, CaptureMode::kGlobal)),
              Optional(Result(DriverResult::kStreamCaptureUnsupported)));
}

// Begins a capture on a new stream; returns it.
absl::StatusOr<Stream> Capturing(SimDriver& sim, CaptureMode mode) {
  absl::StatusOr<Stream> s = sim.StreamCreate();
  if (!s.ok()) return s;
  if (absl::Status st = sim.BeginCapture(*s, mode); !st.ok()) return st;
  return s;
}

CaptureStatus StatusOf(SimDriver& sim, Stream s) {
  absl::StatusOr<CaptureInfo> info = sim.GetCaptureInfo(s);
  return info.ok() ? info->status : CaptureStatus::kNone;
}

TEST(SimDriverTest, GlobalCaptureRefusesPlainAllocationFromAnyThread) {
  auto sim = MakeSim();
  ASSERT_OK_AND_ASSIGN(const Stream s, Capturing(*sim, CaptureMode::kGlobal));
  absl::StatusOr<DevicePtr> from_other = absl::UnknownError("not run");
  std::thread([&] { from_other = sim->MemAlloc(kGran); }).join();
  EXPECT_THAT(Code(from_other.status()), Optional(Result(DriverResult::kStreamCaptureUnsupported)));
  EXPECT_EQ(StatusOf(*sim, s), CaptureStatus::kInvalidated);
  EXPECT_EQ(sim->Counters().allocations, 0u);
  // Enqueues on an invalidated capture fail too, until it is ended.
  EXPECT_THAT(Code(sim->LaunchHostFunction(s, [] {})),
              Optional(Result(DriverResult::kStreamCaptureInvalidated)));
  EXPECT_THAT(Code(sim->EndCapture(s).status()), Optional(Result(DriverResult::kStreamCaptureInvalidated)));
  EXPECT_EQ(StatusOf(*sim, s), CaptureStatus::kNone);
  EXPECT_EQ(sim->Counters().graphs, 0u);
}

TEST(SimDriverTest, ThreadLocalCaptureRefusesOnlyItsOwnThread) {
  auto sim = MakeSim();
  ASSERT_OK_AND_ASSIGN(const Stream s, Capturing(*sim, CaptureMode::kThreadLocal));
  absl::StatusOr<DevicePtr> from_other = absl::UnknownError("not run");
  std::thread([&] { from_other = sim->MemAlloc(kGran); }).join();
  ASSERT_OK(from_other.status());
  EXPECT_EQ(StatusOf(*sim, s), CaptureStatus::kActive);
  absl::Status freed = absl::UnknownError("not run");
  std::thread([&] { freed = sim->MemFree(*from_other); }).join();
  ASSERT_OK(freed);
  EXPECT_EQ(StatusOf(*sim, s), CaptureStatus::kActive);
  ASSERT_OK_AND_ASSIGN(const Graph g, sim->EndCapture(s));
  ASSERT_OK(sim->GraphDestroy(g));
}

TEST(SimDriverTest, ThreadLocalCaptureIsInvalidatedByItsOwnThreadsUnsafeCall) {
  auto sim = MakeSim();
  ASSERT_OK_AND_ASSIGN(const DevicePtr plain, sim->MemAlloc(kGran));
  ASSERT_OK_AND_ASSIGN(const Stream s, Capturing(*sim, CaptureMode::kThreadLocal));
  EXPECT_THAT(Code(sim->MemFree(plain)), Optional(Result(DriverResult::kStreamCaptureUnsupported)));
  EXPECT_EQ(sim->Counters().allocations, 1u);  // the refused free had no effect
  EXPECT_EQ(StatusOf(*sim, s), CaptureStatus::kInvalidated);
  EXPECT_FALSE(sim->EndCapture(s).ok());
  ASSERT_OK(sim->MemFree(plain));
}

TEST(SimDriverTest, RelaxedCaptureAllowsAllocationButNotSynchronizingItsStream) {
  auto sim = MakeSim();
  ASSERT_OK_AND_ASSIGN(const Event unrelated, sim->EventCreate());
  ASSERT_OK_AND_ASSIGN(const Stream s, Capturing(*sim, CaptureMode::kRelaxed));
  ASSERT_OK_AND_ASSIGN(const DevicePtr plain, sim->MemAlloc(kGran));
  ASSERT_OK(sim->MemFree(plain));
  ASSERT_OK_AND_ASSIGN(const bool done, sim->EventQuery(unrelated));
  EXPECT_TRUE(done);
  EXPECT_EQ(StatusOf(*sim, s), CaptureStatus::kActive);
  EXPECT_THAT(Code(sim->StreamSynchronize(s)), Optional(Result(DriverResult::kStreamCaptureUnsupported)));
  EXPECT_EQ(StatusOf(*sim, s), CaptureStatus::kInvalidated);
  EXPECT_FALSE(sim->EndCapture(s).ok());
}

TEST(SimDriverTest, CrossStreamJoinSharesOneCaptureAndReplaysInOrder) {
  auto sim = MakeSim();
  ASSERT_OK_AND_ASSIGN(const Stream origin, Capturing(*sim, CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(const Stream side, sim->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Event fork, sim->EventCreate());
  ASSERT_OK_AND_ASSIGN(const Event join, sim->EventCreate());
  std::vector<int> ran;
  ASSERT_OK(sim->LaunchHostFunction(origin, [&ran] { ran.push_back(0); }));
  ASSERT_OK(sim->EventRecord(fork, origin));
  ASSERT_OK(sim->StreamWaitEvent(side, fork));
  ASSERT_OK_AND_ASSIGN(const CaptureInfo origin_info, sim->GetCaptureInfo(origin));
  ASSERT_OK_AND_ASSIGN(const CaptureInfo side_info, sim->GetCaptureInfo(side));
  EXPECT_EQ(side_info.status, CaptureStatus::kActive);
  EXPECT_EQ(side_info.id, origin_info.id);
  ASSERT_OK(sim->LaunchHostFunction(side, [&ran] { ran.push_back(1); }));
  ASSERT_OK(sim->EventRecord(join, side));
  ASSERT_OK(sim->StreamWaitEvent(origin, join));
  ASSERT_OK(sim->LaunchHostFunction(origin, [&ran] { ran.push_back(2); }));
  ASSERT_OK_AND_ASSIGN(const Graph graph, sim->EndCapture(origin));
  EXPECT_EQ(StatusOf(*sim, side), CaptureStatus::kNone);
  EXPECT_THAT(ran, IsEmpty());
  ASSERT_OK_AND_ASSIGN(const GraphExec exec, sim->GraphInstantiate(graph));
  ASSERT_OK(sim->GraphLaunch(exec, side));
  EXPECT_THAT(ran, ElementsAre(0, 1, 2));
}

TEST(SimDriverTest, EndCaptureWithAnUnjoinedStreamFails) {
  auto sim = MakeSim();
  ASSERT_OK_AND_ASSIGN(const Stream origin, Capturing(*sim, CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(const Stream side, sim->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Event fork, sim->EventCreate());
  ASSERT_OK(sim->EventRecord(fork, origin));
  ASSERT_OK(sim->StreamWaitEvent(side, fork));
  ASSERT_OK(sim->LaunchHostFunction(side, [] {}));
  EXPECT_THAT(Code(sim->EndCapture(side).status()), Optional(Result(DriverResult::kStreamCaptureUnmatched)));
  EXPECT_THAT(Code(sim->EndCapture(origin).status()),
              Optional(Result(DriverResult::kStreamCaptureInvalidated)));
  EXPECT_EQ(StatusOf(*sim, side), CaptureStatus::kNone);

  ASSERT_OK(sim->BeginCapture(origin, CaptureMode::kGlobal));
  ASSERT_OK(sim->EventRecord(fork, origin));
  ASSERT_OK(sim->StreamWaitEvent(side, fork));
  ASSERT_OK(sim->LaunchHostFunction(side, [] {}));
  EXPECT_THAT(Code(sim->EndCapture(origin).status()), Optional(Result(DriverResult::kStreamCaptureUnjoined)));
  EXPECT_EQ(StatusOf(*sim, side), CaptureStatus::kNone);
  EXPECT_EQ(sim->Counters().graphs, 0u);
}

TEST(SimDriverTest, CapturingStreamMayNotWaitOnUncapturedWork) {
  auto sim = MakeSim();
  ASSERT_OK_AND_ASSIGN(const Stream other, sim->StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Event outside, sim->EventCreate());
  ASSERT_OK(sim->EventRecord(outside, other));
  ASSERT_OK_AND_ASSIGN(const Stream s, Capturing(*sim, CaptureMode::kGlobal));
  EXPECT_THAT(Code(sim->StreamWaitEvent(s, outside)),
              Optional(Result(DriverResult::kStreamCaptureIsolation)));
  EXPECT_EQ(StatusOf(*sim, s), CaptureStatus::kInvalidated);
  EXPECT_FALSE(sim->EndCapture(s).ok());
}

TEST(SimDriverTest, GraphLaunchedIntoACaptureBecomesOneChildNode) {
  auto sim = MakeSim();
  ASSERT_OK_AND_ASSIGN(const Stream s, sim->StreamCreate());
  std::vector<int> ran;
  ASSERT_OK(sim->BeginCapture(s, CaptureMode::kGlobal));
  ASSERT_OK(sim->LaunchHostFunction(s, [&ran] { ran.push_back(1); }));
  ASSERT_OK(sim->LaunchHostFunction(s, [&ran] { ran.push_back(2); }));
  ASSERT_OK_AND_ASSIGN(const Graph inner, sim->EndCapture(s));
  ASSERT_OK_AND_ASSIGN(const GraphExec inner_exec, sim->GraphInstantiate(inner));
  ASSERT_OK(sim->BeginCapture(s, CaptureMode::kGlobal));
  ASSERT_OK(sim->LaunchHostFunction(s, [&ran] { ran.push_back(0); }));
  ASSERT_OK(sim->GraphLaunch(inner_exec, s));
  ASSERT_OK_AND_ASSIGN(const Graph outer, sim->EndCapture(s));
  ASSERT_OK_AND_ASSIGN(const GraphExec outer_exec, sim->GraphInstantiate(outer));
  // Two nodes (host, child graph): a three-host-node graph is a different topology.
  ASSERT_OK_AND_ASSIGN(const GraphUpdateResult update, sim->GraphExecUpdate(outer_exec, inner));
  EXPECT_EQ(update, GraphUpdateResult::kTopologyChanged);
  ASSERT_OK(sim->GraphLaunch(outer_exec, s));
  EXPECT_THAT(ran, ElementsAre(0, 1, 2));
}

TEST(SimDriverTest, ConcurrentStreamsRunEveryClosureOnce) {
  auto sim = MakeSim();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::atomic<int> total{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      absl::StatusOr<Stream> s = sim->StreamCreate();
      absl::StatusOr<Event> e = sim->EventCreate();
      ASSERT_TRUE(s.ok() && e.ok());
      for (int i = 0; i < kPerThread; ++i) {
        EXPECT_TRUE(sim->LaunchHostFunction(*s, [&total] { total.fetch_add(1); }).ok());
      }
      EXPECT_TRUE(sim->EventRecord(*e, *s).ok());
      EXPECT_TRUE(sim->EventSynchronize(*e).ok());
      EXPECT_TRUE(sim->EventDestroy(*e).ok());
      EXPECT_TRUE(sim->StreamDestroy(*s).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(total.load(), kThreads * kPerThread);
  EXPECT_EQ(sim->Counters().streams, 0u);
  EXPECT_EQ(sim->Counters().pending_work, 0u);
}

TEST(SimDriverTest, TwentyThousandHandlesNeedNoFileDescriptors) {
  const int fds_before = OpenFds();
  SimDriverOptions options;
  options.capacity = std::size_t{64} << 30;
  auto sim = MakeSim(options);
  std::vector<PhysicalHandle> handles;
  handles.reserve(20000);
  for (int i = 0; i < 20000; ++i) {
    ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, sim->MemCreate(kGran));
    handles.push_back(h);
  }
  EXPECT_EQ(sim->Counters().handles, 20000u);
  EXPECT_EQ(sim->UsedBytes(), 20000 * kGran);
  EXPECT_EQ(OpenFds(), fds_before + 1);  // the device's one memfd
  for (PhysicalHandle h : handles) ASSERT_OK(sim->MemRelease(h));
  EXPECT_EQ(sim->UsedBytes(), 0u);
  sim.reset();
  EXPECT_EQ(OpenFds(), fds_before);
}

TEST(SimDriverTest, DestructorReleasesWhatTheUserLeaked) {
  const int fds_before = OpenFds();
  auto sim = MakeManualSim();
  Driver& d = *sim;
  ASSERT_OK_AND_ASSIGN(const DevicePtr base, d.AddressReserve(2 * kGran, 0));
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, d.MemCreate(kGran));
  ASSERT_OK(d.MemMap(base, kGran, h));
  ASSERT_OK_AND_ASSIGN(const DevicePtr plain, d.MemAlloc(kGran));
  ASSERT_OK_AND_ASSIGN(const Stream s, d.StreamCreate());
  ASSERT_OK_AND_ASSIGN(const Event e, d.EventCreate());
  auto witness = std::make_shared<int>(0);
  ASSERT_OK(d.LaunchHostFunction(s, [witness] { ++*witness; }));
  ASSERT_OK(d.EventRecord(e, s));
  ASSERT_OK(d.BeginCapture(s, CaptureMode::kRelaxed));
  (void)plain;
  sim.reset();
  EXPECT_EQ(*witness, 0);  // queued work is dropped, not run
  EXPECT_EQ(witness.use_count(), 1);
  EXPECT_EQ(OpenFds(), fds_before);
}

// Two simulated devices stand for two processes: what one exports the other opens.
TEST(SimDriverTest, PlainAllocationOpenedThroughAnIpcHandleSharesItsBytesBothWays) {
  auto exporter = MakeSim();
  auto importer = MakeSim();
  ASSERT_NE(exporter, nullptr);
  ASSERT_NE(importer, nullptr);
  ASSERT_OK_AND_ASSIGN(const DevicePtr plain, exporter->MemAlloc(kGran));
  const std::uint32_t word = 0xC0FFEE11;
  ASSERT_OK(exporter->CopyHostToDevice(plain + 64, &word, sizeof(word)));
  ASSERT_OK_AND_ASSIGN(Driver::IpcMemHandle handle, exporter->IpcGetMemHandle(plain));
  ASSERT_GE(handle.fd, 0);
  ASSERT_OK_AND_ASSIGN(const DevicePtr opened, importer->IpcOpenMemHandle(handle));
  ASSERT_EQ(close(handle.fd), 0);
  EXPECT_EQ(importer->Counters().ipc_mappings, 1u);
  EXPECT_EQ(importer->UsedBytes(), 0u);  // the exporter's memory, not the importer's
  std::uint32_t seen = 0;
  ASSERT_OK(importer->CopyDeviceToHost(&seen, opened + 64, sizeof(seen)));
  EXPECT_EQ(seen, 0xC0FFEE11u);
  const std::uint32_t reply = 0x5EED;
  ASSERT_OK(importer->CopyHostToDevice(opened + 128, &reply, sizeof(reply)));
  ASSERT_OK(exporter->CopyDeviceToHost(&seen, plain + 128, sizeof(seen)));
  EXPECT_EQ(seen, 0x5EEDu);
  ASSERT_OK(importer->IpcCloseMemHandle(opened));
  EXPECT_EQ(importer->Counters().ipc_mappings, 0u);
  EXPECT_THAT(DriverErrorCode(importer->IpcCloseMemHandle(opened)),
              Optional(static_cast<int>(DriverResult::kInvalidValue)));
  ASSERT_OK(exporter->MemFree(plain));
}

TEST(SimDriverTest, IpcHandleOfAnInteriorPointerOrGarbageIsInvalidValue) {
  auto sim = MakeSim();
  ASSERT_NE(sim, nullptr);
  ASSERT_OK_AND_ASSIGN(const DevicePtr plain, sim->MemAlloc(kGran));
  EXPECT_THAT(DriverErrorCode(sim->IpcGetMemHandle(plain + 512).status()),
              Optional(static_cast<int>(DriverResult::kInvalidValue)));
  Driver::IpcMemHandle garbage;
  garbage.fd = -1;
  EXPECT_THAT(DriverErrorCode(sim->IpcOpenMemHandle(garbage).status()),
              Optional(static_cast<int>(DriverResult::kInvalidValue)));
  ASSERT_OK(sim->MemFree(plain));
}

TEST(SimDriverTest, ExportOfAPlainHandleIsInvalidValueAndImportIsChargedToTheExporterOnly) {
  auto exporter = MakeSim();
  auto importer = MakeSim();
  ASSERT_NE(exporter, nullptr);
  ASSERT_NE(importer, nullptr);
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle plain, exporter->MemCreate(kGran));
  EXPECT_THAT(DriverErrorCode(exporter->MemExportToShareableHandle(plain).status()),
              Optional(static_cast<int>(DriverResult::kInvalidValue)));
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, exporter->MemCreateShareable(2 * kGran));
  EXPECT_EQ(exporter->UsedBytes(), 3 * kGran);
  ASSERT_OK_AND_ASSIGN(const Driver::ShareableHandle shared, exporter->MemExportToShareableHandle(h));
  EXPECT_EQ(shared.size, 2 * kGran);
  EXPECT_EQ(shared.offset, 0u);
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle imported, importer->MemImportFromShareableHandle(shared));
  ASSERT_EQ(close(shared.fd), 0);
  EXPECT_EQ(importer->UsedBytes(), 0u);
  EXPECT_EQ(importer->Counters().handles, 1u);
  EXPECT_EQ(importer->Counters().handle_bytes, 2 * kGran);
  // A size beyond the file is refused.
  ASSERT_OK_AND_ASSIGN(Driver::ShareableHandle again, exporter->MemExportToShareableHandle(h));
  again.size = 4 * kGran;
  EXPECT_THAT(DriverErrorCode(importer->MemImportFromShareableHandle(again).status()),
              Optional(static_cast<int>(DriverResult::kInvalidValue)));
  ASSERT_EQ(close(again.fd), 0);
  ASSERT_OK(exporter->MemRelease(h));
  ASSERT_OK(exporter->MemRelease(plain));
  EXPECT_EQ(exporter->UsedBytes(), 0u);
  ASSERT_OK(importer->MemRelease(imported));
  EXPECT_EQ(importer->Counters().handles, 0u);
}

TEST(SimDriverTest, InjectedFaultsFailTheSharingCalls) {
  auto sim = MakeSim();
  ASSERT_NE(sim, nullptr);
  ASSERT_OK_AND_ASSIGN(const PhysicalHandle h, sim->MemCreateShareable(kGran));
  sim->InjectFault(SimCall::kMemExport, 1, DriverResult::kOutOfMemory);
  EXPECT_THAT(DriverErrorCode(sim->MemExportToShareableHandle(h).status()),
              Optional(static_cast<int>(DriverResult::kOutOfMemory)));
  ASSERT_OK_AND_ASSIGN(const Driver::ShareableHandle shared, sim->MemExportToShareableHandle(h));
  sim->InjectFault(SimCall::kMemImport, 1, DriverResult::kOutOfMemory);
  EXPECT_FALSE(sim->MemImportFromShareableHandle(shared).ok());
  ASSERT_EQ(close(shared.fd), 0);
  ASSERT_OK_AND_ASSIGN(const DevicePtr plain, sim->MemAlloc(kGran));
  sim->InjectFault(SimCall::kIpcGetMemHandle, 1, DriverResult::kInvalidValue);
  EXPECT_FALSE(sim->IpcGetMemHandle(plain).ok());
  EXPECT_EQ(sim->InjectedFaultCount(), 3u);
  EXPECT_EQ(sim->Counters().handles, 1u);
  ASSERT_OK(sim->MemFree(plain));
  ASSERT_OK(sim->MemRelease(h));
}

}  // namespace
}  // namespace graphalloc

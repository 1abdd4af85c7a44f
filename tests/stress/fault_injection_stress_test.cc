// Fault-injection stress: random allocator operations on the simulated device, with regular segments
// (one cuMemAlloc each) and with expandable segments (reserve, create, map, set access, unmap, release),
// while the device fails a random share of its calls with the errors a GPU gives. Faults come two ways:
// planned (SimDriver::InjectFault: one of the next three calls of a kind fails) and random
// (SimDriver::SetRandomFaults: every call of one kind fails with some probability during the operation).
// After every operation:
//   - the call succeeded, or it returned an error and left what a caller can observe as it was before the
//     call (strong guarantee): the allocation statistics, the set of live blocks (every block the test
//     holds is still known to the allocator, nothing else is), and for a failed Free every current
//     statistic; reserved memory never grows on a failure, except by a chunk whose rollback unmap the
//     device refused (it stays mapped and counted);
//   - CheckInvariants() holds;
//   - every byte is accounted for: the allocator's reserved bytes are exactly what the device has mapped
//     or allocated for it, and regular segments hold no VMM resource;
//   - where memory is mapped, and with which access, agrees with the allocator's snapshot (read back from
//     /proc/self/maps) after any operation that failed or made a device call that maps or unmaps; a new
//     block lies in accessible memory;
//   - the contents of live blocks are intact (each holds a pattern derived from its id): all of them after
//     any operation that failed or made a device call that unmaps or frees memory, and every 64
//     operations; other operations cannot take memory away, and a new block overlapping a live one is
//     caught when it is handed out.
// At the end, with faults off, everything is freed and the cache emptied: before the allocator is
// destroyed (its destructor would hide a leak) the device holds no reservation, handle, mapping or
// allocation, and once it is gone no event, stream or queued work either.
//
// The seed is printed; GRAPHALLOC_TEST_SEED=<seed> replays a run, GRAPHALLOC_STRESS_SCALE=<x> scales its
// length (scripts/test.sh shortens it under the sanitizers). Operation counts and injected faults per call
// kind are printed per run.
//
// Extension point, private pools, checkpoint/restore and captures (allocator/private_pool.h): add their
// operations to Op / kOpNames and a branch in RunOperation() (allocate into a pool, begin/end a capture
// into it, checkpoint, restore, release the pool), keep blocks allocated in a pool in `live_` like the
// others (the same contents and strong-guarantee checks then cover them), and set Scenario::captures in a
// scenario: the capture call kinds below (BeginCapture, EndCapture) are then planned and counted too.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "allocator/device/sim_driver.h"
#include "allocator/snapshot/memory_snapshot.h"
#include "gtest/gtest.h"
#include "tests/stress/sim_mappings.h"
#include "tests/stress/stress_util.h"
#include "tests/testing/device_memory.h"

namespace graphalloc {
namespace {

using testing::Accessible;
using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;
using testing::CheckPattern;
using testing::FillPattern;
using testing::Range;
using testing::SimDeviceMappings;

// The calls that fail, and how: creating memory or address space runs out of memory; releasing,
// unmapping and events fail as a sick device does; capture calls fail as CUDA refuses a capture.
struct FaultKind {
  SimCall call;
  const char* name;
  std::array<DriverResult, 2> results;
  bool capture = false;  // planned only in scenarios that capture (see the extension point above)
};
constexpr FaultKind kFaultKinds[] = {
    {SimCall::kAddressReserve, "AddressReserve", {DriverResult::kOutOfMemory, DriverResult::kOutOfMemory}},
    {SimCall::kAddressFree, "AddressFree", {DriverResult::kUnknown, DriverResult::kInvalidValue}},
    {SimCall::kMemCreate, "MemCreate", {DriverResult::kOutOfMemory, DriverResult::kOutOfMemory}},
    {SimCall::kMemRelease, "MemRelease", {DriverResult::kUnknown, DriverResult::kInvalidHandle}},
    {SimCall::kMemMap, "MemMap", {DriverResult::kOutOfMemory, DriverResult::kUnknown}},
    {SimCall::kMemSetAccess, "MemSetAccess", {DriverResult::kOutOfMemory, DriverResult::kUnknown}},
    {SimCall::kMemUnmap, "MemUnmap", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kMemAlloc, "MemAlloc", {DriverResult::kOutOfMemory, DriverResult::kOutOfMemory}},
    {SimCall::kMemFree, "MemFree", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kEventCreate, "EventCreate", {DriverResult::kUnknown, DriverResult::kOutOfMemory}},
    {SimCall::kEventRecord, "EventRecord", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kEventQuery, "EventQuery", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kEventSynchronize, "EventSynchronize", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kBeginCapture,
     "BeginCapture",
     {DriverResult::kStreamCaptureUnsupported, DriverResult::kStreamCaptureImplicit},
     true},
    {SimCall::kEndCapture,
     "EndCapture",
     {DriverResult::kStreamCaptureInvalidated, DriverResult::kStreamCaptureUnjoined},
     true},
};
constexpr int kNumFaultKinds = static_cast<int>(std::size(kFaultKinds));
constexpr int KindOf(SimCall call) {
  for (int k = 0; k < kNumFaultKinds; ++k) {
    if (kFaultKinds[k].call == call) return k;
  }
  return -1;
}
static_assert(KindOf(SimCall::kMemUnmap) >= 0);
// Device calls after which the mapped ranges are checked: they map, grant access to, unmap or free memory.
constexpr SimCall kMappingCalls[] = {SimCall::kMemMap,  SimCall::kMemSetAccess, SimCall::kMemUnmap,
                                     SimCall::kMemFree, SimCall::kMemAlloc,     SimCall::kAddressFree};
// Device calls after which every live block's contents are checked: only they can take memory away (a
// new mapping or allocation cannot touch a live block's memory, and a new block that overlaps one is
// caught when it is handed out).
constexpr SimCall kUnmappingCalls[] = {SimCall::kMemUnmap, SimCall::kMemFree, SimCall::kMemRelease,
                                       SimCall::kAddressFree};

enum Op { kAllocate, kFree, kRecordStream, kEmptyCache, kBadFree, kCount };
constexpr const char* kOpNames[] = {"Allocate", "Free", "RecordStream", "EmptyCache", "BadFree"};

struct Scenario {
  const char* name;
  std::string config;  // GRAPHALLOC_CONF syntax, without expandable_segments (the test sets it)
  double memory_fraction = 1.0;
  double fault_rate = 0.0;  // per operation: chance of a planned fault per call kind, and of random faults
  std::uint64_t default_seed = 1;
  int operations = 0;
  bool captures = false;  // the scenario begins and ends captures (none yet: see the extension point)
};
void PrintTo(const Scenario& s, std::ostream* os) { *os << s.name; }

struct Live {
  std::size_t size = 0;
  Stream stream = kDefaultStream;
  std::uint64_t id = 0;
};

// One run: the allocator over a fresh simulated device, `operations` random operations, then teardown.
class FaultInjectionStress {
 public:
  FaultInjectionStress(const Scenario& scenario, bool expandable)
      : scenario_(scenario),
        expandable_(expandable),
        seed_(testing::StressSeed(scenario.default_seed)),
        operations_(testing::StressOps(scenario.operations)),
        rng_(seed_) {}

  void Run() {
    std::cout << "FaultInjectionStressTest " << scenario_.name
              << (expandable_ ? " expandable segments" : " regular segments") << " seed=" << seed_
              << " (GRAPHALLOC_TEST_SEED=" << seed_ << " replays) operations=" << operations_
              << " fault_rate=" << scenario_.fault_rate << "\n";
    SimDriverOptions sim_options;
    sim_options.capacity = std::size_t{512} << 20;
    sim_options.manual_completion = true;  // events stay pending until the test lets the streams run
    absl::StatusOr<std::unique_ptr<SimDriver>> created_driver = SimDriver::Create(sim_options);
    ASSERT_TRUE(created_driver.ok()) << created_driver.status();
    sim_ = std::move(*created_driver);
    const std::string conf = absl::StrCat(scenario_.config, scenario_.config.empty() ? "" : ",",
                                          "expandable_segments:", expandable_ ? "True" : "False");
    absl::StatusOr<Config> config = Config::Parse(conf);
    ASSERT_TRUE(config.ok()) << config.status();
    {
      absl::StatusOr<std::unique_ptr<CachingAllocator>> created = CachingAllocator::Create(sim_, *config);
      ASSERT_TRUE(created.ok()) << created.status();
      allocator_ = std::move(*created);
      if (scenario_.memory_fraction < 1.0) {
        ASSERT_TRUE(allocator_->SetMemoryFraction(scenario_.memory_fraction).ok());
      }
      streams_ = {kDefaultStream};
      for (int i = 0; i < 2; ++i) {
        absl::StatusOr<Stream> s = sim_->StreamCreate();
        ASSERT_TRUE(s.ok()) << s.status();
        streams_.push_back(*s);
      }
      for (int op = 0; op < operations_; ++op) {
        RunOperation(op);
        if (::testing::Test::HasFatalFailure()) return;
        if (rng_() % 16 == 0) sim_->RunAllPendingWork();  // the device makes progress now and then
      }
      Teardown();
      if (::testing::Test::HasFatalFailure()) return;
      PrintCounts();
      for (std::size_t i = 1; i < streams_.size(); ++i) ASSERT_TRUE(sim_->StreamDestroy(streams_[i]).ok());
      allocator_.reset();
    }
    // Once the allocator is gone: no event or stream either.
    EXPECT_TRUE(testing::DeviceHoldsNothing(*sim_, /*all=*/true));
  }

 private:
  // Plans this operation's faults: per kind, maybe one of its next three calls fails; and maybe every
  // call of one kind fails with probability 1/4. Returns the kind with random faults, or -1.
  int PlanFaults(std::array<std::uint64_t, kNumFaultKinds>& planned_at) {
    std::bernoulli_distribution fault(scenario_.fault_rate);
    std::array<bool, kNumFaultKinds> planned{};
    for (int k = 0; k < kNumFaultKinds; ++k) {
      if (Plannable(k) && fault(rng_)) planned[k] = true;
    }
    for (int k = 0; k < kNumFaultKinds; ++k) {
      if (!planned[k]) continue;
      const int nth = 1 + static_cast<int>(rng_() % 3);
      const DriverResult result = kFaultKinds[k].results[rng_() % 2];
      planned_at[k] = sim_->CallCount(kFaultKinds[k].call) + static_cast<std::uint64_t>(nth);
      sim_->InjectFault(kFaultKinds[k].call, nth, result);
    }
    if (!fault(rng_)) return -1;
    const int k = static_cast<int>(rng_() % kNumFaultKinds);
    if (!Plannable(k)) return -1;
    const SimCall calls[] = {kFaultKinds[k].call};
    sim_->SetRandomFaults(0.25, rng_(), calls, kFaultKinds[k].results[rng_() % 2]);
    return k;
  }

  // Whether faults of kind `k` are planned in this scenario.
  bool Plannable(int k) const { return !kFaultKinds[k].capture || scenario_.captures; }

  std::uint64_t CallsOf(std::span<const SimCall> calls) const {
    std::uint64_t n = 0;
    for (SimCall c : calls) n += sim_->CallCount(c);
    return n;
  }

  // Every block the test holds is known to the allocator (with its contents intact when `contents`); the
  // allocator holds no other allocation.
  AssertionResult CheckLive(bool contents) {
    const std::int64_t count = allocator_->GetStats().allocation.all().current;
    if (count != static_cast<std::int64_t>(live_.size())) {
      return AssertionFailure() << "the allocator counts " << count << " allocations, the test holds "
                                << live_.size();
    }
    for (const auto& [ptr, l] : live_) {
      // RecordStream on the block's own stream changes nothing; it fails for an unknown pointer.
      if (absl::Status s = allocator_->RecordStream(ptr, l.stream); !s.ok()) {
        return AssertionFailure() << "live block " << l.id << " lost: " << s;
      }
      if (contents) {
        if (absl::Status s = CheckPattern(*sim_, ptr, l.size, l.id); !s.ok()) {
          return AssertionFailure() << "block " << l.id << " corrupted: " << s;
        }
      }
    }
    return AssertionSuccess();
  }

  // The allocator's reserved bytes are exactly the device memory mapped or allocated for it.
  AssertionResult CheckDeviceAccounting() {
    const SimCounters c = sim_->Counters();
    const auto reserved = static_cast<std::size_t>(allocator_->GetStats().reserved_bytes.all().current);
    if (reserved != c.mapped_bytes + c.allocated_bytes) {
      return AssertionFailure() << "the allocator reserves " << reserved << " bytes; the device has "
                                << c.mapped_bytes << " mapped and " << c.allocated_bytes << " allocated";
    }
    if (c.handle_bytes < c.mapped_bytes) {
      return AssertionFailure() << c.mapped_bytes << " bytes mapped from handles of " << c.handle_bytes;
    }
    if (sim_->UsedBytes() != c.handle_bytes + c.allocated_bytes) {
      return AssertionFailure() << "device uses " << sim_->UsedBytes() << " bytes; handles " << c.handle_bytes
                                << ", allocations " << c.allocated_bytes;
    }
    if (!expandable_ && (c.reservations != 0 || c.handles != 0 || c.mappings != 0)) {
      return AssertionFailure() << "regular segments hold VMM resources: " << c.reservations
                                << " reservations, " << c.handles << " handles, " << c.mappings
                                << " mappings";
    }
    return AssertionSuccess();
  }

  // Where memory is mapped agrees with the allocator's view of it: inside each expandable segment the
  // device has mapped exactly the ranges the allocator's snapshot says, with access exactly where the
  // snapshot does not say otherwise (a chunk mapped without access that the allocator does not know of, or
  // mapped where the allocator does not know, is caught here); every regular segment is accessible memory.
  AssertionResult CheckMappedRanges() {
    const MemorySnapshot snapshot = allocator_->TakeSnapshot();
    const std::vector<Range> device = SimDeviceMappings();
    std::vector<Range> expected, found;
    for (const SegmentSnapshot& seg : snapshot.segments) {
      const DevicePtr begin = seg.address, end = seg.address + seg.total_size;
      if (!seg.expandable) {
        if (!Accessible(device, begin, end - begin)) {
          return AssertionFailure() << "regular segment " << Range{begin, end, true}
                                    << " is not accessible device memory";
        }
        continue;
      }
      for (const MappedRange& m : seg.mapped)
        expected.push_back({begin + m.offset, begin + m.offset + m.size, m.accessible});
      for (const Range& r : device) {
        if (r.end > begin && r.begin < end)
          found.push_back({std::max(r.begin, begin), std::min(r.end, end), r.accessible});
      }
    }
    expected = testing::Coalesce(std::move(expected));
    found = testing::Coalesce(std::move(found));
    without_access_ = std::any_of(found.begin(), found.end(), [](const Range& r) { return !r.accessible; });
    if (expected != found) {
      AssertionResult failure = AssertionFailure() << "expandable segments: the allocator has mapped";
      for (const Range& r : expected) failure << " " << r;
      failure << "; the device has mapped";
      for (const Range& r : found) failure << " " << r;
      return failure;
    }
    return AssertionSuccess();
  }

  // Picks a live block at random.
  std::map<DevicePtr, Live>::iterator AnyLive() {
    auto it = live_.begin();
    std::advance(it, static_cast<long>(rng_() % live_.size()));
    return it;
  }

  void RunOperation(int op) {
    const std::string where = absl::StrCat("seed ", seed_, " op ", op);
    std::array<std::uint64_t, kNumFaultKinds> planned_at{};
    const int random_kind = PlanFaults(planned_at);
    const std::uint64_t injected_before = sim_->InjectedFaultCount();
    const std::uint64_t mapping_calls_before = CallsOf(kMappingCalls);
    const std::uint64_t unmapping_calls_before = CallsOf(kUnmappingCalls);
    const DeviceStats before = allocator_->GetStats();

    const int choice = static_cast<int>(rng_() % 100);
    Op kind;
    absl::Status status;
    DevicePtr new_ptr = 0;
    std::size_t new_size = 0;
    Stream new_stream = kDefaultStream;
    DevicePtr victim = 0;
    if (live_.empty() || (choice < 48 && live_.size() < 48)) {
      kind = kAllocate;
      std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(48.0 * 1024 * 1024));
      new_size = rng_() % 64 == 0 ? std::size_t{1} << 30  // more than the device has
                                  : static_cast<std::size_t>(std::exp(log_size(rng_)));
      new_stream = streams_[rng_() % streams_.size()];
      absl::StatusOr<DevicePtr> ptr = allocator_->Allocate(new_size, new_stream);
      status = ptr.status();
      if (ptr.ok()) new_ptr = *ptr;
    } else if (choice < 88) {
      kind = kFree;
      auto it = AnyLive();
      victim = it->first;
      ASSERT_TRUE(CheckPattern(*sim_, victim, it->second.size, it->second.id).ok()) << where;
      status = allocator_->Free(victim);
    } else if (choice < 95) {
      kind = kRecordStream;
      status = allocator_->RecordStream(AnyLive()->first, streams_[rng_() % streams_.size()]);
    } else if (choice < 98) {
      kind = kEmptyCache;
      status = allocator_->EmptyCache();
    } else {
      // Bad input under faults: an interior pointer, or a pointer never handed out.
      kind = kBadFree;
      DevicePtr bogus = rng_() % 2 ? live_.begin()->first + 256 : DevicePtr{0x1000} + rng_() % 4096;
      while (live_.count(bogus) != 0) bogus += 1;  // never a block the test holds
      status = allocator_->Free(bogus);
      ASSERT_TRUE(absl::IsInvalidArgument(status)) << where << ": bad free gave " << status;
      status = absl::OkStatus();
    }
    sim_->ClearFaults();

    // Which faults fired: planned ones by call number, random ones by what is left of the count.
    std::array<bool, kNumFaultKinds> fired{};
    std::uint64_t planned_fired = 0;
    for (int k = 0; k < kNumFaultKinds; ++k) {
      if (planned_at[k] != 0 && sim_->CallCount(kFaultKinds[k].call) >= planned_at[k]) {
        fired[k] = true;
        ++planned_[k];
        ++planned_fired;
      }
    }
    const std::uint64_t random_fired = sim_->InjectedFaultCount() - injected_before - planned_fired;
    if (random_kind >= 0) {
      random_[random_kind] += random_fired;
      fired[random_kind] = fired[random_kind] || random_fired > 0;
    } else {
      ASSERT_EQ(random_fired, 0u) << where;
    }
    const bool unmap_refused = fired[KindOf(SimCall::kMemUnmap)];
    ++attempts_[kind];

    const DeviceStats after = allocator_->GetStats();
    if (kind == kBadFree) {
      // Refused bad input changes nothing at all.
      ASSERT_EQ(before, after) << where;
    } else if (status.ok()) {
      if (kind == kAllocate) {
        ASSERT_NE(new_ptr, 0u) << where;
        ASSERT_EQ(new_ptr % 512, 0u) << where;
        auto next = live_.lower_bound(new_ptr);
        ASSERT_TRUE(next == live_.end() || next->first >= new_ptr + new_size)
            << where << ": overlaps the next";
        ASSERT_TRUE(next == live_.begin() || std::prev(next)->first + std::prev(next)->second.size <= new_ptr)
            << where << ": overlaps the previous block";
        if (expandable_ && (without_access_ || CallsOf(kMappingCalls) != mapping_calls_before)) {
          // Memory mapped without access may exist (or have appeared): the block must not lie there.
          // Checked before it is touched, which would crash the test.
          ASSERT_TRUE(Accessible(SimDeviceMappings(), new_ptr, new_size))
              << where << ": the new block " << Range{new_ptr, new_ptr + new_size, true}
              << " is not accessible device memory";
        }
        const std::uint64_t id = next_id_++;
        ASSERT_TRUE(FillPattern(*sim_, new_ptr, new_size, id).ok()) << where;
        live_.emplace(new_ptr, Live{new_size, new_stream, id});
        ASSERT_EQ(after.allocation.all().current, before.allocation.all().current + 1) << where;
      } else if (kind == kFree) {
        live_.erase(victim);
        ASSERT_EQ(after.allocation.all().current, before.allocation.all().current - 1) << where;
        // The freed pointer is no longer known.
        ASSERT_TRUE(absl::IsInvalidArgument(allocator_->RecordStream(victim, kDefaultStream))) << where;
      }
    } else {
      ++failures_[kind];
      ASSERT_FALSE(status.message().empty()) << where;
      ASSERT_TRUE(absl::IsResourceExhausted(status) || absl::IsInternal(status) ||
                  absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status))
          << where << ": " << kOpNames[kind] << " failed with an unexpected code: " << status;
      if (kind == kAllocate && new_size < (std::size_t{1} << 30) && absl::IsResourceExhausted(status)) {
        ASSERT_NE(status.message().find("out of memory"), absl::string_view::npos) << where << ": " << status;
      }
      // Strong guarantee: no allocation appeared or vanished, and the bytes handed out are the same.
      ASSERT_EQ(after.allocation, before.allocation) << where << ": " << status;
      ASSERT_EQ(after.allocated_bytes.all().current, before.allocated_bytes.all().current) << where;
      ASSERT_EQ(after.requested_bytes.all().current, before.requested_bytes.all().current) << where;
      // A failure may have released cached memory on the way (the out-of-memory path empties the cache
      // before it gives up), never taken more, unless the device refused to unmap a chunk mapped for it.
      if (!unmap_refused) {
        ASSERT_LE(after.reserved_bytes.all().current, before.reserved_bytes.all().current)
            << where << ": " << kOpNames[kind] << " failed (" << status << ") and reserved more";
      }
      if (kind == kFree) {
        // A refused Free changes nothing at all (it makes no allocation or release call).
        ASSERT_EQ(after.active, before.active) << where;
        ASSERT_EQ(after.reserved_bytes, before.reserved_bytes) << where;
        ASSERT_EQ(after.segment, before.segment) << where;
      }
    }
    absl::Status invariants = allocator_->CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << where << " after " << kOpNames[kind] << " (" << status
                                 << "): " << invariants;
    ASSERT_TRUE(CheckDeviceAccounting()) << where << " after " << kOpNames[kind] << " (" << status << ")";
    // Only device calls change what is mapped (see kMappingCalls, kUnmappingCalls).
    const bool failed_or_periodic = !status.ok() || op % 64 == 63;
    if (failed_or_periodic || CallsOf(kMappingCalls) != mapping_calls_before) {
      ASSERT_TRUE(CheckMappedRanges()) << where << " after " << kOpNames[kind] << " (" << status << ")";
    }
    const bool contents = failed_or_periodic || CallsOf(kUnmappingCalls) != unmapping_calls_before;
    ASSERT_TRUE(CheckLive(contents)) << where << " after " << kOpNames[kind] << " (" << status << ")";
  }

  // Faults off: everything is freed and returned, and the device holds nothing of the allocator's.
  void Teardown() {
    sim_->ClearFaults();
    ASSERT_TRUE(CheckLive(/*contents=*/true)) << "at the end";
    for (const auto& [ptr, l] : live_)
      ASSERT_TRUE(allocator_->Free(ptr).ok()) << "final free of block " << l.id;
    live_.clear();
    EXPECT_TRUE(testing::DrainAndCheckNothingLeaked(*sim_, *allocator_));
  }

  void PrintCounts() {
    std::string ops, faults, calls;
    for (int k = 0; k < kCount; ++k)
      absl::StrAppend(&ops, " ", kOpNames[k], "=", attempts_[k], "/", failures_[k]);
    std::uint64_t planned = 0, random = 0;
    for (int k = 0; k < kNumFaultKinds; ++k) {
      if (kFaultKinds[k].capture && !scenario_.captures) continue;
      planned += planned_[k];
      random += random_[k];
      absl::StrAppend(&faults, " ", kFaultKinds[k].name, "=", planned_[k] + random_[k]);
      absl::StrAppend(&calls, " ", kFaultKinds[k].name, "=", sim_->CallCount(kFaultKinds[k].call));
    }
    std::cout << "  operations (attempted/failed):" << ops << "\n  injected faults: " << planned + random
              << " (planned " << planned << ", random " << random << "; driver count "
              << sim_->InjectedFaultCount() << "):" << faults << "\n  device calls:" << calls << "\n";
    EXPECT_EQ(planned + random, sim_->InjectedFaultCount());
    if (scenario_.fault_rate > 0) {
      EXPECT_GT(planned + random, 0u);
    }
  }

  const Scenario scenario_;
  const bool expandable_;
  const std::uint64_t seed_;
  const int operations_;
  std::mt19937_64 rng_;
  std::shared_ptr<SimDriver> sim_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::vector<Stream> streams_;
  std::map<DevicePtr, Live> live_;
  bool without_access_ = false;  // the device had memory mapped without access at the last look
  std::uint64_t next_id_ = 1;
  std::array<int, kCount> attempts_{}, failures_{};
  std::array<std::uint64_t, kNumFaultKinds> planned_{}, random_{};
};

class FaultInjectionStressTest : public ::testing::TestWithParam<std::tuple<Scenario, bool>> {};

TEST_P(FaultInjectionStressTest, FailedCallsKeepStateInvariantsContentsAndLeakNothing) {
  FaultInjectionStress(std::get<0>(GetParam()), std::get<1>(GetParam())).Run();
}

const Scenario kScenarios[] = {
    {.name = "DefaultConfig",
     .config = "",
     .fault_rate = 0.15,
     .default_seed = 20251121,
     .operations = 10000},
    {.name = "MaxSplitSizeAndGarbageCollectionUnderAMemoryCap",
     .config = "max_split_size_mb:20,garbage_collection_threshold:0.5",
     .memory_fraction = 0.75,
     .fault_rate = 0.15,
     .default_seed = 7,
     .operations = 10000},
    {.name = "RoundupDivisionsWithFrequentFaults",
     .config = "roundup_power2_divisions:[1:4,64:8,>:2]",
     .fault_rate = 0.4,
     .default_seed = 99,
     .operations = 6000},
};

INSTANTIATE_TEST_SUITE_P(Scenarios, FaultInjectionStressTest,
                         ::testing::Combine(::testing::ValuesIn(kScenarios), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<FaultInjectionStressTest::ParamType>& info) {
                           return absl::StrCat(std::get<0>(info.param).name, std::get<1>(info.param)
                                                                                 ? "ExpandableSegments"
                                                                                 : "RegularSegments");
                         });

}  // namespace
}  // namespace graphalloc

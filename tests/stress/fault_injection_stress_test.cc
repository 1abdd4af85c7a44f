// Fault-injection stress: random allocator operations on the simulated device, with regular segments
// (one cuMemAlloc each) and with expandable segments (reserve, create, map, set access, unmap, release),
// while the device fails a random share of its calls with the errors a GPU gives. Faults come two ways:
// planned (SimDriver::InjectFault: one of the next three calls of a kind fails) and random
// (SimDriver::SetRandomFaults: every call of one kind fails with some probability during the operation).
// Scenarios with pools also allocate into a private pool (through a thread route), capture into it (the
// test begins and ends a global-mode capture on one stream, routed to the pool; the capture calls fail
// too, and a free of a block used on other streams waits for the capture's end), checkpoint and restore
// it, empty its cache, pin it for the captured graph and drop it while its blocks live.
// After every operation:
//   - the call succeeded, or it returned an error and left what a caller can observe as it was before the
//     call (strong guarantee): the allocation statistics, the set of live blocks (every block the test
//     holds is still known to the allocator, nothing else is), and for a failed Free every current
//     statistic; reserved memory never grows on a failure, except by a chunk whose rollback unmap the
//     device refused (it stays mapped and counted). The one allowed change: frees deferred during a
//     capture may complete in a failed EndCapture (its route's end) or EmptyCache;
//   - a successful free during a capture of a block used on other streams is deferred (still counted until
//     the capture's route ends), every other successful free is not; a successful checkpoint holds exactly
//     the pool's live blocks; a successful restore frees and creates exactly what makes the pool's live
//     blocks the checkpoint's;
//   - a capture call fails only when a fault was injected into it (else the allocator broke the capture);
//   - CheckInvariants() holds;
//   - every byte is accounted for: the allocator's reserved bytes are exactly what the device has mapped
//     or allocated for it, and regular segments hold no VMM resource;
//   - where memory is mapped, and with which access, agrees with the allocator's snapshot (read back from
//     /proc/self/maps) after any operation that failed or made a device call that maps or unmaps; a new
//     block lies in accessible memory;
//   - the contents of live blocks are intact (each holds a pattern derived from its id): all of them after
//     any operation that failed, made a device call that unmaps or frees memory, or restored a pool, and
//     every 64 operations; other operations cannot take memory away, and a new block overlapping a live
//     one is caught when it is handed out.
// At the end, with faults off, the capture is ended, everything freed and the cache emptied: before the
// allocator is destroyed (its destructor would hide a leak) the device holds no reservation, handle,
// mapping or allocation, and once it is gone no event, stream, graph or queued work either.
//
// The seed is printed; GRAPHALLOC_TEST_SEED=<seed> replays a run, GRAPHALLOC_STRESS_SCALE=<x> scales its
// length (and GRAPHALLOC_TEST_SCALE, which scripts/test.sh sets under the sanitizers). Operation counts
// (attempted/failed) and injected faults per call kind are printed per run.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/pool_checkpoint.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"
#include "gtest/gtest.h"
#include "tests/stress/fault_injection_model.h"
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
using testing::kFaultKinds;
using testing::KindOf;
using testing::kMappingCalls;
using testing::kNumFaultKinds;
using testing::kOpNames;
using testing::kUnmappingCalls;
using testing::Live;
using testing::Op;
using enum testing::Op;
using testing::Range;
using testing::Scenario;
using testing::SimDeviceMappings;

// One run: the allocator over a fresh simulated device, `operations` random operations, then teardown.
class FaultInjectionStress {
 public:
  FaultInjectionStress(const Scenario& scenario, bool expandable)
      : scenario_(scenario),
        expandable_(expandable),
        seed_(testing::TestSeed(scenario.default_seed)),
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
      for (int i = 0; i < (scenario_.pools ? 3 : 2); ++i) {
        absl::StatusOr<Stream> s = sim_->StreamCreate();
        ASSERT_TRUE(s.ok()) << s.status();
        streams_.push_back(*s);
      }
      if (scenario_.pools) {
        capture_stream_ = streams_.back();  // also used by ordinary operations, captured or not
        absl::StatusOr<PrivatePool> pool = allocator_->CreatePool();
        ASSERT_TRUE(pool.ok()) << pool.status();
        pool_ = std::move(*pool);
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
    // Once the allocator is gone: no event, stream or graph either.
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
  bool Plannable(int k) const { return !kFaultKinds[k].capture || scenario_.pools; }

  std::uint64_t CallsOf(std::span<const SimCall> calls) const {
    std::uint64_t n = 0;
    for (SimCall c : calls) n += sim_->CallCount(c);
    return n;
  }

  // The test's own copies to and from device memory are no part of a capture: made in relaxed mode, which
  // a global-mode capture does not refuse (and is not invalidated by).
  template <typename F>
  absl::Status OutsideCapture(F f) {
    if (!capturing_) return f();
    absl::StatusOr<CaptureMode> old = sim_->ExchangeCaptureMode(CaptureMode::kRelaxed);
    if (!old.ok()) return old.status();
    absl::Status s = f();
    (void)sim_->ExchangeCaptureMode(*old);
    return s;
  }
  absl::Status Fill(DevicePtr ptr, const Live& l) {
    return OutsideCapture([&] { return FillPattern(*sim_, ptr, l.size, l.id); });
  }
  absl::Status Check(DevicePtr ptr, const Live& l) {
    return OutsideCapture([&] { return CheckPattern(*sim_, ptr, l.size, l.id); });
  }

  // Every block the test holds is known to the allocator (with its contents intact when `contents`); the
  // allocator holds no other allocation (frees deferred during a capture count as frees).
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
        if (absl::Status s = Check(ptr, l); !s.ok()) {
          return AssertionFailure() << "block " << l.id << " corrupted: " << s;
        }
      }
    }
    return AssertionSuccess();
  }

  // The allocated blocks of `cp` are exactly the live blocks of its pool that the test holds: at the same
  // addresses, each large enough for what the test asked (a block the test allocated after the checkpoint
  // at the address and of the rounded size of one in it counts as that one, as Restore keeps it).
  AssertionResult PoolBlocksMatch(const PoolCheckpoint& cp) const {
    std::map<DevicePtr, std::size_t> in_checkpoint, held;
    for (const CheckpointSegment& seg : cp.segments) {
      for (const CheckpointBlock& b : seg.blocks) {
        if (b.allocated) in_checkpoint.emplace(seg.base + b.offset, b.size);
      }
    }
    for (const auto& [ptr, l] : live_) {
      if (l.pool == cp.pool) held.emplace(ptr, l.size);
    }
    bool match = in_checkpoint.size() == held.size();
    for (auto c = in_checkpoint.begin(), h = held.begin(); match && c != in_checkpoint.end(); ++c, ++h)
      match = c->first == h->first && h->second <= c->second;
    if (match) return AssertionSuccess();
    AssertionResult failure = AssertionFailure() << "pool " << cp.pool << ": allocated in the checkpoint";
    for (const auto& [ptr, size] : in_checkpoint) failure << absl::StrFormat(" 0x%x+%d", ptr, size);
    failure << "; live blocks the test holds (sizes asked)";
    for (const auto& [ptr, size] : held) failure << absl::StrFormat(" 0x%x+%d", ptr, size);
    return failure;
  }

  // The requested size of the allocated block at `ptr` in `cp`, or 0.
  static std::size_t RequestedIn(const PoolCheckpoint& cp, DevicePtr ptr) {
    for (const CheckpointSegment& seg : cp.segments) {
      for (const CheckpointBlock& b : seg.blocks) {
        if (b.allocated && seg.base + b.offset == ptr) return b.requested_size;
      }
    }
    return 0;
  }

  // Picks a live block at random.
  std::map<DevicePtr, Live>::iterator AnyLive() {
    auto it = live_.begin();
    std::advance(it, static_cast<long>(rng_() % live_.size()));
    return it;
  }

  Op Choose() {
    const int choice = static_cast<int>(rng_() % 100);
    const bool room = live_.size() < 48;
    if (!scenario_.pools) {
      if (live_.empty() || (choice < 48 && room)) return kAllocate;
      if (choice < 88) return kFree;
      if (choice < 95) return kRecordStream;
      return choice < 98 ? kEmptyCache : kBadFree;
    }
    if (live_.empty() || (choice < 42 && room)) return choice % 3 == 0 ? kPoolAllocate : kAllocate;
    if (choice < 78) return kFree;
    if (choice < 84) return kRecordStream;
    if (choice < 86) return kEmptyCache;
    if (choice < 87) return kBadFree;
    // Captures last about 20 operations; a restore during one is refused, so most come between them.
    const Op restore = checkpoint_.has_value() ? kRestore : kCheckpoint;
    if (choice < 89) return capturing_ ? kEndCapture : kBeginCapture;
    if (choice < 92) return capturing_ ? kEndCapture : restore;
    if (choice < 95) return kCheckpoint;
    if (choice < 98) return restore;
    return choice < 99 ? kEmptyPoolCache : kDropPool;
  }

  // Drops the last captured graph and the pin it held on its pool.
  void ReleaseGraph() {
    pin_.Reset();
    const std::optional<Graph> graph = std::exchange(graph_, std::nullopt);
    if (graph.has_value()) {
      ASSERT_TRUE(sim_->GraphDestroy(*graph).ok());
    }
  }

  void RunOperation(int op) {
    const std::string where = absl::StrCat("seed ", seed_, " op ", op);
    std::array<std::uint64_t, kNumFaultKinds> planned_at{};
    const int random_kind = PlanFaults(planned_at);
    const std::uint64_t injected_before = sim_->InjectedFaultCount();
    const std::uint64_t mapping_calls_before = CallsOf(kMappingCalls);
    const std::uint64_t unmapping_calls_before = CallsOf(kUnmappingCalls);
    const DeviceStats before = allocator_->GetStats();

    const Op kind = Choose();
    absl::Status status;
    DevicePtr new_ptr = 0;
    Live fresh;  // the new block of an allocation
    DevicePtr victim = 0;
    bool deferred_free = false;
    std::optional<RestoreResult> restored;
    switch (kind) {
      case kAllocate:
      case kPoolAllocate: {
        std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(48.0 * 1024 * 1024));
        fresh.size = rng_() % 64 == 0 ? std::size_t{1} << 30  // more than the device has
                                      : static_cast<std::size_t>(std::exp(log_size(rng_)));
        fresh.stream = streams_[rng_() % streams_.size()];
        PoolRoute route;
        if (kind == kPoolAllocate) {
          absl::StatusOr<PoolRoute> r =
              allocator_->BeginAllocateToPool(pool_, PoolRouteFilter::ForCallingThread());
          ASSERT_TRUE(r.ok()) << where << ": " << r.status();
          route = std::move(*r);
          fresh.pool = pool_.id();
        } else if (capturing_ && fresh.stream == capture_stream_) {
          fresh.pool = capture_pool_;  // the capture's route
        }
        absl::StatusOr<DevicePtr> ptr = allocator_->Allocate(fresh.size, fresh.stream);
        status = ptr.status();
        if (ptr.ok()) new_ptr = *ptr;
        ASSERT_TRUE(route.End().ok()) << where;  // not a capture route: nothing deferred to run
        break;
      }
      case kFree: {
        auto it = AnyLive();
        victim = it->first;
        deferred_free = capturing_ && it->second.used_elsewhere;
        ASSERT_TRUE(Check(victim, it->second).ok()) << where;
        status = allocator_->Free(victim);
        break;
      }
      case kRecordStream: {
        auto it = AnyLive();
        const Stream s = streams_[rng_() % streams_.size()];
        status = allocator_->RecordStream(it->first, s);
        if (status.ok() && s != it->second.stream) it->second.used_elsewhere = true;
        break;
      }
      case kEmptyCache:
        status = allocator_->EmptyCache();
        break;
      case kBadFree: {
        // Bad input under faults: an interior pointer, or a pointer never handed out.
        DevicePtr bogus = rng_() % 2 ? live_.begin()->first + 256 : DevicePtr{0x1000} + rng_() % 4096;
        while (live_.count(bogus) != 0) bogus += 1;  // never a block the test holds
        status = allocator_->Free(bogus);
        ASSERT_TRUE(absl::IsInvalidArgument(status)) << where << ": bad free gave " << status;
        status = absl::OkStatus();
        break;
      }
      case kBeginCapture: {
        status = sim_->BeginCapture(capture_stream_, CaptureMode::kGlobal);
        if (!status.ok()) break;
        absl::StatusOr<PoolRoute> route =
            allocator_->BeginAllocateToPool(pool_, PoolRouteFilter::ForCaptureOf(capture_stream_));
        ASSERT_TRUE(route.ok()) << where << ": " << route.status();
        capture_route_ = std::move(*route);
        capture_pool_ = pool_.id();
        capturing_ = true;
        break;
      }
      case kEndCapture: {
        absl::StatusOr<Graph> graph = sim_->EndCapture(capture_stream_);
        status = graph.status();
        if (!graph.ok()) break;  // an injected failure changes nothing: still capturing
        capturing_ = false;
        // The deferred frees record their events now; a failure leaves them deferred until the next try.
        status = capture_route_.End();
        // The graph may replay into the pool: it stays pinned until the next capture or the pool's drop.
        ReleaseGraph();
        graph_ = *graph;
        if (capture_pool_ == pool_.id()) {
          absl::StatusOr<GraphPin> pin = allocator_->PinForGraph(pool_);
          ASSERT_TRUE(pin.ok()) << where << ": " << pin.status();
          pin_ = std::move(*pin);
        }
        break;
      }
      case kCheckpoint: {
        absl::StatusOr<PoolCheckpoint> cp = allocator_->Checkpoint(pool_);
        status = cp.status();
        if (!cp.ok()) break;
        ASSERT_TRUE(PoolBlocksMatch(*cp)) << where;
        checkpoint_ = std::move(*cp);
        break;
      }
      case kRestore: {
        absl::StatusOr<RestoreResult> r = allocator_->Restore(pool_, *checkpoint_);
        status = r.status();
        if (r.ok()) restored = std::move(*r);
        break;
      }
      case kEmptyPoolCache:
        status = allocator_->EmptyPoolCache(pool_.id());
        break;
      case kDropPool: {
        // Its owner goes, with the graph that pinned it; its blocks live on (the test frees them later),
        // and the pool returns its memory after the last one.
        ReleaseGraph();
        pool_.Reset();
        if (rng_() % 4 != 0) checkpoint_.reset();  // else kept: restoring it into the next pool is refused
        absl::StatusOr<PrivatePool> pool = allocator_->CreatePool();
        ASSERT_TRUE(pool.ok()) << where << ": " << pool.status();
        pool_ = std::move(*pool);
        break;
      }
      case kCount:
        break;
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
    const std::string after_op = absl::StrCat(where, " after ", kOpNames[kind], " (", status.ToString(), ")");

    const DeviceStats after = allocator_->GetStats();
    if (kind == kBadFree) {
      // Refused bad input changes nothing at all.
      ASSERT_EQ(before, after) << where;
    } else if (status.ok()) {
      ASSERT_NO_FATAL_FAILURE(Succeeded(kind, where, before, after, new_ptr, fresh, victim, deferred_free,
                                        restored, mapping_calls_before));
    } else {
      ++failures_[kind];
      ASSERT_FALSE(status.message().empty()) << where;
      ASSERT_TRUE(absl::IsResourceExhausted(status) || absl::IsInternal(status) ||
                  absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status))
          << where << ": " << kOpNames[kind] << " failed with an unexpected code: " << status;
      if (kind == kAllocate && fresh.size < (std::size_t{1} << 30) && absl::IsResourceExhausted(status)) {
        ASSERT_NE(status.message().find("out of memory"), absl::string_view::npos) << where << ": " << status;
      }
      if (kind == kBeginCapture || (kind == kEndCapture && capturing_)) {
        // The capture calls themselves: only an injected fault may fail them. Anything else means the
        // allocator made a call the capture forbids (which invalidates it).
        const SimCall call = kind == kBeginCapture ? SimCall::kBeginCapture : SimCall::kEndCapture;
        ASSERT_TRUE(fired[KindOf(call)])
            << where << ": " << kOpNames[kind] << " failed by itself: " << status;
      }
    }
    // Frees deferred during a capture count as frees at once (as PyTorch's allocator counts them): the
    // allocator's allocations are the test's.
    ASSERT_EQ(after.allocation.all().current, static_cast<std::int64_t>(live_.size())) << after_op;
    if (!status.ok() && kind != kBadFree) {
      // Strong guarantee: no allocation appeared or vanished, and the bytes handed out are the same.
      ASSERT_EQ(after.allocation, before.allocation) << after_op;
      ASSERT_EQ(after.allocated_bytes.all().current, before.allocated_bytes.all().current) << after_op;
      ASSERT_EQ(after.requested_bytes.all().current, before.requested_bytes.all().current) << after_op;
      // A failure may have released cached memory on the way (the out-of-memory path empties the cache
      // before it gives up), never taken more, unless the device refused to unmap a chunk mapped for it.
      if (!unmap_refused) {
        ASSERT_LE(after.reserved_bytes.all().current, before.reserved_bytes.all().current)
            << after_op << ": reserved more";
      }
      if (kind == kFree) {
        // A refused Free changes nothing at all (it makes no allocation or release call).
        ASSERT_EQ(after.active, before.active) << where;
        ASSERT_EQ(after.reserved_bytes, before.reserved_bytes) << where;
        ASSERT_EQ(after.segment, before.segment) << where;
      }
    }
    absl::Status invariants = allocator_->CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << after_op << ": " << invariants;
    ASSERT_TRUE(testing::DeviceAccountsForReserved(*sim_, *allocator_, expandable_)) << after_op;
    // Only device calls change what is mapped (see kMappingCalls, kUnmappingCalls).
    const bool failed_or_periodic = !status.ok() || op % 64 == 63;
    if (failed_or_periodic || CallsOf(kMappingCalls) != mapping_calls_before) {
      ASSERT_TRUE(testing::MappingsMatchSnapshot(allocator_->TakeSnapshot(), &without_access_)) << after_op;
    }
    const bool contents =
        failed_or_periodic || restored.has_value() || CallsOf(kUnmappingCalls) != unmapping_calls_before;
    ASSERT_TRUE(CheckLive(contents)) << after_op;
  }

  // The checks and bookkeeping of an operation that succeeded.
  void Succeeded(Op kind, const std::string& where, const DeviceStats& before, const DeviceStats& after,
                 DevicePtr new_ptr, const Live& fresh, DevicePtr victim, bool deferred_free,
                 const std::optional<RestoreResult>& restored, std::uint64_t mapping_calls_before) {
    if (kind == kAllocate || kind == kPoolAllocate) {
      ASSERT_NO_FATAL_FAILURE(Adopt(where, new_ptr, fresh, mapping_calls_before));
      ASSERT_EQ(after.allocation.all().current, before.allocation.all().current + 1) << where;
    } else if (kind == kFree) {
      live_.erase(victim);
      ASSERT_EQ(after.allocation.all().current, before.allocation.all().current - 1) << where;
      if (deferred_free) {
        // Counted freed, but its events wait until the capture's route ends: a second free is refused.
        ASSERT_TRUE(absl::IsInvalidArgument(allocator_->Free(victim))) << where;
      } else {
        ASSERT_EQ(after.allocation.all().current, before.allocation.all().current - 1) << where;
        // The freed pointer is no longer known.
        ASSERT_TRUE(absl::IsInvalidArgument(allocator_->RecordStream(victim, kDefaultStream))) << where;
      }
    } else if (kind == kRestore) {
      for (DevicePtr p : restored->freed) {
        auto it = live_.find(p);
        ASSERT_TRUE(it != live_.end() && it->second.pool == pool_.id())
            << where << ": the restore freed 0x" << std::hex << p << ", not a live block of the pool";
        live_.erase(it);
      }
      for (const RestoredAllocation& c : restored->created) {
        Live l{.size = RequestedIn(*checkpoint_, c.ptr), .stream = c.stream, .id = 0, .pool = pool_.id()};
        ASSERT_GT(l.size, 0u) << where << ": the restore created 0x" << std::hex << c.ptr
                              << ", not an allocated block of the checkpoint";
        ASSERT_NO_FATAL_FAILURE(Adopt(where, c.ptr, l, mapping_calls_before));
      }
      ASSERT_EQ(after.allocation.all().current, before.allocation.all().current +
                                                    static_cast<std::int64_t>(restored->created.size()) -
                                                    static_cast<std::int64_t>(restored->freed.size()))
          << where;
      ASSERT_TRUE(PoolBlocksMatch(*checkpoint_)) << where << " after the restore";
    }
  }

  // A block handed out (by an allocation or a restore) becomes the test's: it overlaps no live block, lies
  // in accessible memory, and gets a fresh pattern.
  void Adopt(const std::string& where, DevicePtr ptr, Live l, std::uint64_t mapping_calls_before) {
    ASSERT_NE(ptr, 0u) << where;
    ASSERT_EQ(ptr % 512, 0u) << where;
    auto next = live_.lower_bound(ptr);
    ASSERT_TRUE(next == live_.end() || next->first >= ptr + l.size) << where << ": overlaps the next";
    ASSERT_TRUE(next == live_.begin() || std::prev(next)->first + std::prev(next)->second.size <= ptr)
        << where << ": overlaps the previous block";
    if (expandable_ && (without_access_ || CallsOf(kMappingCalls) != mapping_calls_before)) {
      // Memory mapped without access may exist (or have appeared): the block must not lie there. Checked
      // before it is touched, which would crash the test.
      ASSERT_TRUE(Accessible(SimDeviceMappings(), ptr, l.size))
          << where << ": the new block " << Range{ptr, ptr + l.size, true}
          << " is not accessible device memory";
    }
    l.id = next_id_++;
    ASSERT_TRUE(Fill(ptr, l).ok()) << where;
    live_.emplace(ptr, l);
  }

  // Faults off: the capture ends, everything is freed and returned, and the device holds nothing of the
  // allocator's.
  void Teardown() {
    sim_->ClearFaults();
    if (capturing_) {
      absl::StatusOr<Graph> graph = sim_->EndCapture(capture_stream_);
      ASSERT_TRUE(graph.ok()) << "ending the capture at the end: " << graph.status();
      capturing_ = false;
      ASSERT_TRUE(sim_->GraphDestroy(*graph).ok());
      ASSERT_TRUE(capture_route_.End().ok());  // completes the frees deferred during the capture
    }
    ReleaseGraph();
    ASSERT_TRUE(CheckLive(/*contents=*/true)) << "at the end";
    for (const auto& [ptr, l] : live_)
      ASSERT_TRUE(allocator_->Free(ptr).ok()) << "final free of block " << l.id;
    live_.clear();
    pool_.Reset();
    EXPECT_TRUE(testing::DrainAndCheckNothingLeaked(*sim_, *allocator_));
  }

  void PrintCounts() {
    std::string ops, faults, calls;
    for (int k = 0; k < kCount; ++k) {
      if (k >= kPoolAllocate && !scenario_.pools) continue;
      absl::StrAppend(&ops, " ", kOpNames[k], "=", attempts_[k], "/", failures_[k]);
    }
    std::uint64_t planned = 0, random = 0;
    for (int k = 0; k < kNumFaultKinds; ++k) {
      if (!Plannable(k)) continue;
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
  // Scenarios with pools: the pool, the capture into it (on capture_stream_, routed to capture_pool_),
  // the last captured graph with its pin on the pool, and the last checkpoint.
  PrivatePool pool_;
  Stream capture_stream_ = kDefaultStream;
  bool capturing_ = false;
  PoolRoute capture_route_;
  PoolId capture_pool_ = kDefaultPool;
  std::optional<Graph> graph_;
  GraphPin pin_;
  std::optional<PoolCheckpoint> checkpoint_;
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
    {.name = "PoolsCapturesAndCheckpoints",
     .config = "",
     .fault_rate = 0.15,
     .default_seed = 1105,
     .operations = 10000,
     .pools = true},
    {.name = "PoolsUnderAMemoryCapWithFrequentFaults",
     .config = "max_split_size_mb:40",
     .memory_fraction = 0.5,
     .fault_rate = 0.35,
     .default_seed = 31,
     .operations = 6000,
     .pools = true},
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

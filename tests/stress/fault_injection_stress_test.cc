// Fault-injection stress: random allocator operations on the simulated device while the device fails a
// random share of its calls with the errors a GPU gives (out of memory for allocation; unknown error or
// illegal address for frees and events). After every operation:
//   - the call succeeded, or it returned an error and left what a caller can observe as it was before the
//     call (strong guarantee): the allocation statistics, the set of live blocks (every block the test
//     holds is still known to the allocator, nothing else is), and for a failed Free every current
//     statistic;
//   - CheckInvariants() holds;
//   - the contents of live blocks are intact (each holds a pattern derived from its id).
// At the end, with faults off, everything is freed and the cache emptied, and once the allocator is gone
// the simulated device holds no handle, mapping, allocation, event, stream or queued work.
//
// The seed is printed; GRAPHALLOC_TEST_SEED=<seed> replays a run, GRAPHALLOC_STRESS_SCALE=<x> lengthens
// it. Operation and injected-fault counts are printed per run.
//
// TODO(issue 4, issue 5): drive expandable segments (map/unmap/set-access faults), private pools,
// checkpoint/restore and captures (begin/end capture faults) here once they exist.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "allocator/device/sim_driver.h"
#include "gtest/gtest.h"
#include "tests/stress/stress_util.h"
#include "tests/testing/device_memory.h"

namespace graphalloc {
namespace {

using testing::CheckPattern;
using testing::FillPattern;

// The calls that fail, and how: allocation runs out of memory; everything else fails as a sick device.
struct FaultKind {
  SimCall call;
  const char* name;
  std::array<DriverResult, 2> results;
};
constexpr FaultKind kFaultKinds[] = {
    {SimCall::kMemAlloc, "MemAlloc", {DriverResult::kOutOfMemory, DriverResult::kOutOfMemory}},
    {SimCall::kMemFree, "MemFree", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kEventCreate, "EventCreate", {DriverResult::kUnknown, DriverResult::kOutOfMemory}},
    {SimCall::kEventRecord, "EventRecord", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kEventQuery, "EventQuery", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kEventSynchronize, "EventSynchronize", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
};
constexpr int kNumFaultKinds = static_cast<int>(std::size(kFaultKinds));

struct Live {
  std::size_t size = 0;
  Stream stream = kDefaultStream;
  std::uint64_t id = 0;
};

// What a caller can observe of the allocator's state, for before/after comparisons.
struct Observed {
  DeviceStats stats;
  std::int64_t allocations() const { return stats.allocation.all().current; }
};

enum Op { kAllocate, kFree, kRecordStream, kEmptyCache, kBadFree, kCount };
constexpr const char* kOpNames[] = {"Allocate", "Free", "RecordStream", "EmptyCache", "BadFree"};

struct RunOptions {
  std::string config;  // GRAPHALLOC_CONF syntax
  double memory_fraction = 1.0;
  double fault_rate = 0.0;  // per operation and call kind: chance that one of its next calls fails
  std::uint64_t default_seed = 1;
  int operations = 0;
};

class FaultInjectionStressTest : public ::testing::Test {
 protected:
  void Run(const RunOptions& run) {
    const std::uint64_t seed = testing::StressSeed(run.default_seed);
    const int operations = testing::StressOps(run.operations);
    std::cout << "FaultInjectionStressTest."
              << ::testing::UnitTest::GetInstance()->current_test_info()->name() << " seed=" << seed
              << " (GRAPHALLOC_TEST_SEED=" << seed << " replays) operations=" << operations
              << " fault_rate=" << run.fault_rate << "\n";
    std::mt19937_64 rng(seed);

    SimDriverOptions sim_options;
    sim_options.capacity = std::size_t{512} << 20;
    sim_options.manual_completion = true;  // events stay pending until the test lets the streams run
    absl::StatusOr<std::unique_ptr<SimDriver>> created_driver = SimDriver::Create(sim_options);
    ASSERT_TRUE(created_driver.ok()) << created_driver.status();
    std::shared_ptr<SimDriver> sim(std::move(*created_driver));
    absl::StatusOr<Config> config = Config::Parse(run.config);
    ASSERT_TRUE(config.ok()) << config.status();

    {
      absl::StatusOr<std::unique_ptr<CachingAllocator>> created = CachingAllocator::Create(sim, *config);
      ASSERT_TRUE(created.ok()) << created.status();
      std::unique_ptr<CachingAllocator> allocator = std::move(*created);
      if (run.memory_fraction < 1.0) {
        ASSERT_TRUE(allocator->SetMemoryFraction(run.memory_fraction).ok());
      }

      std::vector<Stream> streams = {kDefaultStream};
      for (int i = 0; i < 2; ++i) {
        absl::StatusOr<Stream> s = sim->StreamCreate();
        ASSERT_TRUE(s.ok()) << s.status();
        streams.push_back(*s);
      }

      std::map<DevicePtr, Live> live;
      std::uint64_t next_id = 1;
      std::array<int, kCount> attempts{}, failures{};
      std::array<std::uint64_t, kNumFaultKinds> injected{};
      std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(48.0 * 1024 * 1024));
      std::bernoulli_distribution fault(run.fault_rate);

      // Every block the test holds is known to the allocator, with its contents intact; the allocator
      // holds no other allocation.
      auto check_live = [&](int op, bool contents) -> ::testing::AssertionResult {
        const std::int64_t count = allocator->GetStats().allocation.all().current;
        if (count != static_cast<std::int64_t>(live.size())) {
          return ::testing::AssertionFailure() << "op " << op << ": allocator counts " << count
                                               << " allocations, the test holds " << live.size();
        }
        for (const auto& [ptr, l] : live) {
          // RecordStream on the block's own stream changes nothing; it fails for an unknown pointer.
          if (absl::Status s = allocator->RecordStream(ptr, l.stream); !s.ok()) {
            return ::testing::AssertionFailure() << "op " << op << ": live block " << l.id << " lost: " << s;
          }
          if (contents) {
            if (absl::Status s = CheckPattern(*sim, ptr, l.size, l.id); !s.ok()) {
              return ::testing::AssertionFailure()
                     << "op " << op << ": block " << l.id << " corrupted: " << s;
            }
          }
        }
        return ::testing::AssertionSuccess();
      };

      for (int op = 0; op < operations; ++op) {
        const std::string where = absl::StrCat("seed ", seed, " op ", op);
        // Plan this operation's faults: per kind, maybe one of its next three calls fails.
        std::array<std::uint64_t, kNumFaultKinds> planned_at{};
        for (int k = 0; k < kNumFaultKinds; ++k) {
          if (!fault(rng)) continue;
          const int nth = 1 + static_cast<int>(rng() % 3);
          const DriverResult result = kFaultKinds[k].results[rng() % 2];
          planned_at[k] = sim->CallCount(kFaultKinds[k].call) + static_cast<std::uint64_t>(nth);
          sim->InjectFault(kFaultKinds[k].call, nth, result);
        }

        const Observed before{allocator->GetStats()};
        const int choice = static_cast<int>(rng() % 100);
        Op kind;
        absl::Status status;
        DevicePtr new_ptr = 0;
        std::size_t new_size = 0;
        Stream new_stream = kDefaultStream;
        DevicePtr victim = 0;
        if (live.empty() || (choice < 48 && live.size() < 48)) {
          kind = kAllocate;
          new_size = rng() % 64 == 0 ? std::size_t{1} << 30  // more than the device has
                                     : static_cast<std::size_t>(std::exp(log_size(rng)));
          new_stream = streams[rng() % streams.size()];
          absl::StatusOr<DevicePtr> ptr = allocator->Allocate(new_size, new_stream);
          status = ptr.status();
          if (ptr.ok()) new_ptr = *ptr;
        } else if (choice < 88) {
          kind = kFree;
          auto it = live.begin();
          std::advance(it, static_cast<long>(rng() % live.size()));
          victim = it->first;
          ASSERT_TRUE(CheckPattern(*sim, victim, it->second.size, it->second.id).ok()) << where;
          status = allocator->Free(victim);
        } else if (choice < 95) {
          kind = kRecordStream;
          auto it = live.begin();
          std::advance(it, static_cast<long>(rng() % live.size()));
          status = allocator->RecordStream(it->first, streams[rng() % streams.size()]);
        } else if (choice < 98) {
          kind = kEmptyCache;
          status = allocator->EmptyCache();
        } else {
          // Bad input under faults: an interior pointer, or a pointer never handed out.
          kind = kBadFree;
          DevicePtr bogus = rng() % 2 ? live.begin()->first + 256 : DevicePtr{0x1000} + rng() % 4096;
          while (live.count(bogus) != 0) bogus += 1;  // never a block the test holds
          status = allocator->Free(bogus);
          ASSERT_TRUE(absl::IsInvalidArgument(status)) << where << ": bad free gave " << status;
          status = absl::OkStatus();
        }
        sim->ClearFaults();
        for (int k = 0; k < kNumFaultKinds; ++k) {
          if (planned_at[k] != 0 && sim->CallCount(kFaultKinds[k].call) >= planned_at[k]) ++injected[k];
        }
        ++attempts[kind];

        const Observed after{allocator->GetStats()};
        if (kind == kBadFree) {
          // Refused bad input changes nothing at all.
          ASSERT_EQ(before.stats, after.stats) << where;
        } else if (status.ok()) {
          if (kind == kAllocate) {
            ASSERT_NE(new_ptr, 0u) << where;
            ASSERT_EQ(new_ptr % 512, 0u) << where;
            auto next = live.lower_bound(new_ptr);
            ASSERT_TRUE(next == live.end() || next->first >= new_ptr + new_size)
                << where << ": overlaps the next";
            ASSERT_TRUE(next == live.begin() ||
                        std::prev(next)->first + std::prev(next)->second.size <= new_ptr)
                << where << ": overlaps the previous block";
            const std::uint64_t id = next_id++;
            ASSERT_TRUE(FillPattern(*sim, new_ptr, new_size, id).ok()) << where;
            live.emplace(new_ptr, Live{new_size, new_stream, id});
            ASSERT_EQ(after.allocations(), before.allocations() + 1) << where;
          } else if (kind == kFree) {
            live.erase(victim);
            ASSERT_EQ(after.allocations(), before.allocations() - 1) << where;
            // The freed pointer is no longer known.
            ASSERT_TRUE(absl::IsInvalidArgument(allocator->RecordStream(victim, kDefaultStream))) << where;
          }
        } else {
          ++failures[kind];
          ASSERT_FALSE(status.message().empty()) << where;
          ASSERT_TRUE(absl::IsResourceExhausted(status) || absl::IsInternal(status) ||
                      absl::IsInvalidArgument(status))
              << where << ": " << kOpNames[kind] << " failed with an unexpected code: " << status;
          if (kind == kAllocate && new_size < (std::size_t{1} << 30) && absl::IsResourceExhausted(status)) {
            ASSERT_NE(status.message().find("out of memory"), absl::string_view::npos)
                << where << ": " << status;
          }
          // Strong guarantee: no allocation appeared or vanished, and the bytes handed out are the same.
          ASSERT_EQ(after.stats.allocation, before.stats.allocation) << where << ": " << status;
          ASSERT_EQ(after.stats.allocated_bytes.all().current, before.stats.allocated_bytes.all().current)
              << where;
          ASSERT_EQ(after.stats.requested_bytes.all().current, before.stats.requested_bytes.all().current)
              << where;
          // A failure may have released cached memory on the way (the out-of-memory path empties the
          // cache before it gives up), never taken more.
          ASSERT_LE(after.stats.reserved_bytes.all().current, before.stats.reserved_bytes.all().current)
              << where;
          if (kind == kFree) {
            // A refused Free changes nothing at all (it makes no allocation or release call).
            ASSERT_EQ(after.stats.active, before.stats.active) << where;
            ASSERT_EQ(after.stats.reserved_bytes, before.stats.reserved_bytes) << where;
            ASSERT_EQ(after.stats.segment, before.stats.segment) << where;
          }
          ASSERT_TRUE(check_live(op, /*contents=*/true))
              << where << " after failed " << kOpNames[kind] << ": " << status;
        }
        absl::Status invariants = allocator->CheckInvariants();
        ASSERT_TRUE(invariants.ok()) << where << " after " << kOpNames[kind] << " (" << status
                                     << "): " << invariants;
        if (op % 256 == 255) {
          ASSERT_TRUE(check_live(op, /*contents=*/true)) << where;
        }
        // The device makes progress now and then: pending stream events complete.
        if (rng() % 16 == 0) sim->RunAllPendingWork();
      }

      // Teardown with faults off: everything is freed and returned.
      sim->ClearFaults();
      ASSERT_TRUE(check_live(operations, /*contents=*/true));
      for (const auto& [ptr, l] : live)
        ASSERT_TRUE(allocator->Free(ptr).ok()) << "final free of block " << l.id;
      live.clear();
      sim->RunAllPendingWork();
      ASSERT_TRUE(allocator->EmptyCache().ok());
      ASSERT_TRUE(allocator->CheckInvariants().ok());
      const DeviceStats end = allocator->GetStats();
      EXPECT_EQ(end.allocation.all().current, 0);
      EXPECT_EQ(end.active.all().current, 0);
      EXPECT_EQ(end.segment.all().current, 0);
      EXPECT_EQ(end.reserved_bytes.all().current, 0);

      std::uint64_t total_injected = 0;
      std::string faults;
      for (int k = 0; k < kNumFaultKinds; ++k) {
        total_injected += injected[k];
        absl::StrAppend(&faults, " ", kFaultKinds[k].name, "=", injected[k]);
      }
      std::string ops;
      for (int k = 0; k < kCount; ++k)
        absl::StrAppend(&ops, " ", kOpNames[k], "=", attempts[k], "/", failures[k]);
      std::cout << "  operations (attempted/failed):" << ops << "\n  injected faults: " << total_injected
                << " (driver count " << sim->InjectedFaultCount() << "):" << faults
                << "\n  device calls: MemAlloc=" << sim->CallCount(SimCall::kMemAlloc)
                << " MemFree=" << sim->CallCount(SimCall::kMemFree)
                << " EventRecord=" << sim->CallCount(SimCall::kEventRecord)
                << " EventQuery=" << sim->CallCount(SimCall::kEventQuery) << "\n";
      EXPECT_EQ(total_injected, sim->InjectedFaultCount());
      if (run.fault_rate > 0) {
        EXPECT_GT(total_injected, 0u);
      }
      for (std::size_t i = 1; i < streams.size(); ++i) ASSERT_TRUE(sim->StreamDestroy(streams[i]).ok());
    }  // the allocator is destroyed here

    // Every handle, mapping, byte, event and stream is accounted for.
    const SimCounters c = sim->Counters();
    EXPECT_EQ(c.reservations, 0u);
    EXPECT_EQ(c.handles, 0u);
    EXPECT_EQ(c.handle_bytes, 0u);
    EXPECT_EQ(c.mappings, 0u);
    EXPECT_EQ(c.allocations, 0u);
    EXPECT_EQ(c.allocated_bytes, 0u);
    EXPECT_EQ(c.events, 0u);
    EXPECT_EQ(c.streams, 0u);
    EXPECT_EQ(c.pending_work, 0u);
    EXPECT_EQ(sim->UsedBytes(), 0u);
  }
};

TEST_F(FaultInjectionStressTest, DefaultConfig) {
  Run({.config = "", .fault_rate = 0.15, .default_seed = 20251121, .operations = 20000});
}

TEST_F(FaultInjectionStressTest, MaxSplitSizeAndGarbageCollectionUnderAMemoryCap) {
  Run({.config = "max_split_size_mb:20,garbage_collection_threshold:0.5",
       .memory_fraction = 0.75,
       .fault_rate = 0.15,
       .default_seed = 7,
       .operations = 20000});
}

TEST_F(FaultInjectionStressTest, RoundupDivisionsWithFrequentFaults) {
  Run({.config = "roundup_power2_divisions:[1:4,64:8,>:2]",
       .fault_rate = 0.4,
       .default_seed = 99,
       .operations = 12000});
}

}  // namespace
}  // namespace graphalloc

// Pool lifecycles under concurrency, for ThreadSanitizer (label `threads`): while three threads allocate,
// fill, check and free blocks of the default pool on streams of their own, take snapshots, check the
// invariants and empty the cache, one thread puts a private pool to sleep with a backup and wakes it, and
// another checkpoints a private pool, diverges from it and restores it, round after round. Sleep, wake and
// restore take the allocator's coordinator, device and shard locks in their own orders, and no
// single-threaded test lets TSan see those orders meet the allocation path's; here they meet. Every round
// checks what its pool must hold (the sleeper: its blocks' contents after the wake; the restorer: exactly
// the blocks the restore freed and re-created, and the contents kept), and at the end the allocator's
// invariants hold, statistics are back to zero and the device holds nothing. The seed is printed;
// GRAPHALLOC_TEST_SEED replays each thread's choices (the interleaving is the scheduler's).
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"
#include "tests/stress/stress_util.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/device_memory.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_device.h"
#include "tests/testing/test_scale.h"

namespace graphalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class PoolLifecycleConcurrencyTest : public testing::AllocatorFixture {
 protected:
  // Allocates, fills, checks and frees blocks of the default pool on `stream`; now and then a snapshot,
  // an invariant check or an emptied cache.
  void DefaultPoolWorker(Stream stream, std::uint64_t seed, int operations) {
    std::mt19937_64 rng(seed);
    std::vector<std::pair<DevicePtr, std::size_t>> live;
    for (int op = 0; op < operations; ++op) {
      const std::uint64_t choice = rng() % 100;
      if (choice < 50 || live.empty()) {
        const std::size_t bytes = std::size_t{512} << (rng() % 14);  // 512 B .. 4 MiB
        ASSERT_OK_AND_ASSIGN(const DevicePtr p, allocator_->Allocate(bytes, stream));
        ASSERT_OK(testing::FillPattern(*driver_, p, bytes, p));
        live.emplace_back(p, bytes);
      } else if (choice < 90) {
        const std::size_t at = rng() % live.size();
        const auto [p, bytes] = live[at];
        ASSERT_OK(testing::CheckPattern(*driver_, p, bytes, p));
        ASSERT_OK(allocator_->Free(p));
        live[at] = live.back();
        live.pop_back();
      } else if (choice < 94) {
        ASSERT_OK(allocator_->EmptyCache());
      } else if (choice < 97) {
        const MemorySnapshot snapshot = allocator_->TakeSnapshot("", /*record_event=*/false);
        ASSERT_FALSE(snapshot.segments.empty());
      } else {
        ASSERT_OK(allocator_->CheckInvariants());
      }
    }
    for (const auto& [p, bytes] : live) {
      ASSERT_OK(testing::CheckPattern(*driver_, p, bytes, p));
      ASSERT_OK(allocator_->Free(p));
    }
  }

  // Each round: blocks into `pool`, filled; a backed-up sleep; a wake; the contents checked; freed.
  void Sleeper(const PrivatePool& pool, Stream stream, std::uint64_t seed, int rounds) {
    std::mt19937_64 rng(seed);
    ASSERT_OK_AND_ASSIGN(PoolRoute route,
                         allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread()));
    for (int round = 0; round < rounds; ++round) {
      std::vector<std::pair<DevicePtr, std::size_t>> blocks;
      for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n; ++i) {
        const std::size_t bytes = (1 + rng() % 6) * kMiB;
        ASSERT_OK_AND_ASSIGN(const DevicePtr p, allocator_->Allocate(bytes, stream));
        ASSERT_OK(testing::FillPattern(*driver_, p, bytes, p + 1));
        blocks.emplace_back(p, bytes);
      }
      SleepRequest sleep;
      sleep.scope = SleepScope::Pool(pool.id());
      sleep.mode = SleepMode::kBackup;
      ASSERT_OK_AND_ASSIGN(const SleepResult slept, allocator_->Sleep(sleep));
      ASSERT_EQ(slept.pools, std::vector<PoolId>{pool.id()});
      WakeRequest wake;
      wake.scope = SleepScope::Pool(pool.id());
      ASSERT_OK_AND_ASSIGN(const WakeResult woke, allocator_->Wake(wake));
      ASSERT_EQ(woke.pools, std::vector<PoolId>{pool.id()});
      for (const auto& [p, bytes] : blocks) {
        ASSERT_OK(testing::CheckPattern(*driver_, p, bytes, p + 1));
        ASSERT_OK(allocator_->Free(p));
      }
    }
    ASSERT_OK(route.End());
  }

  // Each round: a and b into `pool`, a checkpoint, b freed and d, e allocated (d larger than b, so never
  // at b's address and size, which the restore would take for b), a restore: d and e freed, b re-created
  // at its address, a's contents kept.
  void Restorer(const PrivatePool& pool, Stream stream, std::uint64_t seed, int rounds) {
    std::mt19937_64 rng(seed);
    ASSERT_OK_AND_ASSIGN(PoolRoute route,
                         allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread()));
    for (int round = 0; round < rounds; ++round) {
      const std::size_t a_bytes = (1 + rng() % 4) * kMiB;
      const std::size_t b_bytes = (1 + rng() % 4) * kMiB;
      ASSERT_OK_AND_ASSIGN(const DevicePtr a, allocator_->Allocate(a_bytes, stream));
      ASSERT_OK_AND_ASSIGN(const DevicePtr b, allocator_->Allocate(b_bytes, stream));
      ASSERT_OK(testing::FillPattern(*driver_, a, a_bytes, a + 2));
      ASSERT_OK_AND_ASSIGN(const PoolCheckpoint checkpoint, allocator_->Checkpoint(pool));
      ASSERT_OK(allocator_->Free(b));
      ASSERT_OK_AND_ASSIGN(const DevicePtr d, allocator_->Allocate((5 + rng() % 3) * kMiB, stream));
      ASSERT_OK_AND_ASSIGN(const DevicePtr e, allocator_->Allocate((8 + rng() % 8) * kMiB, stream));
      ASSERT_OK_AND_ASSIGN(const RestoreResult restored, allocator_->Restore(pool, checkpoint));
      std::vector<DevicePtr> freed = {d, e};
      std::sort(freed.begin(), freed.end());
      ASSERT_EQ(restored.freed, freed);
      ASSERT_EQ(restored.created, (std::vector<RestoredAllocation>{{b, b_bytes, stream}}));
      ASSERT_OK(testing::CheckPattern(*driver_, a, a_bytes, a + 2));
      ASSERT_OK(allocator_->Free(a));
      ASSERT_OK(allocator_->Free(b));
    }
    ASSERT_OK(route.End());
  }
};

TEST_F(PoolLifecycleConcurrencyTest, SleepWakeAndRestoreWhileOtherThreadsAllocate) {
  Config config;
  config.expandable_segments = true;  // what sleep keeps the addresses of
  GRAPHALLOC_ALLOCATOR_SETUP(config);
  const std::uint64_t seed = testing::TestSeed(20261129);
  const int operations = testing::ScaledCount(4000);
  const int rounds = testing::ScaledCount(200);
  std::cout << "PoolLifecycleConcurrencyTest seed=" << seed << " (GRAPHALLOC_TEST_SEED=" << seed
            << " replays each thread's choices) operations/worker=" << operations << " rounds=" << rounds
            << "\n";
  std::vector<Stream> streams(5);
  for (Stream& s : streams) s = NewStream();
  {
    PoolOptions sleepy;
    sleepy.tag = "sleepy";
    ASSERT_OK_AND_ASSIGN(const PrivatePool sleep_pool, allocator_->CreatePool(sleepy));
    ASSERT_OK_AND_ASSIGN(const PrivatePool restore_pool, allocator_->CreatePool());
    std::vector<std::jthread> threads;
    for (int w = 0; w < 3; ++w) {
      threads.emplace_back([&, w] { DefaultPoolWorker(streams[w], seed + w, operations); });
    }
    threads.emplace_back([&] { Sleeper(sleep_pool, streams[3], seed + 3, rounds); });
    threads.emplace_back([&] { Restorer(restore_pool, streams[4], seed + 4, rounds); });
  }  // the threads joined, then the pools released
  ASSERT_OK(allocator_->CheckInvariants());
  if (SimDriver* sim = testing::AsSim(driver_.get())) {
    EXPECT_TRUE(testing::DrainAndCheckNothingLeaked(*sim, *allocator_));
    EXPECT_EQ(sim->Counters().host_bytes, 0u);  // every sleep's backup was freed
  } else {
    ASSERT_OK(allocator_->EmptyCache());
    ASSERT_OK(allocator_->CheckInvariants());
    EXPECT_TRUE(testing::AllocatorIsEmpty(allocator_->GetStats()));
  }
  allocator_.reset();  // the fixture's teardown checks for illegal accesses and destroys the streams
}

}  // namespace
}  // namespace graphalloc

// Concurrency stress: 8 threads allocate, free, record streams, empty the cache, read statistics and check
// invariants at once on one caching allocator over the simulated device, each mostly on its own stream,
// with some blocks handed to other threads through a shared queue and freed there. Streams run their
// queued work (event markers) from several threads too. Run time is bounded by operation counts (no
// sleeps, no timing); the test is part of the ThreadSanitizer build, where a data race fails it and a
// deadlock hits the CTest timeout. At the end: invariants hold, statistics are back to zero, and once the
// allocator is gone the device holds nothing.
//
// The seed is printed; GRAPHALLOC_TEST_SEED replays the same per-thread operation sequences (the
// interleaving is the scheduler's). GRAPHALLOC_STRESS_SCALE lengthens the run.
//
// TODO(issue 5, issue 6): add threads capturing into private pools and taking memory snapshots once pools
// and snapshots exist.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <deque>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/caching_allocator.h"
#include "allocator/device/sim_driver.h"
#include "allocator/mutex.h"
#include "gtest/gtest.h"
#include "tests/stress/stress_util.h"
#include "tests/testing/device_memory.h"

namespace graphalloc {
namespace {

using testing::CheckPattern;
using testing::FillPattern;

constexpr int kThreads = 8;

struct Block {
  DevicePtr ptr = 0;
  std::size_t size = 0;
  std::uint64_t id = 0;
};

// Blocks on their way from one thread to another, which frees them.
class HandOff {
 public:
  void Push(const Block& b) {
    MutexLock lock(&mu_);
    blocks_.push_back(b);
  }
  bool Pop(Block* b) {
    MutexLock lock(&mu_);
    if (blocks_.empty()) return false;
    *b = blocks_.front();
    blocks_.pop_front();
    return true;
  }

 private:
  Mutex mu_;
  std::deque<Block> blocks_ ABSL_GUARDED_BY(mu_);
};

enum Op {
  kAllocate,
  kFree,
  kHandOff,
  kFreeOthers,
  kRecordStream,
  kEmptyCache,
  kStats,
  kInvariants,
  kRunWork,
  kCount
};
constexpr const char* kOpNames[] = {"Allocate",   "Free",  "HandOff",    "FreeOthers", "RecordStream",
                                    "EmptyCache", "Stats", "Invariants", "RunWork"};

struct ThreadResult {
  std::array<std::uint64_t, kCount> ops{};
  std::uint64_t ooms = 0;
  std::string error;  // the first failure, if any
};

struct Shared {
  CachingAllocator* allocator = nullptr;
  SimDriver* sim = nullptr;
  std::vector<Stream> streams;
  HandOff handoff;
  std::atomic<std::uint64_t> next_id{1};
  std::atomic<std::uint64_t> kernels{0};  // host closures run by the streams
};

void Worker(Shared& shared, int index, std::uint64_t seed, int operations, ThreadResult& result) {
  std::mt19937_64 rng(seed * kThreads + static_cast<std::uint64_t>(index));
  std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(8.0 * 1024 * 1024));
  CachingAllocator& allocator = *shared.allocator;
  const Stream own = shared.streams[static_cast<std::size_t>(index)];
  std::vector<Block> live;
  auto fail = [&](std::string message) {
    if (result.error.empty()) result.error = absl::StrCat("thread ", index, ": ", message);
  };
  auto release = [&](const Block& b) {
    if (absl::Status s = CheckPattern(*shared.sim, b.ptr, b.size, b.id); !s.ok())
      return fail(absl::StrCat("block ", b.id, " corrupted: ", s.ToString()));
    if (absl::Status s = allocator.Free(b.ptr); !s.ok()) fail(absl::StrCat("Free: ", s.ToString()));
  };
  for (int op = 0; op < operations && result.error.empty(); ++op) {
    const int choice = static_cast<int>(rng() % 100);
    Op kind;
    if (live.empty() || (choice < 45 && live.size() < 24)) {
      kind = kAllocate;
      const auto size = static_cast<std::size_t>(std::exp(log_size(rng)));
      // Mostly the thread's own stream, sometimes another thread's.
      const Stream stream = rng() % 10 == 0 ? shared.streams[rng() % shared.streams.size()] : own;
      absl::StatusOr<DevicePtr> ptr = allocator.Allocate(size, stream);
      if (!ptr.ok()) {
        if (!absl::IsResourceExhausted(ptr.status()))
          fail(absl::StrCat("Allocate: ", ptr.status().ToString()));
        ++result.ooms;
      } else {
        const Block b{*ptr, size, shared.next_id.fetch_add(1, std::memory_order_relaxed)};
        if (absl::Status s = FillPattern(*shared.sim, b.ptr, b.size, b.id); !s.ok()) fail(s.ToString());
        live.push_back(b);
      }
    } else if (choice < 70) {
      kind = kFree;
      const std::size_t i = rng() % live.size();
      const Block b = live[i];
      live[i] = live.back();
      live.pop_back();
      release(b);
    } else if (choice < 78) {
      kind = kHandOff;
      const std::size_t i = rng() % live.size();
      shared.handoff.Push(live[i]);
      live[i] = live.back();
      live.pop_back();
    } else if (choice < 86) {
      kind = kFreeOthers;
      Block b;
      if (shared.handoff.Pop(&b)) release(b);
    } else if (choice < 93) {
      kind = kRecordStream;
      const Block& b = live[rng() % live.size()];
      if (absl::Status s = allocator.RecordStream(b.ptr, shared.streams[rng() % shared.streams.size()]);
          !s.ok())
        fail(absl::StrCat("RecordStream: ", s.ToString()));
    } else if (choice < 94) {
      kind = kEmptyCache;
      if (absl::Status s = allocator.EmptyCache(); !s.ok()) fail(absl::StrCat("EmptyCache: ", s.ToString()));
    } else if (choice < 96) {
      kind = kStats;
      const DeviceStats stats = allocator.GetStats();
      if (stats.allocated_bytes.all().current < 0 || stats.reserved_bytes.all().current < 0)
        fail("negative statistics");
    } else if (choice < 97) {
      kind = kInvariants;
      if (absl::Status s = allocator.CheckInvariants(); !s.ok())
        fail(absl::StrCat("invariants: ", s.ToString()));
    } else {
      kind = kRunWork;
      // A "kernel" on this thread's stream; then the stream's work runs here, or on any thread that runs
      // everyone's, or through a synchronization that waits for another thread running it.
      if (absl::Status s = shared.sim->LaunchHostFunction(own, [&shared] { shared.kernels.fetch_add(1); });
          !s.ok())
        fail(absl::StrCat("LaunchHostFunction: ", s.ToString()));
      switch (rng() % 3) {
        case 0:
          shared.sim->RunAllPendingWork();
          break;
        case 1:
          shared.sim->RunPendingWork(own);
          break;
        default:
          if (absl::Status s = shared.sim->StreamSynchronize(own); !s.ok())
            fail(absl::StrCat("StreamSynchronize: ", s.ToString()));
      }
    }
    ++result.ops[kind];
  }
  for (const Block& b : live) release(b);
}

TEST(ConcurrencyStressTest, EightThreadsOnOneAllocator) {
  const std::uint64_t seed = testing::StressSeed(20251121);
  const int operations = testing::StressOps(5000);
  std::cout << "ConcurrencyStressTest seed=" << seed << " (GRAPHALLOC_TEST_SEED=" << seed
            << " replays the per-thread sequences) threads=" << kThreads
            << " operations/thread=" << operations << "\n";
  SimDriverOptions options;
  options.capacity = std::size_t{2} << 30;
  options.manual_completion = true;  // stream events complete when some thread runs the stream's work
  absl::StatusOr<std::unique_ptr<SimDriver>> created_driver = SimDriver::Create(options);
  ASSERT_TRUE(created_driver.ok()) << created_driver.status();
  std::shared_ptr<SimDriver> sim(std::move(*created_driver));
  {
    absl::StatusOr<std::unique_ptr<CachingAllocator>> created = CachingAllocator::Create(sim);
    ASSERT_TRUE(created.ok()) << created.status();
    std::unique_ptr<CachingAllocator> allocator = std::move(*created);

    Shared shared;
    shared.allocator = allocator.get();
    shared.sim = sim.get();
    for (int i = 0; i < kThreads; ++i) {
      absl::StatusOr<Stream> s = sim->StreamCreate();
      ASSERT_TRUE(s.ok()) << s.status();
      shared.streams.push_back(*s);
    }
    std::vector<ThreadResult> results(kThreads);
    {
      std::vector<std::thread> threads;
      for (int i = 0; i < kThreads; ++i) {
        threads.emplace_back(Worker, std::ref(shared), i, seed, operations, std::ref(results[i]));
      }
      for (std::thread& t : threads) t.join();
    }
    std::array<std::uint64_t, kCount> totals{};
    std::uint64_t ooms = 0;
    for (const ThreadResult& r : results) {
      EXPECT_TRUE(r.error.empty()) << r.error << " (seed " << seed << ")";
      for (int k = 0; k < kCount; ++k) totals[k] += r.ops[k];
      ooms += r.ooms;
    }
    std::string line;
    std::uint64_t all = 0;
    for (int k = 0; k < kCount; ++k) {
      absl::StrAppend(&line, " ", kOpNames[k], "=", totals[k]);
      all += totals[k];
    }
    std::cout << "  operations: " << all << ":" << line << " (out of memory: " << ooms << ")\n";
    sim->RunAllPendingWork();
    EXPECT_EQ(shared.kernels.load(), totals[kRunWork]);

    // Blocks still in the hand-off queue are freed here; then the device finishes its work.
    Block b;
    while (shared.handoff.Pop(&b)) {
      EXPECT_TRUE(CheckPattern(*sim, b.ptr, b.size, b.id).ok()) << "block " << b.id;
      EXPECT_TRUE(allocator->Free(b.ptr).ok());
    }
    sim->RunAllPendingWork();
    ASSERT_TRUE(allocator->EmptyCache().ok());
    absl::Status invariants = allocator->CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << invariants;
    const DeviceStats stats = allocator->GetStats();
    EXPECT_EQ(stats.allocation.all().current, 0);
    EXPECT_EQ(stats.active.all().current, 0);
    EXPECT_EQ(stats.allocated_bytes.all().current, 0);
    EXPECT_EQ(stats.reserved_bytes.all().current, 0);
    EXPECT_EQ(stats.segment.all().current, 0);
    for (Stream s : shared.streams) EXPECT_TRUE(sim->StreamDestroy(s).ok());
  }
  const SimCounters c = sim->Counters();
  EXPECT_EQ(c.allocations, 0u);
  EXPECT_EQ(c.handles, 0u);
  EXPECT_EQ(c.mappings, 0u);
  EXPECT_EQ(c.reservations, 0u);
  EXPECT_EQ(c.events, 0u);
  EXPECT_EQ(c.streams, 0u);
  EXPECT_EQ(c.pending_work, 0u);
}

}  // namespace
}  // namespace graphalloc

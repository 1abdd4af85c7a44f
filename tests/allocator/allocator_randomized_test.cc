// 100,000 random operations over several streams and sizes (512 B to 64 MiB): every live block holds a
// pattern derived from its id, verified when it is freed; invariants are checked after every step.
// Runs with the default configuration, others, and handle-aligned expandable segments (the config key, and a
// private pool with the option), whose invariants include that no mapped block spans two chunks.
// Set GRAPHALLOC_TEST_SEED to replay a failing run; the seed is printed. GRAPHALLOC_TEST_SCALE scales the
// operation counts (scripts/test.sh shortens them under the sanitizers).
#include <cmath>
#include <iostream>
#include <optional>
#include <random>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/device_memory.h"
#include "tests/testing/test_scale.h"

namespace graphalloc {
namespace {

using testing::AllocatorFixture;

struct Live {
  DevicePtr ptr;
  std::size_t size;
  std::uint64_t id;
};

class AllocatorRandomizedTest : public AllocatorFixture {
 protected:
  // `base_operations` times GRAPHALLOC_TEST_SCALE (shorter under the sanitizers).
  // With `pool_options`, every allocation goes to a private pool created with them (a thread route).
  void Run(Config config, std::uint64_t default_seed, int base_operations,
           std::optional<PoolOptions> pool_options = std::nullopt) {
    GRAPHALLOC_ALLOCATOR_SETUP(config);
    std::optional<PrivatePool> pool;
    std::optional<PoolRoute> route;
    if (pool_options.has_value()) {
      absl::StatusOr<PrivatePool> created = allocator_->CreatePool(*pool_options);
      ASSERT_TRUE(created.ok()) << created.status();
      pool.emplace(*std::move(created));
      absl::StatusOr<PoolRoute> opened =
          allocator_->BeginAllocateToPool(*pool, PoolRouteFilter::ForCallingThread());
      ASSERT_TRUE(opened.ok()) << opened.status();
      route.emplace(*std::move(opened));
    }
    const std::uint64_t seed = testing::TestSeed(default_seed);
    const int operations = testing::ScaledCount(base_operations);
    std::cout << "AllocatorRandomizedTest seed=" << seed
              << " (set GRAPHALLOC_TEST_SEED to replay) operations=" << operations << "\n";
    std::mt19937_64 rng(seed);
    const Stream streams[] = {kDefaultStream, NewStream(), NewStream()};
    std::vector<Live> live;
    std::uint64_t next_id = 1;
    std::uniform_real_distribution<double> log_size(std::log(512.0), std::log(64.0 * 1024 * 1024));
    int allocations = 0, frees = 0, records = 0, empties = 0;
    for (int op = 0; op < operations; ++op) {
      const int choice = static_cast<int>(rng() % 100);
      if (live.size() < 8 || (choice < 52 && live.size() < 96)) {
        const auto size = static_cast<std::size_t>(std::exp(log_size(rng)));
        const Stream stream = streams[rng() % 3];
        absl::StatusOr<DevicePtr> ptr = allocator_->Allocate(size, stream);
        ASSERT_TRUE(ptr.ok()) << "op " << op << " seed " << seed << ": " << ptr.status();
        const std::uint64_t id = next_id++;
        ASSERT_TRUE(testing::FillPattern(*driver_, *ptr, size, id).ok());
        live.push_back({*ptr, size, id});
        ++allocations;
      } else if (choice < 96) {
        const std::size_t index = rng() % live.size();
        const Live victim = live[index];
        live[index] = live.back();
        live.pop_back();
        absl::Status intact = testing::CheckPattern(*driver_, victim.ptr, victim.size, victim.id);
        ASSERT_TRUE(intact.ok()) << "op " << op << " seed " << seed << ": " << intact;
        ASSERT_TRUE(allocator_->Free(victim.ptr).ok()) << "op " << op << " seed " << seed;
        ++frees;
      } else if (choice < 99) {
        const Live& target = live[rng() % live.size()];
        ASSERT_TRUE(allocator_->RecordStream(target.ptr, streams[rng() % 3]).ok());
        ++records;
      } else {
        ASSERT_TRUE(allocator_->EmptyCache().ok());
        ++empties;
      }
      absl::Status invariants = allocator_->CheckInvariants();
      ASSERT_TRUE(invariants.ok()) << "op " << op << " seed " << seed << ": " << invariants;
    }
    for (const Live& l : live) {
      ASSERT_TRUE(testing::CheckPattern(*driver_, l.ptr, l.size, l.id).ok());
      ASSERT_TRUE(allocator_->Free(l.ptr).ok());
    }
    route.reset();
    pool.reset();
    ASSERT_TRUE(allocator_->EmptyCache().ok());
    ExpectInvariants();
    const DeviceStats s = Stats();
    EXPECT_EQ(s.allocation.all().current, 0);
    EXPECT_EQ(s.active.all().current, 0);
    EXPECT_EQ(s.reserved_bytes.all().current, 0);
    EXPECT_EQ(s.allocation.all().allocated, allocations);
    std::cout << "ops=" << operations << " allocations=" << allocations << " frees=" << frees
              << " record_streams=" << records << " empty_caches=" << empties
              << " peak_reserved=" << s.reserved_bytes.all().peak
              << " peak_allocated=" << s.allocated_bytes.all().peak << "\n";
  }
};

// The default configuration: expandable segments.
TEST_F(AllocatorRandomizedTest, HundredThousandMixedOperationsKeepContentsAndInvariants) {
  Run(Config{}, 20261121, 100000);
}

TEST_F(AllocatorRandomizedTest, RegularSegmentsMixedOperationsKeepContentsAndInvariants) {
  absl::StatusOr<Config> config = Config::Parse("expandable_segments:False");
  ASSERT_TRUE(config.ok());
  Run(*config, 20261122, 50000);
}

TEST_F(AllocatorRandomizedTest, MixedOperationsWithOversizeAndRoundingConfig) {
  absl::StatusOr<Config> config = Config::Parse("max_split_size_mb:40,roundup_power2_divisions:4");
  ASSERT_TRUE(config.ok());
  Run(*config, 7, 20000);
}

TEST_F(AllocatorRandomizedTest, HandleAlignedSegmentsMixedOperationsKeepContentsAndInvariants) {
  absl::StatusOr<Config> config = Config::Parse("handle_aligned:True");
  ASSERT_TRUE(config.ok());
  Run(*config, 20261127, 50000);
}

TEST_F(AllocatorRandomizedTest, HandleAlignedPoolMixedOperationsKeepContentsAndInvariants) {
  PoolOptions options;
  options.handle_aligned = true;
  Run(Config{}, 20261128, 50000, options);
}

}  // namespace
}  // namespace graphalloc

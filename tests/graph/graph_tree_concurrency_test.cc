// The graph tree recording, branching and replaying on one thread while two other threads allocate, fill,
// check and free blocks of the same allocator's default pool on streams of their own and empty its cache,
// for ThreadSanitizer (label `threads`): a recording routes the calling thread's allocations into the
// tree's pool and captures (thread-local mode, so the others may keep allocating), a branch restores its
// parent's checkpoint, a replay pins the pool; each of these takes the allocator's locks while the other
// threads take them on the allocation path. Every step's outputs equal the host reference; the tree ends
// with exactly one recording per function; the other threads' blocks keep their contents. The seed is
// printed; GRAPHALLOC_TEST_SEED replays each thread's choices (the interleaving is the scheduler's).
#include <atomic>
#include <iostream>
#include <random>
#include <thread>
#include <vector>

#include "graphalloc/graph/graph_tree.h"
#include "tests/graph/graph_test_util.h"
#include "tests/testing/device_memory.h"
#include "tests/testing/test_scale.h"

namespace graphalloc::testing {
namespace {

using Outputs = std::vector<TreeOutput>;

class GraphTreeConcurrencyTest : public TreeTest {
 protected:
  // Allocates, fills, checks and frees default-pool blocks on `stream` until `done` or `operations`.
  void Worker(Stream stream, std::uint64_t seed, int operations, const std::atomic<bool>& done) {
    std::mt19937_64 rng(seed);
    std::vector<std::pair<DevicePtr, std::size_t>> live;
    for (int op = 0; op < operations && !done.load(); ++op) {
      const std::uint64_t choice = rng() % 100;
      if (choice < 55 || live.empty()) {
        const std::size_t bytes = std::size_t{512} << (rng() % 13);  // 512 B .. 2 MiB
        ASSERT_OK_AND_ASSIGN(const DevicePtr p, allocator_->Allocate(bytes, stream));
        ASSERT_OK(FillPattern(*driver_, p, bytes, p));
        live.emplace_back(p, bytes);
      } else if (choice < 97) {
        const std::size_t at = rng() % live.size();
        const auto [p, bytes] = live[at];
        ASSERT_OK(CheckPattern(*driver_, p, bytes, p));
        ASSERT_OK(allocator_->Free(p));
        live[at] = live.back();
        live.pop_back();
      } else {
        // Refused while the tree records (a capture is under way), as it must be; fine otherwise.
        const absl::Status emptied = allocator_->EmptyCache();
        ASSERT_TRUE(emptied.ok() || absl::IsFailedPrecondition(emptied)) << emptied;
      }
    }
    for (const auto& [p, bytes] : live) {
      ASSERT_OK(CheckPattern(*driver_, p, bytes, p));
      ASSERT_OK(allocator_->Free(p));
    }
  }
};

TEST_F(GraphTreeConcurrencyTest, BranchingRecordingsAndReplaysWhileOtherThreadsAllocate) {
  const std::uint64_t seed = TestSeed(20261130);
  const int steps = ScaledCount(2000);
  const int operations = ScaledCount(20000);
  std::cout << "GraphTreeConcurrencyTest seed=" << seed << " (GRAPHALLOC_TEST_SEED=" << seed
            << " replays each thread's choices) steps=" << steps << " operations/worker<=" << operations
            << "\n";
  const FunctionId a = Register(Affine(2.0f), "A", {1});
  const FunctionId b = Register(Affine(3.0f), "B", {1});
  const FunctionId c = Register(Affine(5.0f), "C", {1});
  const BufferView x = Upload(Values(1));
  const BufferView wa = Upload(Values(2));
  const BufferView wb = Upload(Values(3));
  const BufferView wc = Upload(Values(4));
  const std::vector<float> a_ref = AffineRef(2.0f, Values(1), Values(2));
  const std::vector<float> b_ref = AffineRef(3.0f, a_ref, Values(3));
  const std::vector<float> c_ref = AffineRef(5.0f, a_ref, Values(4));
  std::vector<Stream> streams(2);
  for (Stream& s : streams) s = NewStream();
  std::atomic<bool> done{false};
  {
    std::vector<std::jthread> workers;
    for (int w = 0; w < 2; ++w) {
      workers.emplace_back([&, w] { Worker(streams[w], seed + 1 + w, operations, done); });
    }
    std::mt19937_64 rng(seed);
    for (int step = 0; step < steps && !HasFatalFailure(); ++step) {
      // B twice, then C twice (so that both are warmed up and recorded), then either at random.
      const bool take_b = step < 2 || (step >= 4 && rng() % 2 == 0);
      ASSERT_OK_AND_ASSIGN(Outputs out_a, tree_->Call(a, {x, wa}, caller_));
      ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(take_b ? b : c, {out_a[0], take_b ? wb : wc}, caller_));
      ASSERT_EQ(Read(out[0]), take_b ? b_ref : c_ref) << "step " << step;
      ASSERT_EQ(Read(out_a[0]), a_ref) << "step " << step;
    }
    done = true;
  }
  const TreeDump dump = tree_->Dump();
  EXPECT_EQ(dump.counters.recordings, 3u);
  EXPECT_EQ(dump.counters.failed_recordings, 0u);
  EXPECT_EQ(dump.counters.eager_runs, 0u);
  ExpectInvariants();
}

}  // namespace
}  // namespace graphalloc::testing

// The end-to-end example (examples/mlp/mlp.h): an MLP with dropout trained for 100 steps through a
// graphed step and eagerly gives bit-identical losses and weights, with one micro-batch per step, with
// accumulated micro-batches, with aliased gradients consumed at once, and with the hidden layer recomputed
// in the backward. Runs on the simulated device and, as *_gpu, on the GPU.
#include <cstring>
#include <iostream>

#include "examples/mlp/mlp.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/status_macros.h"

namespace graphalloc::testing {
namespace {

using mlp::MlpConfig;
using mlp::MlpTrainer;

struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class MlpTrainingTest : public AllocatorFixture {
 protected:
  void SetUp() override {
    GRAPHALLOC_ALLOCATOR_SETUP();
    stream_ = NewStream();
  }

  Trained Train(MlpConfig config, int steps) {
    config.max_steps = static_cast<std::size_t>(steps);
    absl::StatusOr<std::unique_ptr<MlpTrainer>> trainer =
        MlpTrainer::Create(*allocator_, driver_, config, stream_);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (!trainer.ok()) return {};
    for (int s = 0; s < steps; ++s) {
      const absl::Status st = (*trainer)->Step();
      EXPECT_TRUE(st.ok()) << "step " << s << ": " << st;
      if (!st.ok()) return {};
    }
    Trained t;
    absl::StatusOr<std::vector<float>> losses = (*trainer)->Losses();
    EXPECT_TRUE(losses.ok()) << losses.status();
    if (losses.ok()) t.losses = *losses;
    absl::StatusOr<std::vector<std::vector<float>>> params = (*trainer)->Parameters();
    EXPECT_TRUE(params.ok()) << params.status();
    if (params.ok()) t.params = *params;
    EXPECT_EQ((*trainer)->step().pending_forwards(), 0u);
    EXPECT_EQ((*trainer)->step().deferred_releases(), 0u);
    if (config.graphed) {
      const TreeDump d = (*trainer)->step().tree(0)->Dump();
      EXPECT_EQ(d.counters.recordings, 2u) << "one forward and one backward recording";
      EXPECT_EQ(d.counters.eager_runs, 0u);
      // Every call after the lane's first two steps (warmup, recording) is a replay.
      EXPECT_EQ(d.counters.replays, 2u * static_cast<std::uint64_t>(steps * config.micro_batches - 2));
    }
    return t;
  }

  // Trains graphed and eagerly with `config` and compares the two bit for bit.
  void ExpectGraphedEqualsEager(MlpConfig config, int steps) {
    std::cout << "seed " << config.seed << ", " << steps << " steps of " << config.micro_batches
              << " micro-batch(es), recompute " << config.recompute << ", alias " << config.alias_gradients
              << "\n";
    config.graphed = true;
    const Trained graphed = Train(config, steps);
    config.graphed = false;
    const Trained eager = Train(config, steps);
    ASSERT_EQ(graphed.losses.size(), static_cast<std::size_t>(steps * config.micro_batches));
    ASSERT_EQ(eager.losses.size(), graphed.losses.size());
    for (std::size_t i = 0; i < graphed.losses.size(); ++i) {
      ASSERT_TRUE(SameBits({graphed.losses[i]}, {eager.losses[i]}))
          << "micro-batch " << i << ": graphed " << graphed.losses[i] << ", eager " << eager.losses[i];
    }
    ASSERT_EQ(graphed.params.size(), 4u);
    for (std::size_t p = 0; p < 4; ++p)
      EXPECT_TRUE(SameBits(graphed.params[p], eager.params[p])) << "parameter " << p;
    // It learns: over one pass of the 8 data batches, the last losses average under 3/4 of the first.
    const std::size_t n = graphed.losses.size();
    float first = 0, last = 0;
    for (std::size_t i = 0; i < 8; ++i) {
      first += graphed.losses[i];
      last += graphed.losses[n - 1 - i];
    }
    EXPECT_LT(last, 0.75f * first);
    ExpectInvariants();
  }

  Stream stream_ = kDefaultStream;
};

TEST_F(MlpTrainingTest, HundredGraphedStepsGiveTheEagerLossesAndWeightsBitForBit) {
  ExpectGraphedEqualsEager(MlpConfig{}, 100);
}

TEST_F(MlpTrainingTest, AccumulatedMicroBatchesMatchEagerBitForBit) {
  MlpConfig config;
  config.micro_batches = 3;
  config.seed = 7;
  ExpectGraphedEqualsEager(config, 40);
}

TEST_F(MlpTrainingTest, AliasedGradientsConsumedAtOnceMatchEagerBitForBit) {
  MlpConfig config;
  config.micro_batches = 2;
  config.alias_gradients = true;
  config.seed = 8;
  ExpectGraphedEqualsEager(config, 40);
}

TEST_F(MlpTrainingTest, RecomputingTheHiddenLayerMatchesEagerBitForBit) {
  MlpConfig config;
  config.recompute = true;
  config.seed = 9;
  ExpectGraphedEqualsEager(config, 60);
}

TEST_F(MlpTrainingTest, RecomputingTheHiddenLayerGivesTheLossesOfSavingIt) {
  // Activation checkpointing changes memory, not numbers: same masks, same arithmetic.
  MlpConfig config;
  config.seed = 10;
  config.graphed = true;
  const Trained saved = Train(config, 30);
  config.recompute = true;
  const Trained recomputed = Train(config, 30);
  EXPECT_TRUE(SameBits(saved.losses, recomputed.losses));
  for (std::size_t p = 0; p < saved.params.size(); ++p)
    EXPECT_TRUE(SameBits(saved.params[p], recomputed.params[p]));
}

}  // namespace
}  // namespace graphalloc::testing

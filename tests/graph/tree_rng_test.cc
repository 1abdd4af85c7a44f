// Functions that draw random numbers, through the graph tree (issue 8's integration item): warmups,
// recordings, replays, re-records and the eager fallback together draw exactly what the same sequence of
// eager calls draws from a generator with the same seed, also with eager draws interleaved and with two
// functions sharing one generator. Runs on the simulated device and, as *_gpu, on the GPU.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "graphalloc/graph/graph_tree.h"
#include "graphalloc/rng/generator.h"
#include "graphalloc/rng/random_ops.h"
#include "tests/graph/graph_test_util.h"

namespace graphalloc::testing {
namespace {

using Outputs = std::vector<TreeOutput>;

constexpr float kDropP = 0.3f;

class TreeRngTest : public TreeTest {
 protected:
  // (x) -> (dropout(x), uniform noise): two reservations from `gen` per call.
  TreeFunction Noisy(Generator& gen) {
    return [this, &gen](std::span<const BufferView> in, Stream s) -> absl::StatusOr<std::vector<BufferView>> {
      if (fail_next_) {
        fail_next_ = false;
        return absl::AbortedError("injected failure of the random function");
      }
      const std::size_t n = in[0].bytes / sizeof(float);
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr y, allocator_->Allocate(in[0].bytes, s));
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr u, allocator_->Allocate(in[0].bytes, s));
      GRAPHALLOC_ASSIGN_OR_RETURN(const PhiloxArgs drop, gen.Reserve(PhiloxIncrement(n)));
      GRAPHALLOC_RETURN_IF_ERROR(DropoutForward(*driver_, s, in[0].ptr, y, n, DType::kFloat32, kDropP, drop));
      GRAPHALLOC_ASSIGN_OR_RETURN(const PhiloxArgs fill, gen.Reserve(PhiloxIncrement(n)));
      GRAPHALLOC_RETURN_IF_ERROR(FillUniform(*driver_, s, u, n, DType::kFloat32, fill));
      return std::vector<BufferView>{{y, in[0].bytes}, {u, in[0].bytes}};
    };
  }
  // (x, w) -> normal noise + w (w static): one reservation per call.
  TreeFunction NormalPlus(Generator& gen) {
    return [this, &gen](std::span<const BufferView> in, Stream s) -> absl::StatusOr<std::vector<BufferView>> {
      const std::size_t n = in[0].bytes / sizeof(float);
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr z, allocator_->Allocate(in[0].bytes, s));
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr y, allocator_->Allocate(in[0].bytes, s));
      GRAPHALLOC_ASSIGN_OR_RETURN(const PhiloxArgs args, gen.Reserve(PhiloxIncrement(n)));
      GRAPHALLOC_RETURN_IF_ERROR(FillNormal(*driver_, s, z, n, DType::kFloat32, args));
      GRAPHALLOC_RETURN_IF_ERROR(AddF32(*driver_, s, y, z, in[1].ptr, n));
      GRAPHALLOC_RETURN_IF_ERROR(allocator_->Free(z));
      return std::vector<BufferView>{{y, in[0].bytes}};
    };
  }

  FunctionId Register(TreeFunction f, std::string name, Generator& gen,
                      std::vector<std::size_t> statics = {}) {
    absl::StatusOr<FunctionId> id = tree_->Register(
        std::move(f),
        FunctionOptions{.name = std::move(name), .static_inputs = std::move(statics), .generators = {&gen}});
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }

  // One eager uniform fill straight from `gen` (no tree): the draws user code makes between tree calls.
  std::vector<float> EagerUniform(Generator& gen) {
    absl::StatusOr<PhiloxArgs> args = gen.Reserve(PhiloxIncrement(kN));
    EXPECT_TRUE(args.ok()) << args.status();
    absl::StatusOr<DevicePtr> p = allocator_->Allocate(kBytes, caller_);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(FillUniform(*driver_, caller_, *p, kN, DType::kFloat32, *args).ok());
    std::vector<float> values = Download(*p);
    EXPECT_TRUE(allocator_->Free(*p).ok());
    return values;
  }

  bool fail_next_ = false;
};

constexpr std::uint64_t kSeed = 20261121;

TEST_F(TreeRngTest, ReplaysOfARandomFunctionDrawWhatTheSameEagerCallsDraw) {
  std::cout << "seed " << kSeed << "\n";
  Generator graphed(driver_, kSeed);
  Generator eager(driver_, kSeed);
  const FunctionId f = Register(Noisy(graphed), "noisy", graphed);
  const BufferView x = Upload(Values(1));
  std::vector<float> previous_noise;
  for (int call = 0; call < 6; ++call) {  // warmup, recording, four replays
    const std::vector<std::vector<float>> want = RunEagerly(Noisy(eager), {x});
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {x}, caller_));
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(Read(out[0]), want[0]) << "dropout of call " << call;
    EXPECT_EQ(Read(out[1]), want[1]) << "noise of call " << call;
    EXPECT_NE(Read(out[1]), previous_noise) << "call " << call << " drew the numbers of the call before it";
    previous_noise = Read(out[1]);
    EXPECT_EQ(graphed.host_offset(), eager.host_offset()) << "after call " << call;
  }
  EXPECT_EQ(graphed.host_offset(), 6 * 2 * PhiloxIncrement(kN));
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.recordings, 1u);
  EXPECT_EQ(d.counters.replays, 4u);
}

TEST_F(TreeRngTest, InterleavedEagerDrawsAndTwoFunctionsSharingAGeneratorMatchTheEagerSequence) {
  std::cout << "seed " << kSeed + 1 << "\n";
  Generator graphed(driver_, kSeed + 1);
  Generator eager(driver_, kSeed + 1);
  const FunctionId f = Register(Noisy(graphed), "noisy", graphed);
  const FunctionId g = Register(NormalPlus(graphed), "normal_plus", graphed, {1});
  const BufferView x = Upload(Values(3));
  const BufferView w = Upload(Values(4));
  for (int step = 0; step < 5; ++step) {
    // Per step: f through the tree, an eager draw from the same generator, g through the tree (a child of f).
    const std::vector<std::vector<float>> want_f = RunEagerly(Noisy(eager), {x});
    const std::vector<float> want_between = EagerUniform(eager);
    const std::vector<std::vector<float>> want_g = RunEagerly(NormalPlus(eager), {x, w});

    ASSERT_OK_AND_ASSIGN(Outputs out_f, tree_->Call(f, {x}, caller_));
    const std::vector<float> between = EagerUniform(graphed);
    ASSERT_OK_AND_ASSIGN(Outputs out_g, tree_->Call(g, {out_f[0], w}, caller_));
    EXPECT_EQ(Read(out_f[0]), want_f[0]) << "step " << step;
    EXPECT_EQ(Read(out_f[1]), want_f[1]) << "step " << step;
    EXPECT_EQ(between, want_between) << "step " << step;
    EXPECT_EQ(Read(out_g[0]), want_g[0]) << "step " << step;
    EXPECT_EQ(graphed.host_offset(), eager.host_offset()) << "step " << step;
  }
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.recordings, 2u);
  EXPECT_EQ(d.counters.replays, 6u);  // steps 2, 3, 4 replay both
}

TEST_F(TreeRngTest, ReRecordsAndTheEagerFallbackKeepTheEagerSequence) {
  TreeOptions options = CapturingOptions();
  options.max_recordings = 1;
  tree_ = MakeTree(options);
  Generator graphed(driver_, kSeed + 2);
  Generator eager(driver_, kSeed + 2);
  const FunctionId g = Register(NormalPlus(graphed), "normal_plus", graphed, {1});
  const BufferView x = Upload(Values(5));
  std::vector<BufferView> w;
  for (int i = 0; i < 3; ++i) w.push_back(Upload(Values(6 + i)));
  // warmup, record (w0), replay, re-record (w1), replay, eager fallback (w2), w0 eager too from then on.
  const int sequence[] = {0, 0, 0, 1, 1, 2, 0};
  for (int k : sequence) {
    const std::vector<std::vector<float>> want = RunEagerly(NormalPlus(eager), {x, w[k]});
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(g, {x, w[k]}, caller_));
    EXPECT_EQ(Read(out[0]), want[0]) << "w" << k;
    EXPECT_EQ(graphed.host_offset(), eager.host_offset());
  }
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.recordings, 2u);
  EXPECT_EQ(d.counters.eager_runs, 2u);
  EXPECT_EQ(warnings_.size(), 1u);
}

TEST_F(TreeRngTest, AFailedRecordingLeavesTheGeneratorOutOfCaptureAndItsOffsetUnchanged) {
  Generator graphed(driver_, kSeed + 3);
  Generator eager(driver_, kSeed + 3);
  const FunctionId f = Register(Noisy(graphed), "noisy", graphed);
  const BufferView x = Upload(Values(7));
  (void)RunEagerly(Noisy(eager), {x});
  ASSERT_TRUE(tree_->Call(f, {x}, caller_).ok());  // warmup
  const std::uint64_t before = graphed.host_offset();
  fail_next_ = true;
  const absl::StatusOr<Outputs> failed = tree_->Call(f, {x}, caller_);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("injected failure"), std::string::npos) << failed.status();
  EXPECT_FALSE(graphed.capturing());
  EXPECT_EQ(graphed.host_offset(), before);
  for (int call = 0; call < 3; ++call) {  // the recording, then replays: still the eager sequence
    const std::vector<std::vector<float>> want = RunEagerly(Noisy(eager), {x});
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {x}, caller_));
    EXPECT_EQ(Read(out[0]), want[0]) << "call " << call;
    EXPECT_EQ(Read(out[1]), want[1]) << "call " << call;
  }
}

TEST_F(TreeRngTest, DrawingFromAGeneratorNotRegisteredWithTheRecordingIsAnErrorNamingBoth) {
  Generator unlisted(driver_, kSeed + 4);
  Generator eager(driver_, kSeed + 4);
  absl::StatusOr<FunctionId> f =
      tree_->Register(NormalPlus(unlisted), FunctionOptions{.name = "sneaky", .static_inputs = {1}});
  ASSERT_TRUE(f.ok()) << f.status();
  const BufferView x = Upload(Values(8));
  const BufferView w = Upload(Values(9));
  // The warmup is eager: it draws what an eager call draws.
  const std::vector<std::vector<float>> want = RunEagerly(NormalPlus(eager), {x, w});
  ASSERT_OK_AND_ASSIGN(Outputs warm, tree_->Call(*f, {x, w}, caller_));
  EXPECT_EQ(Read(warm[0]), want[0]);
  // The recording would bake the generator's (seed, offset) into the graph: refused, nothing drawn.
  const std::uint64_t before = unlisted.host_offset();
  const absl::StatusOr<Outputs> recorded = tree_->Call(*f, {x, w}, caller_);
  ASSERT_FALSE(recorded.ok());
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(recorded.status().message());
  EXPECT_NE(message.find(absl::StrFormat("generator %d", unlisted.id())), std::string::npos) << message;
  EXPECT_NE(message.find("'sneaky'"), std::string::npos) << message;
  EXPECT_NE(message.find("FunctionOptions::generators"), std::string::npos) << message;
  EXPECT_EQ(unlisted.host_offset(), before);
  EXPECT_EQ(tree_->Dump().counters.recordings, 0u);
  // Outside captures the generator draws as before.
  EXPECT_TRUE(unlisted.Reserve(4).ok());
}

TEST_F(TreeRngTest, RegisteringANullGeneratorIsRejected) {
  FunctionOptions options;
  options.name = "affine";
  options.generators = {nullptr};
  absl::StatusOr<FunctionId> id = tree_->Register(Affine(1.0f), std::move(options));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("generator 0 is null"), std::string::npos) << id.status();
}

}  // namespace
}  // namespace graphalloc::testing

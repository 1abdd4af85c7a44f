// Generator: reservations, value snapshots, seeding rules, and graph safety through a real stream capture
// (BeginCapture / EndCapture / GraphInstantiate / GraphLaunch on the selected device): replays draw exactly
// what the same sequence of eager calls draws.
#include "graphalloc/rng/generator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "graphalloc/rng/random_ops.h"
#include "tests/rng/rng_test_util.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using rng_test::DeviceBuffer;

constexpr std::size_t kN = 3000;  // elements per fill: 12 blocks, one curand4 per thread

TEST(GeneratorTest, ReserveRoundsUpToMultiplesOfFour) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  Generator gen(driver, 11);
  auto a = gen.Reserve(1);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->captured);
  EXPECT_EQ(a->seed, 11u);
  EXPECT_EQ(a->offset, 0u);
  auto b = gen.Reserve(5);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->offset, 4u);
  auto c = gen.Reserve(0);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->offset, 12u);
  EXPECT_EQ(gen.host_offset(), 12u);
  EXPECT_EQ(gen.Reserve(~std::uint64_t{0}).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(GeneratorTest, SaveStateIsAValueThatRestoresExactly) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  Generator gen(driver, 123);
  ASSERT_TRUE(gen.Reserve(8).ok());
  const GeneratorState saved = gen.SaveState();
  EXPECT_EQ(saved, (GeneratorState{123, 8, 0}));
  auto first = gen.Reserve(10);
  ASSERT_TRUE(gen.Reserve(40).ok());
  // The snapshot did not move with the generator (the reference-vs-snapshot trap).
  EXPECT_EQ(saved, (GeneratorState{123, 8, 0}));
  EXPECT_EQ(gen.host_offset(), 60u);
  ASSERT_TRUE(gen.RestoreState(saved).ok());
  auto again = gen.Reserve(10);
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(again->seed, first->seed);
  EXPECT_EQ(again->offset, first->offset);
  EXPECT_EQ(gen.RestoreState(GeneratorState{1, 6, 0}).code(), absl::StatusCode::kInvalidArgument);
  // A state relative to a capture that is not active cannot be restored.
  absl::Status s = gen.RestoreState(GeneratorState{123, 4, 99});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("relative to capture 99, which is not active"), std::string::npos) << s;
}

TEST(GeneratorTest, ManualSeedResetsOffsetAndIsRejectedDuringCaptureUnlessSameSeed) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  Generator gen(driver, 5);
  ASSERT_TRUE(gen.Reserve(16).ok());
  ASSERT_TRUE(gen.ManualSeed(6).ok());
  EXPECT_EQ(gen.SaveState(), (GeneratorState{6, 0, 0}));
  ASSERT_TRUE(gen.Reserve(16).ok());
  ASSERT_TRUE(gen.BeginCapture(1).ok());
  absl::Status s = gen.ManualSeed(7);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("can only be set to the current seed 6 while capturing"), std::string::npos)
      << s;
  EXPECT_TRUE(gen.ManualSeed(6).ok());  // same seed: accepted, and the offset is not reset
  ASSERT_TRUE(gen.CancelCapture().ok());
  EXPECT_EQ(gen.SaveState(), (GeneratorState{6, 16, 0}));
}

TEST(GeneratorTest, CaptureProtocolErrors) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  Generator gen(driver, 1), other(driver, 1);
  EXPECT_EQ(gen.BeginCapture(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gen.EndCapture().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(gen.BeginCapture(3).ok());
  EXPECT_EQ(gen.BeginCapture(4).code(), absl::StatusCode::kFailedPrecondition);
  auto args = gen.Reserve(4);
  ASSERT_TRUE(args.ok());
  EXPECT_TRUE(args->captured);
  EXPECT_EQ(args->intragraph_offset, 0u);
  // An eager state cannot be restored inside a capture (it would be frozen into the graph).
  absl::Status s = gen.RestoreState(GeneratorState{1, 0, 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("saved outside any capture"), std::string::npos) << s;
  auto captured = gen.EndCapture();
  ASSERT_TRUE(captured.ok());
  EXPECT_EQ(captured->increment, 4u);
  s = other.PrepareReplay(*captured, kDefaultStream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("belongs to generator"), std::string::npos) << s;
}

// A graph of `fills` FillBits of kN elements each into consecutive slices of `out`.
struct GraphedFills {
  GraphExec exec{};
  CapturedRng rng;
};

absl::StatusOr<GraphedFills> CaptureFills(Driver& driver, Generator& gen, Stream stream, DevicePtr out,
                                          int fills, std::uint64_t capture_id, bool normal = false) {
  if (absl::Status s = gen.BeginCapture(capture_id); !s.ok()) return s;
  if (absl::Status s = driver.BeginCapture(stream, CaptureMode::kGlobal); !s.ok()) return s;
  for (int i = 0; i < fills; ++i) {
    absl::StatusOr<PhiloxArgs> args = gen.Reserve(PhiloxIncrement(kN));
    if (!args.ok()) return args.status();
    const DevicePtr slice = out + static_cast<DevicePtr>(i) * kN * 4;
    absl::Status s = normal ? FillNormal(driver, stream, slice, kN, DType::kFloat32, *args)
                            : FillBits(driver, stream, slice, kN, *args);
    if (!s.ok()) return s;
  }
  absl::StatusOr<Graph> graph = driver.EndCapture(stream);
  if (!graph.ok()) return graph.status();
  absl::StatusOr<CapturedRng> rng = gen.EndCapture();
  if (!rng.ok()) return rng.status();
  absl::StatusOr<GraphExec> exec = driver.GraphInstantiate(*graph);
  if (!exec.ok()) return exec.status();
  if (absl::Status s = driver.GraphDestroy(*graph); !s.ok()) return s;
  return GraphedFills{*exec, *std::move(rng)};
}

absl::Status Replay(Driver& driver, Generator& gen, const GraphedFills& g, Stream stream) {
  if (absl::Status s = gen.PrepareReplay(g.rng, stream); !s.ok()) return s;
  if (absl::Status s = driver.GraphLaunch(g.exec, stream); !s.ok()) return s;
  return driver.StreamSynchronize(stream);
}

// The eager twin: the same fills from a reference generator, read back.
std::vector<std::uint32_t> EagerFills(Driver& driver, Generator& ref, int fills, bool normal = false) {
  DeviceBuffer buf(driver, static_cast<std::size_t>(fills) * kN * 4);
  for (int i = 0; i < fills; ++i) {
    auto args = ref.Reserve(PhiloxIncrement(kN));
    EXPECT_TRUE(args.ok());
    const DevicePtr slice = buf.get() + static_cast<DevicePtr>(i) * kN * 4;
    EXPECT_TRUE((normal ? FillNormal(driver, kDefaultStream, slice, kN, DType::kFloat32, *args)
                        : FillBits(driver, kDefaultStream, slice, kN, *args))
                    .ok());
  }
  EXPECT_TRUE(driver.StreamSynchronize(kDefaultStream).ok());
  return buf.Read<std::uint32_t>();
}

TEST(GeneratorGraphTest, ReplaysEqualEagerIncludingInterleavedEagerCalls) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  auto stream = driver->StreamCreate();
  ASSERT_TRUE(stream.ok()) << stream.status();
  Generator gen(driver, 2024), ref(driver, 2024);
  DeviceBuffer graph_out(*driver, 2 * kN * 4), eager_out(*driver, kN * 4);
  ASSERT_TRUE(gen.Reserve(4).ok());  // start from a non-zero offset
  ASSERT_TRUE(ref.Reserve(4).ok());
  const std::uint64_t before = gen.host_offset();
  auto g = CaptureFills(*driver, gen, *stream, graph_out.get(), 2, /*capture_id=*/1);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(gen.host_offset(), before) << "a capture must not move the host offset";
  EXPECT_EQ(g->rng.increment, 2 * PhiloxIncrement(kN));

  std::vector<std::uint32_t> previous;
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(Replay(*driver, gen, *g, *stream).ok());
    const std::vector<std::uint32_t> replayed = graph_out.Read<std::uint32_t>();
    EXPECT_EQ(replayed, EagerFills(*driver, ref, 2)) << "replay " << round;
    EXPECT_NE(replayed, previous) << "replay " << round << " repeated the previous replay's numbers";
    previous = replayed;
    // An eager call between replays, on the same generator.
    auto args = gen.Reserve(PhiloxIncrement(kN));
    ASSERT_TRUE(args.ok());
    ASSERT_TRUE(FillBits(*driver, kDefaultStream, eager_out.get(), kN, *args).ok());
    ASSERT_TRUE(driver->StreamSynchronize(kDefaultStream).ok());
    EXPECT_EQ(eager_out.Read<std::uint32_t>(), EagerFills(*driver, ref, 1))
        << "eager call after replay " << round;
  }
  EXPECT_EQ(gen.SaveState(), ref.SaveState());
  ASSERT_TRUE(driver->GraphExecDestroy(g->exec).ok());
  ASSERT_TRUE(driver->StreamDestroy(*stream).ok());
}

TEST(GeneratorGraphTest, TwoGraphsSharingAGeneratorReplayInOrder) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  auto stream = driver->StreamCreate();
  ASSERT_TRUE(stream.ok()) << stream.status();
  Generator gen(driver, 99), ref(driver, 99);
  DeviceBuffer out1(*driver, kN * 4), out2(*driver, 3 * kN * 4);
  auto g1 = CaptureFills(*driver, gen, *stream, out1.get(), 1, 1, /*normal=*/true);
  ASSERT_TRUE(g1.ok()) << g1.status();
  auto g2 = CaptureFills(*driver, gen, *stream, out2.get(), 3, 2);
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_NE(g1->rng.slots, g2->rng.slots) << "each capture has its own slots";
  EXPECT_EQ(gen.host_offset(), 0u);
  // g1 g2 g1 g2 == eager normal, bits x3, normal, bits x3.
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(Replay(*driver, gen, *g1, *stream).ok());
    EXPECT_EQ(out1.Read<std::uint32_t>(), EagerFills(*driver, ref, 1, /*normal=*/true))
        << "g1 round " << round;
    ASSERT_TRUE(Replay(*driver, gen, *g2, *stream).ok());
    EXPECT_EQ(out2.Read<std::uint32_t>(), EagerFills(*driver, ref, 3)) << "g2 round " << round;
  }
  // Reseeding after capture changes what replays draw (the seed is read from the slot, not baked in).
  ASSERT_TRUE(gen.ManualSeed(5).ok());
  ASSERT_TRUE(ref.ManualSeed(5).ok());
  ASSERT_TRUE(Replay(*driver, gen, *g2, *stream).ok());
  EXPECT_EQ(out2.Read<std::uint32_t>(), EagerFills(*driver, ref, 3));
  EXPECT_EQ(gen.SaveState(), ref.SaveState());
  ASSERT_TRUE(driver->GraphExecDestroy(g1->exec).ok());
  ASSERT_TRUE(driver->GraphExecDestroy(g2->exec).ok());
  ASSERT_TRUE(driver->StreamDestroy(*stream).ok());
}

TEST(GeneratorGraphTest, CaptureRelativeSnapshotReproducesDropoutInsideTheGraph) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  auto stream = driver->StreamCreate();
  ASSERT_TRUE(stream.ok()) << stream.status();
  Generator gen(driver, 31);
  DeviceBuffer in(*driver, kN * 4), out1(*driver, kN * 4), out2(*driver, kN * 4);
  in.Write(std::vector<float>(kN, 1.0f));
  ASSERT_TRUE(gen.BeginCapture(8).ok());
  ASSERT_TRUE(driver->BeginCapture(*stream, CaptureMode::kGlobal).ok());
  const GeneratorState at_start = gen.SaveState();
  EXPECT_EQ(at_start, (GeneratorState{31, 0, 8}));
  auto a1 = gen.Reserve(PhiloxIncrement(kN));
  ASSERT_TRUE(a1.ok());
  ASSERT_TRUE(DropoutForward(*driver, *stream, in.get(), out1.get(), kN, DType::kFloat32, 0.5f, *a1).ok());
  ASSERT_TRUE(gen.RestoreState(at_start).ok());  // recomputation: rewind the intra-graph offset
  auto a2 = gen.Reserve(PhiloxIncrement(kN));
  ASSERT_TRUE(a2.ok());
  ASSERT_TRUE(DropoutForward(*driver, *stream, in.get(), out2.get(), kN, DType::kFloat32, 0.5f, *a2).ok());
  auto graph = driver->EndCapture(*stream);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto rng = gen.EndCapture();
  ASSERT_TRUE(rng.ok());
  EXPECT_EQ(rng->increment, PhiloxIncrement(kN));
  auto exec = driver->GraphInstantiate(*graph);
  ASSERT_TRUE(exec.ok());
  std::vector<float> previous;
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(gen.PrepareReplay(*rng, *stream).ok());
    ASSERT_TRUE(driver->GraphLaunch(*exec, *stream).ok());
    ASSERT_TRUE(driver->StreamSynchronize(*stream).ok());
    const std::vector<float> m1 = out1.Read<float>(), m2 = out2.Read<float>();
    EXPECT_EQ(m1, m2) << "round " << round;
    EXPECT_NE(m1, previous) << "round " << round;
    previous = m1;
  }
  ASSERT_TRUE(driver->GraphExecDestroy(*exec).ok());
  ASSERT_TRUE(driver->GraphDestroy(*graph).ok());
  ASSERT_TRUE(driver->StreamDestroy(*stream).ok());
}

TEST(GeneratorGraphTest, PrepareReplayOnACapturingStreamIsRejected) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  auto stream = driver->StreamCreate();
  ASSERT_TRUE(stream.ok());
  Generator gen(driver, 1);
  ASSERT_TRUE(gen.BeginCapture(1).ok());
  ASSERT_TRUE(gen.Reserve(4).ok());
  auto rng = gen.EndCapture();
  ASSERT_TRUE(rng.ok());
  ASSERT_TRUE(driver->BeginCapture(*stream, CaptureMode::kGlobal).ok());
  absl::Status s = gen.PrepareReplay(*rng, *stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("the stream is capturing"), std::string::npos) << s;
  EXPECT_EQ(gen.host_offset(), 0u);
  auto graph = driver->EndCapture(*stream);
  ASSERT_TRUE(graph.ok());
  ASSERT_TRUE(driver->GraphDestroy(*graph).ok());
  ASSERT_TRUE(driver->StreamDestroy(*stream).ok());
}

TEST(GeneratorGraphTest, SlotsLiveAsLongAsTheCapturedRngAndRngFreeGraphsHoldNone) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  SimDriver* sim = testing::AsSim(driver.get());
  if (sim == nullptr) GTEST_SKIP() << "allocation counters exist on the simulated device only";
  const std::size_t base = sim->Counters().allocations;
  Generator gen(driver, 1);
  ASSERT_TRUE(gen.BeginCapture(1).ok());
  EXPECT_EQ(sim->Counters().allocations, base + 1);
  auto empty = gen.EndCapture();
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->increment, 0u);
  EXPECT_EQ(empty->slots, nullptr);
  EXPECT_EQ(sim->Counters().allocations, base);
  EXPECT_TRUE(gen.PrepareReplay(*empty, kDefaultStream).ok());
  EXPECT_EQ(gen.host_offset(), 0u);

  ASSERT_TRUE(gen.BeginCapture(2).ok());
  ASSERT_TRUE(gen.Reserve(4).ok());
  auto rng = gen.EndCapture();
  ASSERT_TRUE(rng.ok());
  std::shared_ptr<const RngSlots> keep = rng->slots;
  rng->slots.reset();
  EXPECT_EQ(sim->Counters().allocations, base + 1) << "a copy still holds the slots";
  keep.reset();
  EXPECT_EQ(sim->Counters().allocations, base);
}

}  // namespace
}  // namespace graphalloc

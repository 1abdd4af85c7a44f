// The graph tree recorder, end to end, on the selected device (the simulated one, or the GPU as *_gpu):
// every output is compared with what the function computes eagerly.
#include "graphalloc/graph/graph_tree.h"

#include <iostream>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "tests/graph/graph_test_util.h"
#include "tests/testing/test_scale.h"

namespace graphalloc::testing {
namespace {

using Outputs = std::vector<TreeOutput>;

bool Contains(absl::string_view text, absl::string_view part) { return absl::StrContains(text, part); }

using GraphTreeTest = TreeTest;

TEST_F(GraphTreeTest, WarmupThenRecordThenReplayGiveTheEagerOutputs) {
  const FunctionId f = Register(Affine(2.0f), "affine", {1});
  const BufferView x = Upload(Values(1));
  const BufferView w = Upload(Values(2));
  const std::vector<std::vector<float>> eager = RunEagerly(Affine(2.0f), {x, w});
  ASSERT_EQ(eager.size(), 1u);
  ASSERT_EQ(eager[0], AffineRef(2.0f, Values(1), Values(2)));
  for (int call = 0; call < 5; ++call) {
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {x, w}, caller_));
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].kind(), OutputKind::kPool);
    EXPECT_EQ(Read(out[0]), eager[0]) << "call " << call;
  }
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.warmup_runs, 1u);
  EXPECT_EQ(d.counters.recordings, 1u);
  EXPECT_EQ(d.counters.replays, 3u);
  ASSERT_EQ(d.nodes.size(), 1u);
  EXPECT_EQ(d.nodes[0].replays, 3u);
  EXPECT_EQ(d.step, 5u);  // each call of the root function began a step
  ExpectInvariants();
}

TEST_F(GraphTreeTest, ReplayReadsTheCurrentValuesOfCopiedInputs) {
  const FunctionId f = Register(Affine(2.0f), "affine", {1});
  const BufferView w = Upload(Values(2));
  const BufferView x = Upload(Values(1));
  for (int call = 0; call < 6; ++call) {
    // A new buffer every other call, new values every call: copied inputs are neither keyed nor baked in.
    const BufferView in = call % 2 == 0 ? Upload(Values(10 + call)) : x;
    if (call % 2 == 1) Overwrite(x.ptr, Values(10 + call));
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {in, w}, caller_));
    EXPECT_EQ(Read(out[0]), AffineRef(2.0f, Values(10 + call), Values(2))) << "call " << call;
  }
  EXPECT_EQ(tree_->Dump().counters.recordings, 1u);
  EXPECT_EQ(tree_->Dump().counters.replays, 4u);
}

TEST_F(GraphTreeTest, ChangingAStaticInputsAddressReRecordsAndGivesTheNewResult) {
  const FunctionId f = Register(Affine(2.0f), "affine", {1});
  const BufferView x = Upload(Values(1));
  const BufferView w0 = Upload(Values(2));
  const BufferView w1 = Upload(Values(3));
  for (int call = 0; call < 2; ++call) ASSERT_TRUE(tree_->Call(f, {x, w0}, caller_).ok());
  for (int call = 0; call < 3; ++call) {
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {x, w1}, caller_));
    EXPECT_EQ(Read(out[0]), AffineRef(2.0f, Values(1), Values(3))) << "call " << call;
  }
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.recordings, 2u);
  EXPECT_EQ(d.counters.replays, 2u);
  const TreeDumpSite* site = Site(d, 0, f);
  ASSERT_NE(site, nullptr);
  EXPECT_EQ(site->rerecords, 1);
  EXPECT_EQ(site->reasons[static_cast<int>(RerecordReason::kStaticAddress)], 1);
  ASSERT_EQ(d.nodes.size(), 2u);
  EXPECT_EQ(d.nodes[1].reason, RerecordReason::kStaticAddress);
  EXPECT_EQ(d.nodes[1].reason_detail,
            absl::StrFormat("static input 1 changed address from 0x%x to 0x%x", w0.ptr, w1.ptr));
  EXPECT_EQ(d.nodes[1].inputs[1], (KeyInput{InputRole::kStatic, w1.ptr, kBytes}));
  EXPECT_EQ(d.nodes[1].inputs[0], (KeyInput{InputRole::kCopied, 0, kBytes}));
}

TEST_F(GraphTreeTest, ReRecordLimitFallsBackToEagerWithExactlyOneWarningNamingTheInput) {
  TreeOptions options = CapturingOptions();
  options.max_recordings = 2;
  tree_ = MakeTree(options);
  const FunctionId f = Register(Affine(2.0f), "affine", {1});
  const BufferView x = Upload(Values(1));
  std::vector<BufferView> w;
  for (int i = 0; i < 5; ++i) w.push_back(Upload(Values(20 + i)));
  // warmup, record, re-record, re-record, then the limit: w3, w4 and even w0 (recorded) run eagerly.
  const int sequence[] = {0, 0, 1, 2, 3, 4, 0, 3};
  Outputs last;
  for (int k : sequence) {
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {x, w[k]}, caller_));
    EXPECT_EQ(Read(out[0]), AffineRef(2.0f, Values(1), Values(20 + k))) << "w" << k;
    last = out;
  }
  ASSERT_EQ(warnings_.size(), 1u);
  const std::string& warning = warnings_[0];
  EXPECT_TRUE(Contains(warning, "'affine'")) << warning;
  EXPECT_TRUE(Contains(
      warning, absl::StrFormat("static input 1 changed address from 0x%x to 0x%x", w[2].ptr, w[3].ptr)))
      << warning;
  EXPECT_TRUE(Contains(warning, "max_recordings = 2")) << warning;
  const TreeDump d = tree_->Dump();
  const TreeDumpSite* site = Site(d, 0, f);
  ASSERT_NE(site, nullptr);
  EXPECT_TRUE(site->eager);
  EXPECT_EQ(site->eager_calls, 4u);
  EXPECT_EQ(site->recordings, 3u);
  EXPECT_EQ(site->rerecords, 2);
  EXPECT_EQ(site->eager_warning, warning);
  EXPECT_EQ(d.counters.eager_runs, 4u);
  // Eager outputs belong to the caller: a new step does not overwrite them.
  EXPECT_EQ(last[0].kind(), OutputKind::kOwned);
  tree_->BeginStep();
  EXPECT_EQ(Read(last[0]), AffineRef(2.0f, Values(1), Values(23)));
}

TEST_F(GraphTreeTest, AlternatingStaticAddressesFindTheirRecordingsAgainWithoutReRecording) {
  const FunctionId f = Register(Affine(2.0f), "affine", {1});
  const BufferView x = Upload(Values(1));
  const BufferView w[] = {Upload(Values(2)), Upload(Values(3))};
  for (int call = 0; call < 13; ++call) {
    const int k = call == 0 ? 0 : (call - 1) % 2;  // warmup on w0, then w0, w1, w0, w1, ...
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {x, w[k]}, caller_));
    EXPECT_EQ(Read(out[0]), AffineRef(2.0f, Values(1), Values(2 + k))) << "call " << call;
  }
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.recordings, 2u);
  EXPECT_EQ(d.counters.replays, 10u);
  const TreeDumpSite* site = Site(d, 0, f);
  ASSERT_NE(site, nullptr);
  EXPECT_EQ(site->rerecords, 1);
  // The re-record updated w0's executable in place; w0's next replay got one of its own again, and from
  // then on the two never trade.
  EXPECT_EQ(site->executable_counters.updates, 1u);
  EXPECT_EQ(site->executable_counters.instantiations, 2u);
  EXPECT_EQ(site->executables, 2u);
  EXPECT_EQ(d.nodes[0].replays, 5u);
  EXPECT_EQ(d.nodes[1].replays, 5u);
}

TEST_F(GraphTreeTest, ReRecordUpdatesTheExistingExecutableInPlaceBeforeInstantiating) {
  const FunctionId f = Register(Affine(2.0f), "affine", {1}, /*warmup_calls=*/0);
  const BufferView x = Upload(Values(1));
  // A parameter that moves for good, three times: each re-record updates the one executable in place.
  for (int k = 0; k < 4; ++k) {
    const BufferView w = Upload(Values(40 + k));
    for (int call = 0; call < 2; ++call) {
      ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {x, w}, caller_));
      EXPECT_EQ(Read(out[0]), AffineRef(2.0f, Values(1), Values(40 + k))) << "w" << k << " call " << call;
    }
  }
  const TreeDump d = tree_->Dump();
  const TreeDumpSite* site = Site(d, 0, f);
  ASSERT_NE(site, nullptr);
  EXPECT_EQ(site->recordings, 4u);
  EXPECT_EQ(site->executables, 1u);
  EXPECT_EQ(site->executable_counters.instantiations, 1u);
  EXPECT_EQ(site->executable_counters.updates, 3u);
  EXPECT_EQ(site->executable_counters.refused_updates, 0u);
}

TEST_F(GraphTreeTest, FullSiteUpdatesAnExecutableInPlaceInsteadOfReRecording) {
  TreeOptions options = CapturingOptions();
  options.executables_per_site = 1;
  tree_ = MakeTree(options);
  const FunctionId f = Register(Affine(2.0f), "affine", {1}, /*warmup_calls=*/0);
  const BufferView x = Upload(Values(1));
  const BufferView w[] = {Upload(Values(2)), Upload(Values(3))};
  for (int call = 0; call < 6; ++call) {
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {x, w[call % 2]}, caller_));
    EXPECT_EQ(Read(out[0]), AffineRef(2.0f, Values(1), Values(2 + call % 2))) << "call " << call;
  }
  const TreeDump d = tree_->Dump();
  const TreeDumpSite* site = Site(d, 0, f);
  ASSERT_NE(site, nullptr);
  EXPECT_EQ(site->recordings, 2u);
  EXPECT_EQ(site->executables, 1u);
  EXPECT_EQ(site->executable_counters.instantiations, 1u);
  EXPECT_EQ(site->executable_counters.updates, 5u);  // the re-record, then every switch
}

TEST_F(GraphTreeTest, BranchRecordingRestoresTheCheckpointAndBothBranchesReplayCorrectly) {
  const FunctionId a = Register(Affine(2.0f), "A", {1});
  const FunctionId b = Register(Affine(3.0f), "B", {1});
  const FunctionId c = Register(Affine(5.0f), "C", {1});
  const BufferView x = Upload(Values(1));
  const BufferView wa = Upload(Values(2));
  const BufferView wb = Upload(Values(3));
  const BufferView wc = Upload(Values(4));
  const std::vector<float> a_ref = AffineRef(2.0f, Values(1), Values(2));
  // Steps: warm A,B; record A,B; warm C after A; record C (a branch under A); then alternate.
  const bool take_b[] = {true, true, false, false, true, false, true, false};
  DevicePtr b_ptr = 0, c_ptr = 0;
  for (int step = 0; step < 8; ++step) {
    ASSERT_OK_AND_ASSIGN(Outputs out_a, tree_->Call(a, {x, wa}, caller_));
    ASSERT_OK_AND_ASSIGN(Outputs out,
                         tree_->Call(take_b[step] ? b : c, {out_a[0], take_b[step] ? wb : wc}, caller_));
    EXPECT_EQ(Read(out[0]),
              take_b[step] ? AffineRef(3.0f, a_ref, Values(3)) : AffineRef(5.0f, a_ref, Values(4)))
        << "step " << step;
    EXPECT_EQ(Read(out_a[0]), a_ref) << "step " << step;  // B and C never overwrite A's live output
    ASSERT_OK_AND_ASSIGN(const DevicePtr p, out[0].ptr());
    (take_b[step] ? b_ptr : c_ptr) = p;
    if (step == 3) {
      EXPECT_EQ(tree_->Dump().counters.checkpoint_restores, 3u);
    }
  }
  // Both branches were recorded against A's checkpoint: C got exactly the memory B has (PyTorch's
  // max(mem(A,B), mem(A,C)) rather than their sum).
  EXPECT_EQ(b_ptr, c_ptr);
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.recordings, 3u);
  ASSERT_EQ(d.NodesOf(a).size(), 1u);
  const std::uint64_t a_node = d.NodesOf(a)[0]->id;
  ASSERT_EQ(d.NodesOf(b).size(), 1u);
  ASSERT_EQ(d.NodesOf(c).size(), 1u);
  EXPECT_EQ(d.NodesOf(b)[0]->parent, a_node);
  EXPECT_EQ(d.NodesOf(c)[0]->parent, a_node);
  EXPECT_EQ(d.NodesOf(b)[0]->inputs[0],
            (KeyInput{InputRole::kManaged, d.NodesOf(a)[0]->outputs[0].ptr, kBytes}));
  EXPECT_EQ(d.NodesOf(b)[0]->replays, 2u);
  EXPECT_EQ(d.NodesOf(c)[0]->replays, 2u);
  ExpectInvariants();
}

TEST_F(GraphTreeTest, BranchThatGrewThePoolStillReplaysAfterItsParentsCheckpointIsRestored) {
  // A's output (1.5 MiB) puts a large expandable segment in the pool, partly mapped; B maps more of it for a
  // big output. Recording C restores A's checkpoint, in which B's memory was unmapped; B's next replay
  // writes that memory, so it must still be mapped (else: an illegal address on the GPU, SIGSEGV here).
  constexpr std::size_t kLarge = std::size_t{384} << 10;  // floats: 1.5 MiB
  constexpr std::size_t kBig = std::size_t{6} << 20;      // floats: 24 MiB, several 2 MiB chunks
  TreeFunction big = [this](std::span<const BufferView> in,
                            Stream s) -> absl::StatusOr<std::vector<BufferView>> {
    GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr y, allocator_->Allocate(kBig * sizeof(float), s));
    GRAPHALLOC_RETURN_IF_ERROR(FillF32(*driver_, s, y, kBig, 1.5f));
    GRAPHALLOC_RETURN_IF_ERROR(AddF32(*driver_, s, y, in[0].ptr, in[1].ptr, kN));
    return std::vector<BufferView>{{y, kBig * sizeof(float)}};
  };
  const FunctionId a = Register(Affine(2.0f), "A", {1});
  const FunctionId b = Register(big, "B-big", {1});
  const FunctionId c = Register(Affine(5.0f), "C", {1});
  const BufferView x = Upload(Values(1, kLarge));
  const BufferView w = Upload(Values(2, kLarge));
  const std::vector<float> a_ref = AffineRef(2.0f, Values(1, kLarge), Values(2, kLarge));
  const std::vector<float> c_ref = AffineRef(5.0f, a_ref, Values(2, kLarge));
  std::vector<float> b_head(kN);
  for (std::size_t i = 0; i < kN; ++i) b_head[i] = a_ref[i] + Values(2, kLarge)[i];
  const bool take_b[] = {true, true, false, false, true, true, false};
  for (int step = 0; step < 7; ++step) {
    ASSERT_OK_AND_ASSIGN(Outputs out_a, tree_->Call(a, {x, w}, caller_));
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(take_b[step] ? b : c, {out_a[0], w}, caller_));
    ASSERT_OK_AND_ASSIGN(const DevicePtr p, out[0].ptr());
    if (!take_b[step]) {
      EXPECT_EQ(Download(p, kLarge), c_ref) << "step " << step;
      continue;
    }
    EXPECT_EQ(Download(p), b_head) << "step " << step;
    EXPECT_EQ(Download(p + (kBig - kN) * sizeof(float)), std::vector<float>(kN, 1.5f)) << "step " << step;
  }
  ExpectInvariants();
}

TEST_F(GraphTreeTest, FunctionForkingWorkToASideStreamRecordsAndReplays) {
  // The temporary is used on a side stream joined into the capture and freed while capturing: the
  // allocator defers that free until the capture ends, and the tree waits for its event before it takes the
  // recording's checkpoint.
  const Stream side = NewStream();
  ASSERT_OK_AND_ASSIGN(const Event fork, driver_->EventCreate());
  ASSERT_OK_AND_ASSIGN(const Event join, driver_->EventCreate());
  TreeFunction forked = [&](std::span<const BufferView> in,
                            Stream s) -> absl::StatusOr<std::vector<BufferView>> {
    const std::size_t n = in[0].bytes / sizeof(float);
    GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr tmp, allocator_->Allocate(in[0].bytes, s));
    GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr y, allocator_->Allocate(in[0].bytes, s));
    GRAPHALLOC_RETURN_IF_ERROR(driver_->EventRecord(fork, s));
    GRAPHALLOC_RETURN_IF_ERROR(driver_->StreamWaitEvent(side, fork));
    GRAPHALLOC_RETURN_IF_ERROR(ScaleF32(*driver_, side, tmp, in[0].ptr, n, 2.0f));
    GRAPHALLOC_RETURN_IF_ERROR(allocator_->RecordStream(tmp, side));
    GRAPHALLOC_RETURN_IF_ERROR(driver_->EventRecord(join, side));
    GRAPHALLOC_RETURN_IF_ERROR(driver_->StreamWaitEvent(s, join));
    GRAPHALLOC_RETURN_IF_ERROR(AddF32(*driver_, s, y, tmp, in[1].ptr, n));
    GRAPHALLOC_RETURN_IF_ERROR(allocator_->Free(tmp));
    return std::vector<BufferView>{{y, in[0].bytes}};
  };
  const FunctionId f = Register(forked, "forked", {1});
  const BufferView x = Upload(Values(1));
  const BufferView w = Upload(Values(2));
  for (int call = 0; call < 4; ++call) {
    Overwrite(x.ptr, Values(call));
    absl::StatusOr<Outputs> out = tree_->Call(f, {x, w}, caller_);
    ASSERT_TRUE(out.ok()) << "call " << call << ": " << out.status();
    EXPECT_EQ(Read((*out)[0]), AffineRef(2.0f, Values(call), Values(2))) << "call " << call;
  }
  EXPECT_EQ(tree_->Dump().counters.recordings, 1u);
  EXPECT_EQ(tree_->Dump().counters.replays, 2u);
  ASSERT_OK(driver_->DeviceSynchronize());
  tree_.reset();
  ASSERT_OK(driver_->EventDestroy(fork));
  ASSERT_OK(driver_->EventDestroy(join));
}

TEST_F(GraphTreeTest, ForwardsThenBackwardsInReverseOrderBecomeOnePath) {
  const FunctionId fwd1 = Register(Affine(2.0f), "fwd1", {1});
  const FunctionId fwd2 = Register(Affine(3.0f), "fwd2", {1});
  const FunctionId bwd2 = Register(Affine(5.0f), "bwd2");
  const FunctionId bwd1 = Register(Affine(7.0f), "bwd1");
  const BufferView x = Upload(Values(1));
  const BufferView w1 = Upload(Values(2));
  const BufferView w2 = Upload(Values(3));
  const std::vector<float> a1 = AffineRef(2.0f, Values(1), Values(2));
  const std::vector<float> a2 = AffineRef(3.0f, a1, Values(3));
  const std::vector<float> g2 = AffineRef(5.0f, a2, a1);
  const std::vector<float> g1 = AffineRef(7.0f, g2, a1);
  for (int step = 0; step < 4; ++step) {  // warmup, record, replay, replay
    ASSERT_OK_AND_ASSIGN(Outputs o1, tree_->Call(fwd1, {x, w1}, caller_));
    ASSERT_OK_AND_ASSIGN(Outputs o2, tree_->Call(fwd2, {o1[0], w2}, caller_));
    ASSERT_OK_AND_ASSIGN(Outputs d2, tree_->Call(bwd2, {o2[0], o1[0]}, caller_));
    o2.clear();  // the saved activation is consumed
    ASSERT_OK_AND_ASSIGN(Outputs d1, tree_->Call(bwd1, {d2[0], o1[0]}, caller_));
    EXPECT_EQ(Read(d2[0]), g2) << "step " << step;
    EXPECT_EQ(Read(d1[0]), g1) << "step " << step;
  }
  const TreeDump d = tree_->Dump();
  ASSERT_EQ(d.nodes.size(), 4u) << FormatTreeDump(d);
  const FunctionId order[] = {fwd1, fwd2, bwd2, bwd1};
  for (std::size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(d.nodes[k].function, order[k]);
    EXPECT_EQ(d.nodes[k].depth, k);
    EXPECT_EQ(d.nodes[k].parent, k == 0 ? 0 : d.nodes[k - 1].id);
    EXPECT_EQ(d.nodes[k].replays, 2u);
  }
  EXPECT_EQ(d.nodes[2].inputs[0].role, InputRole::kManaged);
  EXPECT_EQ(d.nodes[2].inputs[1].role, InputRole::kManaged);
  EXPECT_EQ(d.nodes[3].expected_dead, 1u);  // fwd2's output was dead when bwd1 was recorded
}

TEST_F(GraphTreeTest, OverwrittenOutputIsAnErrorToReadOrPassAndACloneSurvives) {
  const FunctionId f = Register(Affine(2.0f), "affine", {1});
  const FunctionId g = Register(Affine(3.0f), "consumer", {1});
  const BufferView x = Upload(Values(1));
  const BufferView w = Upload(Values(2));
  const std::vector<float> expected = AffineRef(2.0f, Values(1), Values(2));
  ASSERT_OK_AND_ASSIGN(Outputs warm, tree_->Call(f, {x, w}, caller_));      // step 1: warmup
  ASSERT_OK_AND_ASSIGN(Outputs recorded, tree_->Call(f, {x, w}, caller_));  // step 2: recording
  EXPECT_TRUE(warm[0].overwritten());
  ASSERT_OK_AND_ASSIGN(TreeOutput clone, recorded[0].Clone(caller_));
  Overwrite(x.ptr, Values(9));
  ASSERT_OK_AND_ASSIGN(Outputs replayed, tree_->Call(f, {x, w}, caller_));  // step 3: replay, same memory
  EXPECT_EQ(Read(replayed[0]), AffineRef(2.0f, Values(9), Values(2)));
  for (const TreeOutput* old : {&warm[0], &recorded[0]}) {
    const absl::Status s = old->ptr().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(s.message(), "output 0 of graph-tree function 'affine'")) << s;
    EXPECT_TRUE(Contains(s.message(), "has been overwritten")) << s;
    EXPECT_TRUE(Contains(s.message(), "clone it")) << s;
  }
  const absl::StatusOr<Outputs> passed = tree_->Call(g, {recorded[0], w}, caller_);
  ASSERT_FALSE(passed.ok());
  EXPECT_TRUE(
      Contains(passed.status().message(), "input 0: output 0 of graph-tree function 'affine' (step 2)"))
      << passed.status();
  EXPECT_EQ(clone.kind(), OutputKind::kOwned);
  EXPECT_EQ(Read(clone), expected);  // the clone kept step 2's values
}

TEST_F(GraphTreeTest, CloneOutputsOptionHandsOutCopiesThatOutliveTheStep) {
  absl::StatusOr<FunctionId> f = tree_->Register(
      Affine(2.0f), FunctionOptions{.name = "cloned", .static_inputs = {1}, .clone_outputs = true});
  ASSERT_TRUE(f.ok());
  const BufferView x = Upload(Values(1));
  const BufferView w = Upload(Values(2));
  std::vector<Outputs> kept;
  for (int step = 0; step < 4; ++step) {
    Overwrite(x.ptr, Values(step));
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(*f, {x, w}, caller_));
    EXPECT_EQ(out[0].kind(), OutputKind::kOwned);
    kept.push_back(out);
  }
  for (int step = 0; step < 4; ++step)
    EXPECT_EQ(Read(kept[step][0]), AffineRef(2.0f, Values(step), Values(2)));
}

TEST_F(GraphTreeTest, LiveOutputThatARecordingSawDeadGetsItsOwnRecordingNotOverwritten) {
  const FunctionId a = Register(Affine(2.0f), "A", {1});
  const FunctionId b = Register(Affine(3.0f), "B", {1});
  const BufferView x = Upload(Values(1));
  const BufferView y = Upload(Values(5));
  const BufferView w = Upload(Values(2));
  const std::vector<float> a_ref = AffineRef(2.0f, Values(1), Values(2));
  const std::vector<float> b_ref = AffineRef(3.0f, Values(5), Values(2));
  // Steps 0, 1, 3: A's output dies before B; steps 2, 4: the caller keeps it across B.
  const bool keep_a[] = {false, false, true, false, true};
  for (int step = 0; step < 5; ++step) {
    ASSERT_OK_AND_ASSIGN(Outputs out_a, tree_->Call(a, {x, w}, caller_));
    if (!keep_a[step]) out_a.clear();
    ASSERT_OK_AND_ASSIGN(Outputs out_b, tree_->Call(b, {y, w}, caller_));
    EXPECT_EQ(Read(out_b[0]), b_ref) << "step " << step;
    if (keep_a[step]) {
      EXPECT_EQ(Read(out_a[0]), a_ref) << "step " << step;
    }
  }
  const TreeDump d = tree_->Dump();
  ASSERT_EQ(d.NodesOf(a).size(), 1u);
  const TreeDumpSite* site = Site(d, d.NodesOf(a)[0]->id, b);
  ASSERT_NE(site, nullptr);
  EXPECT_EQ(site->recordings, 2u) << FormatTreeDump(d);
  EXPECT_EQ(site->reasons[static_cast<int>(RerecordReason::kLiveness)], 1);
  EXPECT_EQ(d.counters.dead_outputs_freed, 1u);  // A's dead output, freed for B's first recording
  const std::vector<const TreeDumpNode*> bs = d.NodesOf(b);
  ASSERT_EQ(bs.size(), 2u);
  EXPECT_EQ(bs[0]->expected_dead, 1u);
  EXPECT_EQ(bs[1]->expected_dead, 0u);
  EXPECT_EQ(bs[0]->replays, 1u);  // step 3
  EXPECT_EQ(bs[1]->replays, 1u);  // step 4
}

TEST_F(GraphTreeTest, FailingFunctionOrCaptureLeavesTheTreeAndAllocatorUsable) {
  enum class Fault { kNone, kError, kInvalidateCapture };
  Fault fault = Fault::kNone;
  TreeFunction inner = Affine(2.0f);
  TreeFunction flaky = [&](std::span<const BufferView> in,
                           Stream s) -> absl::StatusOr<std::vector<BufferView>> {
    if (fault == Fault::kError) {
      (void)allocator_->Allocate(kBytes, s);  // left behind in the pool by the failure
      return absl::InternalError("injected failure");
    }
    absl::StatusOr<std::vector<BufferView>> out = inner(in, s);
    if (fault == Fault::kInvalidateCapture) {
      absl::StatusOr<CaptureInfo> info = driver_->GetCaptureInfo(s);
      if (info.ok() && info->status == CaptureStatus::kActive) (void)driver_->StreamSynchronize(s);
    }
    return out;
  };
  const FunctionId f = Register(flaky, "flaky", {1});
  const BufferView x = Upload(Values(1));
  const BufferView w0 = Upload(Values(2));
  const BufferView w1 = Upload(Values(3));
  auto expect_works = [&](BufferView w, int values) {
    absl::StatusOr<Outputs> out = tree_->Call(f, {x, w}, caller_);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(Read((*out)[0]), AffineRef(2.0f, Values(1), Values(values)));
    ExpectInvariants();
  };

  fault = Fault::kError;  // in the warmup
  absl::StatusOr<Outputs> failed = tree_->Call(f, {x, w0}, caller_);
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(Contains(failed.status().message(), "warmup call of 'flaky' failed: injected failure"))
      << failed.status();
  fault = Fault::kNone;
  expect_works(w0, 2);

  fault = Fault::kError;  // in the recording
  failed = tree_->Call(f, {x, w0}, caller_);
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(Contains(failed.status().message(), "recording 'flaky' failed")) << failed.status();
  EXPECT_TRUE(Contains(failed.status().message(), "injected failure")) << failed.status();
  fault = Fault::kNone;
  expect_works(w0, 2);  // recorded now
  // The pool holds exactly the recording's output: the failure's leftovers were freed.
  ASSERT_OK_AND_ASSIGN(PoolStats stats, allocator_->GetPoolStats(tree_->pool().id()));
  EXPECT_EQ(stats.live_blocks, 1u);

  fault = Fault::kInvalidateCapture;  // a re-record whose capture the driver invalidates
  failed = tree_->Call(f, {x, w1}, caller_);
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(Contains(failed.status().message(), "the capture failed")) << failed.status();
  absl::StatusOr<CaptureInfo> info = driver_->GetCaptureInfo(tree_->stream());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->status, CaptureStatus::kNone);
  fault = Fault::kNone;
  expect_works(w1, 3);
  expect_works(w0, 2);  // the first recording still replays
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.failed_recordings, 2u);
  EXPECT_EQ(d.counters.recordings, 2u);
  EXPECT_EQ(Site(d, 0, f)->rerecords, 1);  // failed attempts do not use up the budget
}

TEST_F(GraphTreeTest, PoolMemoryIsReusedAcrossAThousandSteps) {
  const FunctionId a = Register(Affine(2.0f), "A", {1});
  const FunctionId b = Register(Affine(3.0f), "B", {1});
  const BufferView x = Upload(Values(1));
  const BufferView w = Upload(Values(2));
  const std::vector<float> a_ref = AffineRef(2.0f, Values(1), Values(2));
  std::size_t pool_reserved = 0, device_reserved = 0;
  for (int step = 0; step < 1000; ++step) {
    ASSERT_OK_AND_ASSIGN(Outputs out_a, tree_->Call(a, {x, w}, caller_));
    ASSERT_OK_AND_ASSIGN(Outputs out_b, tree_->Call(b, {out_a[0], w}, caller_));
    if (step % 100 == 0 || step == 999) {
      EXPECT_EQ(Read(out_b[0]), AffineRef(3.0f, a_ref, Values(2))) << "step " << step;
    }
    if (step == 10) {
      pool_reserved = tree_->Dump().pool_reserved_bytes;
      device_reserved = Stats().reserved_bytes.all().current;
    }
  }
  EXPECT_GT(pool_reserved, 0u);
  EXPECT_EQ(tree_->Dump().pool_reserved_bytes, pool_reserved);
  EXPECT_EQ(Stats().reserved_bytes.all().current, device_reserved);
  EXPECT_EQ(tree_->Dump().counters.recordings, 2u);
  EXPECT_EQ(tree_->Dump().counters.replays, 2u * 998);
}

TEST_F(GraphTreeTest, UnknownFunctionAndBadOptionsAreErrors) {
  const BufferView x = Upload(Values(1));
  EXPECT_EQ(tree_->Call(7, {x}, caller_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tree_->Register(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  TreeOptions bad;
  bad.max_recordings = -1;
  EXPECT_EQ(GraphTree::Create(*allocator_, bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GraphTreeTest, ReturningAStaticInputPassesItThrough) {
  // Copied inputs returned as they are: tree_aliasing_test.cc.
  TreeFunction identity = [](std::span<const BufferView> in,
                             Stream) -> absl::StatusOr<std::vector<BufferView>> {
    return std::vector<BufferView>{in[0]};
  };
  const FunctionId fixed = Register(identity, "returns-static", {0});
  const BufferView x = Upload(Values(1));
  for (int call = 0; call < 3; ++call) {
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(fixed, {x}, caller_));
    EXPECT_EQ(out[0].kind(), OutputKind::kBorrowed);
    EXPECT_EQ(*out[0].ptr(), x.ptr);
  }
}

TEST_F(GraphTreeTest, DumpNamesFunctionsAddressesAndReRecordReasons) {
  const FunctionId f = Register(Affine(2.0f), "affine", {1}, /*warmup_calls=*/0);
  const BufferView x = Upload(Values(1));
  const BufferView w0 = Upload(Values(2));
  const BufferView w1 = Upload(Values(3));
  for (const BufferView& w : {w0, w1, w0}) ASSERT_TRUE(tree_->Call(f, {x, w}, caller_).ok());
  const std::string text = FormatTreeDump(tree_->Dump());
  EXPECT_TRUE(Contains(text, "node 1 'affine' (parent 0): 1 replays; first recording")) << text;
  EXPECT_TRUE(Contains(text, absl::StrFormat("node 2 'affine' (parent 0): 0 replays; static input 1 changed "
                                             "address from 0x%x to 0x%x",
                                             w0.ptr, w1.ptr)))
      << text;
  EXPECT_TRUE(Contains(text, absl::StrFormat("inputs [copied %dB, static 0x%x %dB]", kBytes, w1.ptr, kBytes)))
      << text;
  EXPECT_TRUE(Contains(text,
                       "site (parent 0, 'affine'): 2 recordings, 1 re-records [static input address "
                       "changed: 1]"))
      << text;
}

TEST_F(GraphTreeTest, RandomizedStepsMatchTheHostReference) {
  const std::uint64_t seed = TestSeed(20261122);
  std::cout << "GraphTreeTest.RandomizedStepsMatchTheHostReference seed=" << seed
            << " (set GRAPHALLOC_TEST_SEED to replay)\n";
  std::mt19937_64 rng(seed);
  TreeOptions options = CapturingOptions();
  options.max_recordings = 1000;
  tree_ = MakeTree(options);
  const float alphas[] = {2.0f, 3.0f, 5.0f};
  std::vector<FunctionId> fns;
  for (int i = 0; i < 3; ++i) fns.push_back(Register(Affine(alphas[i]), absl::StrCat("f", i), {1}));
  std::vector<BufferView> ws;
  for (int i = 0; i < 3; ++i) ws.push_back(Upload(Values(30 + i)));
  const BufferView x = Upload(Values(0));
  for (int step = 0; step < 150; ++step) {
    const int xv = static_cast<int>(rng() % 50);
    Overwrite(x.ptr, Values(xv));
    std::vector<float> ref = Values(xv);
    TreeOutput prev;
    const int length = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < length; ++k) {
      // The root is always f0 (so a step begins only there); later calls pick any function and weight.
      const int fi = k == 0 ? 0 : 1 + static_cast<int>(rng() % 2);
      const int wi = static_cast<int>(rng() % 3);
      absl::StatusOr<Outputs> out =
          k == 0 ? tree_->Call(fns[fi], {x, ws[wi]}, caller_) : tree_->Call(fns[fi], {prev, ws[wi]}, caller_);
      ASSERT_TRUE(out.ok()) << "seed " << seed << " step " << step << ": " << out.status();
      ref = AffineRef(alphas[fi], ref, Values(30 + wi));
      ASSERT_EQ(Read((*out)[0]), ref) << "seed " << seed << " step " << step << " call " << k;
      prev = (*out)[0];
    }
  }
  ExpectInvariants();
}

}  // namespace
}  // namespace graphalloc::testing

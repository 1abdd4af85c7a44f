// The graph tree's side of the capture-participant contract (graph/capture_participant.h), with a fake
// participant and no rng layer: when the tree begins, ends, cancels and re-arms it, with which capture's
// state, on which stream, and that warmups and eager calls leave it alone.
//
// The fake is a counter that functions read on the device, like a generator's offset: eagerly, Take()
// writes the next value into a buffer on the call's stream; in capture mode it hands out its capture's
// slot, which its ArmReplay fills with the next value before each launch. Every call of a function that
// copies what Take() returns therefore outputs 0, 1, 2, ... in call order, whether it warms up, records,
// replays or runs eagerly, exactly when the tree keeps the contract. Runs on the simulated device and, as
// *_gpu, on the GPU.
#include "graphalloc/graph/capture_participant.h"

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "graphalloc/allocator/base/status_macros.h"
#include "graphalloc/graph/graph_tree.h"
#include "tests/graph/graph_test_util.h"

namespace graphalloc::testing {
namespace {

using Outputs = std::vector<TreeOutput>;

constexpr std::size_t kValueBytes = 64;  // each value is this many bytes, all equal to it

class CountingParticipant final : public CaptureParticipant {
 public:
  // `watched` is the stream whose capture state begin and end report (the tree's); `ordinals` numbers
  // capture ids (unique in the process, not per test) 1, 2, ... as they come, shared by a test's
  // participants.
  CountingParticipant(std::shared_ptr<Driver> driver, std::string name, Stream watched,
                      std::map<std::uint64_t, int>& ordinals)
      : driver_(std::move(driver)), name_(std::move(name)), watched_(watched), ordinals_(ordinals) {}
  ~CountingParticipant() override {
    if (eager_buffer_ != 0) (void)driver_->MemFree(eager_buffer_);
  }

  // What a function reads: a buffer of kValueBytes bytes that holds the next value when `stream` gets there.
  absl::StatusOr<DevicePtr> Take(Stream stream) {
    if (capture_.has_value()) {
      ++capture_->takes;
      Note(absl::StrFormat("take in capture %d of '%s'", Ordinal(capture_->id), Recording()));
      return capture_->slot;
    }
    if (const std::string_view* recording = RecordingScope::Active(); recording != nullptr) {
      Note(absl::StrFormat("take refused during the recording of '%s'", *recording));
      return absl::FailedPreconditionError(
          absl::StrFormat("%s is not a participant of the recording of '%s'", name_, *recording));
    }
    if (eager_buffer_ == 0) {
      GRAPHALLOC_ASSIGN_OR_RETURN(eager_buffer_, driver_->MemAlloc(kValueBytes));
    }
    GRAPHALLOC_RETURN_IF_ERROR(driver_->MemsetAsync(eager_buffer_, value_, kValueBytes, stream));
    Note(absl::StrFormat("take %d eagerly", value_));
    ++value_;
    return eager_buffer_;
  }

  absl::Status OnCaptureBegin(std::uint64_t capture_id) override {
    Note(absl::StrFormat("begin capture %d (%s)", Ordinal(capture_id), WatchedState()));
    if (fail_begin_) return absl::UnavailableError(absl::StrFormat("%s refuses to begin", name_));
    GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr slot, driver_->MemAlloc(kValueBytes));
    capture_ = Capture{capture_id, slot, 0};
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Captured>> OnCaptureEnd() override {
    Note(absl::StrFormat("end capture %d (%s)", Ordinal(capture_->id), WatchedState()));
    if (fail_end_) {  // it leaves capture mode all the same
      (void)driver_->MemFree(capture_->slot);
      capture_.reset();
      return absl::DataLossError(absl::StrFormat("%s refuses to end", name_));
    }
    auto captured = std::make_unique<CapturedCount>(driver_, live_, *capture_);
    capture_.reset();
    return captured;
  }

  void OnCaptureCancel() override {
    Note(absl::StrFormat("cancel capture %d", Ordinal(capture_->id)));
    (void)driver_->MemFree(capture_->slot);
    capture_.reset();
  }

  absl::Status ArmReplay(const Captured& captured, Stream stream) override {
    const auto& mine = dynamic_cast<const CapturedCount&>(captured);
    Note(absl::StrFormat("arm capture %d with %d on %s", Ordinal(mine.capture.id), value_,
                         stream == watched_ ? "the tree's stream" : "the caller's stream"));
    for (int i = 0; i < mine.capture.takes; ++i) {
      GRAPHALLOC_RETURN_IF_ERROR(driver_->MemsetAsync(mine.capture.slot, value_, kValueBytes, stream));
      ++value_;
    }
    return absl::OkStatus();
  }

  bool capturing() const { return capture_.has_value(); }
  std::uint8_t value() const { return value_; }
  // Captured states the tree still holds.
  int live_captured() const { return *live_; }
  // What happened to this participant, in order ("take", "begin", "end", "cancel", "arm").
  std::vector<std::string> events;
  bool fail_begin_ = false;
  bool fail_end_ = false;

 private:
  struct Capture {
    std::uint64_t id = 0;
    DevicePtr slot = 0;
    int takes = 0;
  };
  struct CapturedCount final : Captured {
    CapturedCount(std::shared_ptr<Driver> d, std::shared_ptr<int> l, Capture c)
        : driver(std::move(d)), live(std::move(l)), capture(c) {
      ++*live;
    }
    ~CapturedCount() override {
      --*live;
      (void)driver->MemFree(capture.slot);
    }
    std::shared_ptr<Driver> driver;
    std::shared_ptr<int> live;
    Capture capture;
  };

  void Note(std::string event) { events.push_back(absl::StrFormat("%s: %s", name_, event)); }
  int Ordinal(std::uint64_t capture_id) {
    return ordinals_.emplace(capture_id, static_cast<int>(ordinals_.size()) + 1).first->second;
  }
  std::string Recording() const {
    const std::string_view* recording = RecordingScope::Active();
    return recording != nullptr ? std::string(*recording) : std::string("(nothing)");
  }
  std::string WatchedState() const {
    absl::StatusOr<CaptureInfo> info = driver_->GetCaptureInfo(watched_);
    if (!info.ok()) return std::string(info.status().message());
    return info->status == CaptureStatus::kNone ? "tree stream not capturing" : "tree stream CAPTURING";
  }

  std::shared_ptr<Driver> driver_;
  std::string name_;
  Stream watched_;
  std::uint8_t value_ = 0;
  DevicePtr eager_buffer_ = 0;
  std::optional<Capture> capture_;
  std::map<std::uint64_t, int>& ordinals_;
  std::shared_ptr<int> live_ = std::make_shared<int>(0);
};

class CaptureParticipantTest : public TreeTest {
 protected:
  // (w) -> a copy of what each participant's Take() returned, one output per participant; w is static,
  // so a new address of it re-records.
  TreeFunction Counting(std::vector<CountingParticipant*> participants) {
    return [this, participants](std::span<const BufferView>,
                                Stream s) -> absl::StatusOr<std::vector<BufferView>> {
      if (fail_next_) {
        fail_next_ = false;
        return absl::AbortedError("injected failure of the counting function");
      }
      std::vector<BufferView> outputs;
      for (CountingParticipant* p : participants) {
        GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr value, p->Take(s));
        GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr out, allocator_->Allocate(kValueBytes, s));
        GRAPHALLOC_RETURN_IF_ERROR(driver_->CopyAsync(out, value, kValueBytes, s));
        outputs.push_back(BufferView{out, kValueBytes});
      }
      return outputs;
    };
  }
  FunctionId RegisterCounting(std::string name, std::vector<CountingParticipant*> listed,
                              std::vector<CountingParticipant*> used) {
    FunctionOptions options{.name = std::move(name), .static_inputs = {0}};
    options.generators.assign(listed.begin(), listed.end());
    return RegisterWith(Counting(std::move(used)), std::move(options));
  }
  void TearDown() override {
    tree_.reset();  // before the participants, which must outlive it
    participants_.clear();
    TreeTest::TearDown();
  }
  CountingParticipant* MakeParticipant(std::string name) {
    return participants_
        .emplace_back(
            std::make_unique<CountingParticipant>(driver_, std::move(name), tree_->stream(), ordinals_))
        .get();
  }
  // The value a call output: every byte of it, or -1 when they differ.
  int ValueOf(const TreeOutput& out) {
    absl::StatusOr<DevicePtr> p = out.ptr();
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return -2;
    std::vector<std::uint8_t> bytes(out.bytes());
    EXPECT_TRUE(driver_->StreamSynchronize(caller_).ok());
    EXPECT_TRUE(driver_->CopyDeviceToHost(bytes.data(), *p, bytes.size()).ok());
    for (std::uint8_t b : bytes) {
      if (b != bytes[0]) return -1;
    }
    return bytes.empty() ? -1 : bytes[0];
  }

  bool fail_next_ = false;
  std::map<std::uint64_t, int> ordinals_;
  std::vector<std::unique_ptr<CountingParticipant>> participants_;
};

// What participant `p` logs for capture `capture` of 'counting' that succeeds (Captured) and whose node
// is then launched once by the recording itself, reading `value` (Recorded).
std::vector<std::string> Captured(std::string_view p, int capture) {
  return {absl::StrFormat("%s: begin capture %d (tree stream not capturing)", p, capture),
          absl::StrFormat("%s: take in capture %d of 'counting'", p, capture),
          absl::StrFormat("%s: end capture %d (tree stream not capturing)", p, capture)};
}
std::vector<std::string> Recorded(std::string_view p, int capture, int value) {
  std::vector<std::string> events = Captured(p, capture);
  events.push_back(absl::StrFormat("%s: arm capture %d with %d on the tree's stream", p, capture, value));
  return events;
}
// The parts, one after the other.
std::vector<std::string> Events(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> all;
  for (const std::vector<std::string>& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}

TEST_F(CaptureParticipantTest, BegunBeforeTheCaptureEndedAfterItAndReArmedBeforeEveryLaunch) {
  CountingParticipant* a = MakeParticipant("a");
  const FunctionId f = RegisterCounting("counting", {a}, {a});
  const BufferView w = Upload(Values(1));
  for (int call = 0; call < 4; ++call) {  // warmup, recording, two replays
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {w}, caller_));
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(ValueOf(out[0]), call);
  }
  EXPECT_EQ(a->events, Events({{"a: take 0 eagerly"},
                               Recorded("a", 1, 1),
                               {"a: arm capture 1 with 2 on the caller's stream",
                                "a: arm capture 1 with 3 on the caller's stream"}}));
  EXPECT_FALSE(a->capturing());
  EXPECT_EQ(a->live_captured(), 1);
  tree_.reset();  // the node goes, and with it what the participant kept for it
  EXPECT_EQ(a->live_captured(), 0);
}

TEST_F(CaptureParticipantTest, EachLaunchIsArmedWithWhatItsOwnRecordingKept) {
  CountingParticipant* a = MakeParticipant("a");
  const FunctionId f = RegisterCounting("counting", {a}, {a});
  const BufferView w[] = {Upload(Values(1)), Upload(Values(2))};
  // warmup (w0), record w0, re-record w1 (the static input moved), replay w0, replay w1.
  const int sequence[] = {0, 0, 1, 0, 1};
  for (int call = 0; call < 5; ++call) {
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {w[sequence[call]]}, caller_));
    EXPECT_EQ(ValueOf(out[0]), call);
    tree_->BeginStep();
  }
  EXPECT_EQ(a->events, Events({{"a: take 0 eagerly"},
                               Recorded("a", 1, 1),
                               Recorded("a", 2, 2),
                               {"a: arm capture 1 with 3 on the caller's stream",
                                "a: arm capture 2 with 4 on the caller's stream"}}));
  EXPECT_EQ(a->live_captured(), 2);
  tree_.reset();
  EXPECT_EQ(a->live_captured(), 0);
}

TEST_F(CaptureParticipantTest, AFailedCaptureCancelsEveryParticipantAndTheNextRecordingStartsAfresh) {
  CountingParticipant* a = MakeParticipant("a");
  CountingParticipant* b = MakeParticipant("b");
  const FunctionId f = RegisterCounting("counting", {a, b}, {a, b});
  const BufferView w = Upload(Values(1));
  ASSERT_OK(tree_->Call(f, {w}, caller_).status());  // warmup: a and b give 0
  fail_next_ = true;
  const absl::StatusOr<Outputs> failed = tree_->Call(f, {w}, caller_);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(failed.status().message().find("graph tree: recording 'counting' failed"), std::string::npos)
      << failed.status();
  ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {w}, caller_));  // recorded now
  EXPECT_EQ(ValueOf(out[0]), 1);
  EXPECT_EQ(ValueOf(out[1]), 1);
  const std::vector<std::string> expected_b =
      Events({{"b: take 0 eagerly", "b: begin capture 1 (tree stream not capturing)", "b: cancel capture 1"},
              Recorded("b", 2, 1)});
  EXPECT_EQ(b->events, expected_b);
  EXPECT_EQ(a->events.size(), expected_b.size()) << "a was driven like b";
  EXPECT_EQ(a->live_captured(), 1);
  EXPECT_EQ(b->live_captured(), 1);
}

TEST_F(CaptureParticipantTest, AParticipantThatFailsToBeginOrEndCancelsTheOthersAndFailsTheRecording) {
  CountingParticipant* a = MakeParticipant("a");
  CountingParticipant* b = MakeParticipant("b");
  CountingParticipant* c = MakeParticipant("c");
  const FunctionId f = RegisterCounting("counting", {a, b, c}, {a, b, c});
  const BufferView w = Upload(Values(1));
  ASSERT_OK(tree_->Call(f, {w}, caller_).status());  // warmup: all give 0

  b->fail_begin_ = true;  // a began and is cancelled, c never begins
  absl::StatusOr<Outputs> failed = tree_->Call(f, {w}, caller_);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(failed.status().message(), "graph tree: recording 'counting' failed: b refuses to begin");
  b->fail_begin_ = false;

  b->fail_end_ = true;  // a ended (its state is dropped with the node), b failed, c is cancelled
  failed = tree_->Call(f, {w}, caller_);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(failed.status().message(), "graph tree: recording 'counting' failed: b refuses to end");
  b->fail_end_ = false;
  EXPECT_EQ(tree_->Dump().counters.failed_recordings, 2u);

  ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {w}, caller_));
  for (const TreeOutput& o : out) EXPECT_EQ(ValueOf(o), 1);
  EXPECT_EQ(
      a->events,
      Events({{"a: take 0 eagerly", "a: begin capture 1 (tree stream not capturing)", "a: cancel capture 1"},
              Captured("a", 2),  // ended: what it returned went with the failed node
              Recorded("a", 3, 1)}));
  EXPECT_EQ(b->events, Events({{"b: take 0 eagerly", "b: begin capture 1 (tree stream not capturing)"},
                               Captured("b", 2),  // its end failed
                               Recorded("b", 3, 1)}));
  EXPECT_EQ(c->events, Events({{"c: take 0 eagerly", "c: begin capture 2 (tree stream not capturing)",
                                "c: take in capture 2 of 'counting'", "c: cancel capture 2"},
                               Recorded("c", 3, 1)}));
  EXPECT_EQ(a->live_captured(), 1);  // capture 2's state went with the failed node
  EXPECT_EQ(b->live_captured(), 1);
  EXPECT_EQ(c->live_captured(), 1);
}

TEST_F(CaptureParticipantTest, EagerFallbackCallsUseTheParticipantEagerly) {
  TreeOptions options = CapturingOptions();
  options.max_recordings = 0;  // the first move of w falls back to eager calls at the root
  tree_ = MakeTree(options);
  CountingParticipant* a = MakeParticipant("a");
  const FunctionId f = RegisterCounting("counting", {a}, {a});
  const BufferView w[] = {Upload(Values(1)), Upload(Values(2))};
  // warmup (w0), record w0, w1 past the limit: eager, and w0 eager too from then on.
  const int sequence[] = {0, 0, 1, 0};
  for (int call = 0; call < 4; ++call) {
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {w[sequence[call]]}, caller_));
    EXPECT_EQ(ValueOf(out[0]), call);
    tree_->BeginStep();
  }
  EXPECT_EQ(a->events,
            Events({{"a: take 0 eagerly"}, Recorded("a", 1, 1), {"a: take 2 eagerly", "a: take 3 eagerly"}}));
  EXPECT_EQ(tree_->Dump().counters.eager_runs, 2u);
  ASSERT_EQ(warnings_.size(), 1u);
}

TEST_F(CaptureParticipantTest, AParticipantLeftOutOfTheRecordingSeesItsScopeAndTheRecordingFails) {
  CountingParticipant* listed = MakeParticipant("listed");
  CountingParticipant* unlisted = MakeParticipant("unlisted");
  const FunctionId f = RegisterCounting("counting", {listed}, {listed, unlisted});
  const BufferView w = Upload(Values(1));
  ASSERT_OK(tree_->Call(f, {w}, caller_).status());  // warmup: both eager, no scope
  EXPECT_EQ(RecordingScope::Active(), nullptr);
  const absl::StatusOr<Outputs> failed = tree_->Call(f, {w}, caller_);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(failed.status().message().find("unlisted is not a participant of the recording of 'counting'"),
            std::string::npos)
      << failed.status();
  EXPECT_EQ(RecordingScope::Active(), nullptr) << "the scope ends with the capture";
  EXPECT_EQ(unlisted->events, (std::vector<std::string>{
                                  "unlisted: take 0 eagerly",
                                  "unlisted: take refused during the recording of 'counting'",
                              }));
  EXPECT_EQ(listed->events.back(), "listed: cancel capture 1");
  EXPECT_EQ(listed->live_captured(), 0);
  EXPECT_EQ(unlisted->value(), 1);  // the refused take drew nothing
}

TEST(RecordingScopeTest, ScopesNestAndEndWithTheirObject) {
  EXPECT_EQ(RecordingScope::Active(), nullptr);
  {
    const RecordingScope outer("outer");
    ASSERT_NE(RecordingScope::Active(), nullptr);
    EXPECT_EQ(*RecordingScope::Active(), "outer");
    {
      const RecordingScope inner("inner");
      EXPECT_EQ(*RecordingScope::Active(), "inner");
    }
    EXPECT_EQ(*RecordingScope::Active(), "outer");
  }
  EXPECT_EQ(RecordingScope::Active(), nullptr);
}

}  // namespace
}  // namespace graphalloc::testing

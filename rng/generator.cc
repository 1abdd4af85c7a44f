#include "graphalloc/rng/generator.h"

#include <atomic>
#include <cstdio>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "graphalloc/rng/random_ops.h"

namespace graphalloc {
namespace {

std::atomic<std::uint64_t> next_generator_id{1};

// Slots whose MemFree failed (e.g. during a stream capture), retried later.
struct DeferredFrees {
  Mutex mu;
  std::vector<std::pair<std::shared_ptr<Driver>, DevicePtr>> pending ABSL_GUARDED_BY(mu);
};

DeferredFrees& Deferred() {
  static DeferredFrees* deferred = new DeferredFrees();
  return *deferred;
}

std::uint64_t RoundUp4(std::uint64_t x) { return (x + 3) / 4 * 4; }

// What a generator keeps with a node of the graph tree.
struct TreeCapturedRng final : CaptureParticipant::Captured {
  explicit TreeCapturedRng(CapturedRng captured) : rng(std::move(captured)) {}
  CapturedRng rng;
};

}  // namespace

std::size_t RetryDeferredSlotFrees() {
  std::vector<std::pair<std::shared_ptr<Driver>, DevicePtr>> todo;
  {
    MutexLock lock(&Deferred().mu);
    todo.swap(Deferred().pending);
  }
  std::vector<std::pair<std::shared_ptr<Driver>, DevicePtr>> still;
  for (auto& [driver, ptr] : todo) {
    if (!driver->MemFree(ptr).ok()) still.emplace_back(std::move(driver), ptr);
  }
  MutexLock lock(&Deferred().mu);
  for (auto& entry : still) Deferred().pending.push_back(std::move(entry));
  return Deferred().pending.size();
}

absl::StatusOr<std::shared_ptr<RngSlots>> RngSlots::Allocate(std::shared_ptr<Driver> driver) {
  RetryDeferredSlotFrees();
  absl::StatusOr<DevicePtr> base = driver->MemAlloc(2 * sizeof(std::uint64_t));
  if (!base.ok()) {
    return absl::Status(base.status().code(),
                        absl::StrFormat("allocating the RNG replay slots (16 bytes) failed: %s; call "
                                        "Generator::BeginCapture before the stream capture begins",
                                        base.status().message()));
  }
  return std::shared_ptr<RngSlots>(new RngSlots(std::move(driver), *base));
}

RngSlots::~RngSlots() {
  absl::Status s = driver_->MemFree(base_);
  if (!s.ok()) {
    std::fprintf(
        stderr,
        "graphalloc rng: warning: freeing RNG replay slots at 0x%llx failed (%s); the free is deferred "
        "and retried at the next slot allocation or RetryDeferredSlotFrees()\n",
        static_cast<unsigned long long>(base_), std::string(s.message()).c_str());
    MutexLock lock(&Deferred().mu);
    Deferred().pending.emplace_back(driver_, base_);
  }
}

Generator::Generator(std::shared_ptr<Driver> driver, std::uint64_t seed)
    : driver_(std::move(driver)), id_(next_generator_id.fetch_add(1)), seed_(seed) {}

std::uint64_t Generator::seed() const {
  MutexLock lock(&mu_);
  return seed_;
}

std::uint64_t Generator::host_offset() const {
  MutexLock lock(&mu_);
  return offset_;
}

bool Generator::capturing() const {
  MutexLock lock(&mu_);
  return capture_.has_value();
}

absl::Status Generator::ManualSeed(std::uint64_t seed) {
  MutexLock lock(&mu_);
  if (capture_.has_value()) {
    if (seed == seed_) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrFormat(
        "Generator::ManualSeed(%d) during capture %d: a captured graph reads the seed at replay, so it can "
        "only be set to the current seed %d while capturing; seed before BeginCapture or after EndCapture",
        seed, capture_->capture_id, seed_));
  }
  seed_ = seed;
  offset_ = 0;
  return absl::OkStatus();
}

GeneratorState Generator::SaveState() const {
  MutexLock lock(&mu_);
  if (capture_.has_value()) return GeneratorState{seed_, capture_->intragraph_offset, capture_->capture_id};
  return GeneratorState{seed_, offset_, 0};
}

absl::Status Generator::RestoreState(const GeneratorState& state) {
  MutexLock lock(&mu_);
  if (state.offset % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Generator::RestoreState: offset %d is not a multiple of 4 (offsets advance in "
                        "curand4 blocks); pass a "
                        "state from SaveState()",
                        state.offset));
  }
  if (capture_.has_value()) {
    if (state.capture_id != capture_->capture_id) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Generator::RestoreState during capture %d: the state was saved %s; only a state saved during the "
          "same capture can be restored while capturing (an eager position would be frozen into the graph)",
          capture_->capture_id,
          state.capture_id == 0 ? std::string("outside any capture")
                                : absl::StrFormat("during capture %d", state.capture_id)));
    }
    if (state.seed != seed_) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Generator::RestoreState during capture %d: state seed %d differs from the generator's seed %d",
          capture_->capture_id, state.seed, seed_));
    }
    capture_->intragraph_offset = state.offset;
    return absl::OkStatus();
  }
  if (state.capture_id != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Generator::RestoreState: the state is relative to capture %d, which is not active; restore it only "
        "during that capture, or save an eager state outside captures",
        state.capture_id));
  }
  seed_ = state.seed;
  offset_ = state.offset;
  return absl::OkStatus();
}

absl::StatusOr<PhiloxArgs> Generator::Reserve(std::uint64_t increment) {
  const std::uint64_t rounded = RoundUp4(increment);
  if (rounded < increment) {
    return absl::OutOfRangeError(absl::StrFormat("Generator::Reserve(%d): increment overflows", increment));
  }
  MutexLock lock(&mu_);
  if (const std::string_view* recording = RecordingScope::Active();
      recording != nullptr && !capture_.has_value()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Generator::Reserve(%d): generator %d was drawn from while graph-tree function '%s' was being "
        "recorded, "
        "but it is not in that function's FunctionOptions::generators: the graph would bake in its current "
        "(seed, offset) and every replay would draw the same numbers; list the generator in "
        "FunctionOptions::generators",
        increment, id_, *recording));
  }
  std::uint64_t& offset = capture_.has_value() ? capture_->intragraph_offset : offset_;
  if (offset + rounded < offset) {
    return absl::OutOfRangeError(absl::StrFormat(
        "Generator::Reserve(%d): the Philox offset %d would overflow 2^64; reseed the generator", increment,
        offset));
  }
  const std::uint64_t start = offset;
  offset += rounded;
  if (capture_.has_value()) {
    return PhiloxArgs::Captured(capture_->slots->seed_address(), capture_->slots->offset_address(), start);
  }
  PhiloxArgs args = PhiloxArgs::Eager(seed_, start);
  args.generator = id_;
  return args;
}

absl::StatusOr<PhiloxArgs> Generator::Reserve(std::uint64_t increment, Stream stream) {
  if (!capturing()) {
    // A driver query with no lock held; a capture this generator is not in cannot begin meanwhile without
    // the caller's doing (it owns the stream).
    absl::StatusOr<CaptureInfo> info = driver_->GetCaptureInfo(stream);
    if (!info.ok()) return info.status();
    if (info->status != CaptureStatus::kNone) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Generator::Reserve(%d) on stream 0x%x: generator %d is drawn from during a CUDA graph capture "
          "(capture %d) it does not take part in: the graph would bake in its current (seed, offset) and "
          "every replay would draw the same numbers; call its BeginCapture before the capture begins and "
          "EndCapture after it ends (a graph tree does that for FunctionOptions::generators)",
          increment, static_cast<std::uintptr_t>(stream), id_, info->id));
    }
  }
  return Reserve(increment);
}

absl::Status Generator::BeginCapture(std::uint64_t capture_id) {
  if (capture_id == 0) {
    return absl::InvalidArgumentError("Generator::BeginCapture: capture id 0 is reserved for eager states");
  }
  {
    MutexLock lock(&mu_);
    if (capture_.has_value()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Generator::BeginCapture(%d): the generator is already in capture %d; end or cancel it first, or "
          "use another Generator for a concurrent capture",
          capture_id, capture_->capture_id));
    }
  }
  // Kernels loaded and slots allocated (driver calls) without the lock held, before the stream capture
  // begins.
  if (absl::Status s = PrepareKernelsForCapture(*driver_); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<RngSlots>> slots = RngSlots::Allocate(driver_);
  if (!slots.ok()) return slots.status();
  MutexLock lock(&mu_);
  if (capture_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("Generator::BeginCapture(%d): another thread began capture %d meanwhile", capture_id,
                        capture_->capture_id));
  }
  capture_ = ActiveCapture{capture_id, 0, std::move(*slots)};
  return absl::OkStatus();
}

absl::StatusOr<CapturedRng> Generator::EndCapture() {
  std::optional<ActiveCapture> ended;
  {
    MutexLock lock(&mu_);
    if (!capture_.has_value()) {
      return absl::FailedPreconditionError(
          "Generator::EndCapture: no capture is active; call BeginCapture first");
    }
    ended.swap(capture_);
  }
  CapturedRng captured;
  captured.generator_id = id_;
  captured.capture_id = ended->capture_id;
  captured.increment = ended->intragraph_offset;
  // A graph that draws nothing needs no slots (and no replay prologue); they are released here.
  if (captured.increment > 0) captured.slots = std::move(ended->slots);
  return captured;
}

absl::Status Generator::CancelCapture() {
  std::optional<ActiveCapture> cancelled;
  MutexLock lock(&mu_);
  if (!capture_.has_value()) {
    return absl::FailedPreconditionError("Generator::CancelCapture: no capture is active");
  }
  cancelled.swap(capture_);
  return absl::OkStatus();
}

absl::Status Generator::PrepareReplay(const CapturedRng& captured, Stream stream) {
  if (captured.generator_id != id_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Generator::PrepareReplay: the CapturedRng of capture %d belongs to generator %d, "
                        "not to generator %d; "
                        "prepare each graph's replay on the generator it was captured with",
                        captured.capture_id, captured.generator_id, id_));
  }
  if (captured.increment == 0) return absl::OkStatus();
  if (captured.slots == nullptr || captured.increment % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Generator::PrepareReplay: capture %d has increment %d but %s; pass the CapturedRng EndCapture "
        "returned",
        captured.capture_id, captured.increment,
        captured.slots == nullptr ? "no device slots" : "the increment is not a multiple of 4"));
  }
  absl::StatusOr<CaptureInfo> info = driver_->GetCaptureInfo(stream);
  if (!info.ok()) return info.status();
  if (info->status != CaptureStatus::kNone) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Generator::PrepareReplay(capture %d): the stream is capturing, so the slot write would be captured "
        "instead of run; prepare and launch the replay on a stream that is not capturing",
        captured.capture_id));
  }
  std::uint64_t seed, base;
  {
    MutexLock lock(&mu_);
    if (offset_ + captured.increment < offset_) {
      return absl::OutOfRangeError(absl::StrFormat(
          "Generator::PrepareReplay: the Philox offset %d + increment %d would overflow 2^64; reseed",
          offset_, captured.increment));
    }
    seed = seed_;
    base = offset_;
    // Advanced before the write is enqueued: a failed write skips these numbers, it never reuses them.
    offset_ += captured.increment;
  }
  return WritePhiloxSlots(*driver_, stream, captured.slots->base(), seed, base);
}

absl::StatusOr<std::unique_ptr<CaptureParticipant::Captured>> Generator::OnCaptureEnd() {
  absl::StatusOr<CapturedRng> captured = EndCapture();
  if (!captured.ok()) return captured.status();
  return std::make_unique<TreeCapturedRng>(std::move(*captured));
}

absl::Status Generator::ArmReplay(const Captured& captured, Stream stream) {
  const auto* mine = dynamic_cast<const TreeCapturedRng*>(&captured);
  if (mine == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Generator::ArmReplay: generator %d was handed the captured state of another participant; pass what "
        "its OnCaptureEnd returned",
        id_));
  }
  return PrepareReplay(mine->rng, stream);
}

}  // namespace graphalloc

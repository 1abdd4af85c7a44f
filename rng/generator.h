// Generator: the graph-safe Philox generator state (seed, offset) that random kernels reserve counter space
// from, and GeneratorState, the VALUE you save and restore (docs/rng.md explains the design).
//
// Eager use: Reserve(increment) returns PhiloxArgs{seed, offset} for one kernel and advances the offset by
// the increment rounded up to a multiple of 4 (cuRAND draws four words at a time; docs/rng.md, "Offsets").
//
// Graph safety (docs/rng.md, "Generators in graphs": one pair of device slots per capture):
//   1. BeginCapture(id) BEFORE the stream capture begins: allocates this capture's two device slots
//      (seed, base offset) with Driver::MemAlloc, outside any private pool (MemAlloc is illegal during a
//      global capture, and a pool reset must never recycle them).
//   2. While capturing, Reserve() returns captured PhiloxArgs (slot addresses + an intra-graph offset) and
//      advances only the intra-graph offset; the host offset is unchanged by a capture.
//   3. EndCapture() returns CapturedRng {increment, slots}: keep it with the graph.
//   4. Before every launch of the graph, PrepareReplay(captured, stream) enqueues a write of (seed, current
//      offset) into the slots on the launch stream, then advances the host offset by the whole-graph
//      increment, exactly as if the graph were one kernel. A sequence of replays and eager calls therefore
//      draws exactly what the same sequence of eager calls would.
// Each capture has its own slots, so graphs sharing a generator may be replayed in any host order, and even
// concurrently on different streams (each replay publishes its base to its own slots). The slots live as
// long as any CapturedRng that holds them: keep it at least as long as the graph exec (destroy the exec,
// and let its launches finish, first). A graph that draws nothing (increment 0) holds no slots and its
// PrepareReplay does nothing.
// A Generator is the graph tree's capture participant (graph/capture_participant.h): listed in
// FunctionOptions::generators, the tree runs steps 1 to 4 for every recording and launch. Reserve() outside
// capture mode while a recording is under way on the same thread (graph's RecordingScope) is refused, and
// so is a draw during any other capture the generator takes no part in (Reserve(increment, stream), and
// the random ops given eager values of a generator on a capturing stream): never baked-in state.
// One capture at a time per generator: while it is active, every Reserve() on this generator belongs to
// it, from any thread; eager work that must run concurrently uses another Generator.
// Seeding during a capture is an error unless it sets the same seed.
//
// THE CLASSIC BUG (docs/rng.md, "Save a value, never a generator"): saving a reference to a live generator
// in the forward and "restoring" it in the backward restores wherever it has advanced to since, and the
// recomputed dropout mask differs.
// A Generator is therefore neither copyable nor movable, and the only way to save its position is
// SaveState(), which returns a GeneratorState value that never changes afterwards. RestoreState() takes
// such a value. During a capture SaveState() returns a capture-relative value (the intra-graph offset),
// which RestoreState() accepts during the same capture: recomputations inside a graph then bake the same
// intra-graph offsets as their forward, and every replay reproduces the masks relative to its own base.
#ifndef GRAPHALLOC_RNG_GENERATOR_H_
#define GRAPHALLOC_RNG_GENERATOR_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/graph/capture_participant.h"
#include "graphalloc/rng/philox_args.h"

namespace graphalloc {

// PyTorch's default CUDA seed (c10::detail::default_rng_seed_val).
inline constexpr std::uint64_t kDefaultRngSeed = 67280421310721ull;

// A snapshot of a generator's position: an immutable value. capture_id == 0: an eager (seed, offset);
// otherwise `offset` is relative to the start of capture `capture_id`.
struct GeneratorState {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  std::uint64_t capture_id = 0;
  friend bool operator==(const GeneratorState&, const GeneratorState&) = default;
};

// Two device-resident uint64 slots, [0] = seed, [1] = base offset, read by one capture's kernels at
// replay. Freed with Driver::MemFree when the last owner lets go; a free the driver refuses (for example
// during another stream capture) is retried later (RetryDeferredSlotFrees), never leaked silently.
class RngSlots {
 public:
  static absl::StatusOr<std::shared_ptr<RngSlots>> Allocate(std::shared_ptr<Driver> driver);
  ~RngSlots();
  RngSlots(const RngSlots&) = delete;
  RngSlots& operator=(const RngSlots&) = delete;

  DevicePtr seed_address() const { return base_; }
  DevicePtr offset_address() const { return base_ + sizeof(std::uint64_t); }
  DevicePtr base() const { return base_; }

 private:
  RngSlots(std::shared_ptr<Driver> driver, DevicePtr base) : driver_(std::move(driver)), base_(base) {}
  std::shared_ptr<Driver> driver_;
  DevicePtr base_;
};

// Frees slots whose MemFree failed earlier; returns how many are still pending.
std::size_t RetryDeferredSlotFrees();

// What a capture consumed and where its kernels read their base: keep it with the graph.
struct CapturedRng {
  std::uint64_t generator_id = 0;
  std::uint64_t capture_id = 0;
  std::uint64_t increment = 0;            // words per thread the whole graph consumes (a multiple of 4)
  std::shared_ptr<const RngSlots> slots;  // null when increment == 0
};

class Generator final : public CaptureParticipant {
 public:
  explicit Generator(std::shared_ptr<Driver> driver, std::uint64_t seed = kDefaultRngSeed);
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // A unique id, so a CapturedRng cannot be replayed against the wrong generator.
  std::uint64_t id() const { return id_; }
  std::uint64_t seed() const;
  // The host offset (words per thread). Unchanged by a capture.
  std::uint64_t host_offset() const;
  bool capturing() const;

  // Sets the seed and resets the offset to 0. During a capture: OK (and no change) when `seed` equals the
  // current seed, FailedPrecondition otherwise.
  absl::Status ManualSeed(std::uint64_t seed);

  // A value snapshot of the position (capture-relative during a capture).
  GeneratorState SaveState() const;
  // Moves the generator to `state`: an eager state outside a capture (offset a multiple of 4), or a state
  // saved during the current capture (rewinds the intra-graph offset; same seed). Anything else is
  // FailedPrecondition / InvalidArgument.
  absl::Status RestoreState(const GeneratorState& state);

  // Reserves `increment` words per thread (rounded up to a multiple of 4) for one kernel. Outside capture
  // mode while a graph is being recorded on this thread (RecordingScope::Active()): FailedPrecondition,
  // nothing reserved.
  absl::StatusOr<PhiloxArgs> Reserve(std::uint64_t increment);
  // The same for a kernel launched on `stream`, which is checked: outside capture mode, a `stream` that is
  // capturing a graph (a raw capture this generator takes no part in, not the graph tree's) is
  // FailedPrecondition naming the generator and the capture, nothing reserved, since the graph would bake
  // the eager (seed, offset) in and every replay draw the same numbers. (The random ops check eager values
  // of a generator against their stream too.)
  absl::StatusOr<PhiloxArgs> Reserve(std::uint64_t increment, Stream stream);

  // Graph capture protocol (see the top of this file). `capture_id` is the caller's non-zero id of the
  // capture (e.g. a graph session id); it tags capture-relative states.
  absl::Status BeginCapture(std::uint64_t capture_id);
  absl::StatusOr<CapturedRng> EndCapture();
  // Abandons the active capture (the stream capture failed): no state changes, slots are released.
  absl::Status CancelCapture();
  // Before each launch of the graph on `stream` (which must not be capturing).
  absl::Status PrepareReplay(const CapturedRng& captured, Stream stream);

  // ---- CaptureParticipant: the graph tree's recordings, through the protocol above. ----
  absl::Status OnCaptureBegin(std::uint64_t capture_id) override { return BeginCapture(capture_id); }
  // A CapturedRng, kept by the tree with the recorded node.
  absl::StatusOr<std::unique_ptr<Captured>> OnCaptureEnd() override;
  void OnCaptureCancel() override { (void)CancelCapture(); }
  // PrepareReplay of the CapturedRng that OnCaptureEnd returned.
  absl::Status ArmReplay(const Captured& captured, Stream stream) override;

 private:
  struct ActiveCapture {
    std::uint64_t capture_id = 0;
    std::uint64_t intragraph_offset = 0;
    std::shared_ptr<RngSlots> slots;
  };

  const std::shared_ptr<Driver> driver_;
  const std::uint64_t id_;
  mutable Mutex mu_;
  std::uint64_t seed_ ABSL_GUARDED_BY(mu_);
  std::uint64_t offset_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<ActiveCapture> capture_ ABSL_GUARDED_BY(mu_);
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_RNG_GENERATOR_H_

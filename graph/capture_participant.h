// CaptureParticipant: the graph tree's interface to what takes part in its recordings from outside the
// graph layer (a random generator, rng/generator.h, is the one the project ships), and RecordingScope,
// which tells anyone on the recording thread that a recording is under way.
//
// A graph freezes the arguments its kernels were launched with. State that a function reads on the host
// while it is recorded, and that must be different at every launch (a generator's seed and offset), would
// be frozen with them. A participant keeps such state where the graph can read it at launch time instead,
// and the tree drives it through one recording and every launch of it:
//   1. OnCaptureBegin(capture_id) before the stream capture begins: the participant enters capture mode
//      and may allocate what the graph will read (a capture forbids allocating device memory);
//      `capture_id` is non-zero and unique in the process.
//   2. While the function is captured it uses the participant on the recording thread as usual; in capture
//      mode, the participant hands out what may be frozen (addresses of its device state, offsets relative
//      to the capture), never its current values.
//   3. OnCaptureEnd() right after the capture succeeded: it leaves capture mode and returns what it keeps
//      for this recording (a Captured: opaque to the tree, which holds it with the recorded node for as long
//      as the node's graph lives). OnCaptureCancel() instead when the capture, or another participant's
//      begin or end, failed: it leaves capture mode as if the capture had never begun.
//   4. ArmReplay(captured, stream) before every launch of the graph, the first one right after recording
//      included, on the launch stream (never capturing): the participant enqueues what makes this launch
//      see its current state, and moves that state on as the launch will.
// The tree begins a function's participants in the order listed (FunctionOptions::generators), all of them
// before its capture, and ends or cancels every one it began, so none stays in capture mode. Warmup and
// eager calls do not involve participants: the function uses them as it would without a tree. A participant
// takes part in one capture at a time.
#ifndef GRAPHALLOC_GRAPH_CAPTURE_PARTICIPANT_H_
#define GRAPHALLOC_GRAPH_CAPTURE_PARTICIPANT_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class CaptureParticipant {
 public:
  // What a participant keeps for one recording; only the participant that returned it reads it.
  class Captured {
   public:
    virtual ~Captured() = default;
  };

  virtual ~CaptureParticipant() = default;

  virtual absl::Status OnCaptureBegin(std::uint64_t capture_id) = 0;
  virtual absl::StatusOr<std::unique_ptr<Captured>> OnCaptureEnd() = 0;
  virtual void OnCaptureCancel() = 0;
  // `captured` is what this participant's OnCaptureEnd returned for the graph about to be launched.
  virtual absl::Status ArmReplay(const Captured& captured, Stream stream) = 0;
};

// Marks the calling thread as recording `function` for as long as it lives (the tree holds one around a
// function's body while it is captured; scopes nest). Something that should have been a participant of
// that recording but is not (a generator the function did not list) finds out through Active() and refuses
// to hand out its current state, naming the function, instead of letting the graph freeze it. Work on other
// threads during the recording is not marked.
class RecordingScope {
 public:
  // `function` names what is being recorded, for messages; it must outlive the scope.
  explicit RecordingScope(std::string_view function);
  ~RecordingScope();
  RecordingScope(const RecordingScope&) = delete;
  RecordingScope& operator=(const RecordingScope&) = delete;

  // The function the innermost scope on this thread records, or nullptr when none.
  static const std::string_view* Active();

 private:
  std::string_view function_;
  const std::string_view* outer_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_GRAPH_CAPTURE_PARTICIPANT_H_

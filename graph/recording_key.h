// What a recording of a tree function is matched on, and why a call did not match any.
//
// A recorded graph bakes in the addresses of the buffers it reads without copying: static inputs (the
// caller promised their address stays fixed, like parameters) and managed inputs (outputs of earlier
// recorded calls of the same step, at stable pool addresses). Copied inputs are copied into the graph's
// own buffers, so only their size is baked in. A call can replay a recording when, input by input, the
// role, the size and (for static and managed inputs) the address are the recording's: that is the key.
//
// Keys are hashed so that finding the matching sibling among a call site's recordings is one hash lookup,
// not a scan; the hash covers exactly what equality compares.
#ifndef GRAPHALLOC_GRAPH_RECORDING_KEY_H_
#define GRAPHALLOC_GRAPH_RECORDING_KEY_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

enum class InputRole : std::uint8_t {
  kCopied,   // copied into a graph-owned buffer on every call; only the size is part of the key
  kStatic,   // declared static: read in place, address checked
  kManaged,  // an output of an earlier recorded call of this step: read in place, address checked
};

const char* InputRoleName(InputRole role);

struct KeyInput {
  InputRole role = InputRole::kCopied;
  DevicePtr ptr = 0;  // 0 for copied inputs: their address does not matter
  std::size_t bytes = 0;
  // What the caller says the bytes are (CallInput::layout: a tensor's dtype, shape and strides, hashed),
  // or 0. Two calls with the same bytes in another shape must not share a recording.
  std::uint64_t layout = 0;

  friend bool operator==(const KeyInput&, const KeyInput&) = default;
};

// The key of one call: its inputs in order, and their hash.
struct RecordingKey {
  std::vector<KeyInput> inputs;
  std::uint64_t hash = 0;

  // Recomputes `hash` from `inputs`.
  void Rehash();
  friend bool operator==(const RecordingKey& a, const RecordingKey& b) {
    return a.hash == b.hash && a.inputs == b.inputs;
  }
};

std::uint64_t HashKeyInputs(std::span<const KeyInput> inputs);

// Why a call found no recording to replay. The first recording at a call site has reason kFirst; every
// other recording there is a re-record, counted against the site's limit.
enum class RerecordReason : std::uint8_t {
  kFirst,          // nothing recorded there yet
  kStaticAddress,  // a static input's address changed
  kManagedInput,   // a managed input's address changed, or an input became (or stopped being) managed
  kInputSize,      // an input's size, or the number of inputs, changed
  kLiveness,       // an output the recording saw dead (and may overwrite) is live now
  kInputLayout,    // an input's layout (CallInput::layout) changed, its size did not
};
inline constexpr int kRerecordReasonCount = 6;

const char* RerecordReasonName(RerecordReason reason);

// The first difference between a recording's key and a call's, for messages and the tree dump.
struct KeyMismatch {
  RerecordReason reason = RerecordReason::kFirst;
  std::size_t input = 0;  // the input that differs (kStaticAddress, kManagedInput, kInputSize)
  KeyInput recorded;      // what the recording has at `input` (default when the input count changed)
  KeyInput now;           // what the call passed
  // kLiveness: the path output (depth, index) that is live now and was dead at recording.
  std::size_t depth = 0;
  std::size_t output = 0;
  std::size_t differences = 0;  // how many inputs differ in all (to pick the closest recording)
  bool input_count_changed = false;
};

// Compares a recording's key with a call's (whose keys differ). Addresses before sizes before roles: the
// address is what users change (a re-allocated parameter), so that is what the message names.
KeyMismatch CompareKeys(const RecordingKey& recorded, const RecordingKey& now);

// One line for logs and errors, e.g. "static input 1 changed address from 0x7f00 to 0x7f80".
std::string DescribeMismatch(const KeyMismatch& mismatch);

}  // namespace graphalloc

#endif  // GRAPHALLOC_GRAPH_RECORDING_KEY_H_

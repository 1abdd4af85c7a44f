#include "graphalloc/graph/recording_key.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace graphalloc {
namespace {

// splitmix64's finalizer: cheap, and every input bit reaches every output bit, so keys that differ only
// in one address's low bits (neighbouring blocks) still land in different buckets.
inline std::uint64_t Mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

const char* InputRoleName(InputRole role) {
  switch (role) {
    case InputRole::kCopied:
      return "copied";
    case InputRole::kStatic:
      return "static";
    case InputRole::kManaged:
      return "managed";
  }
  return "?";
}

const char* RerecordReasonName(RerecordReason reason) {
  switch (reason) {
    case RerecordReason::kFirst:
      return "first recording";
    case RerecordReason::kStaticAddress:
      return "static input address changed";
    case RerecordReason::kManagedInput:
      return "managed input changed";
    case RerecordReason::kInputSize:
      return "input size changed";
    case RerecordReason::kLiveness:
      return "output liveness changed";
    case RerecordReason::kInputLayout:
      return "input layout changed";
  }
  return "?";
}

std::uint64_t HashKeyInputs(std::span<const KeyInput> inputs) {
  std::uint64_t h = Mix(inputs.size() + 0x9e3779b97f4a7c15ULL);
  for (const KeyInput& in : inputs) {
    h = Mix(h ^ (in.ptr + static_cast<std::uint64_t>(in.role)));
    h = Mix(h ^ in.bytes);
    if (in.layout != 0) h = Mix(h ^ in.layout);
  }
  return h;
}

void RecordingKey::Rehash() { hash = HashKeyInputs(inputs); }

KeyMismatch CompareKeys(const RecordingKey& recorded, const RecordingKey& now) {
  KeyMismatch m;
  const std::size_t common = std::min(recorded.inputs.size(), now.inputs.size());
  bool found = false;
  int best_rank = 4;
  for (std::size_t i = 0; i < common; ++i) {
    const KeyInput& r = recorded.inputs[i];
    const KeyInput& n = now.inputs[i];
    if (r == n) continue;
    ++m.differences;
    // Rank: a static address change first (the case the limit and the warning are about), then managed
    // changes, then sizes.
    int rank = 3;
    RerecordReason reason = r.bytes == n.bytes && r.layout != n.layout ? RerecordReason::kInputLayout
                                                                       : RerecordReason::kInputSize;
    if (r.role != n.role || (r.role == InputRole::kManaged && r.ptr != n.ptr)) {
      rank = 2;
      reason = RerecordReason::kManagedInput;
    }
    if (r.role == InputRole::kStatic && n.role == InputRole::kStatic && r.ptr != n.ptr) {
      rank = 1;
      reason = RerecordReason::kStaticAddress;
    }
    if (!found || rank < best_rank) {
      found = true;
      best_rank = rank;
      m.reason = reason;
      m.input = i;
      m.recorded = r;
      m.now = n;
    }
  }
  if (recorded.inputs.size() != now.inputs.size()) {
    m.differences += std::max(recorded.inputs.size(), now.inputs.size()) - common;
    if (!found) {
      m.reason = RerecordReason::kInputSize;
      m.input_count_changed = true;
      m.input = common;
      if (common < recorded.inputs.size()) m.recorded = recorded.inputs[common];
      if (common < now.inputs.size()) m.now = now.inputs[common];
    }
  }
  return m;
}

std::string DescribeMismatch(const KeyMismatch& m) {
  switch (m.reason) {
    case RerecordReason::kFirst:
      return "first recording";
    case RerecordReason::kStaticAddress:
      return absl::StrFormat("static input %d changed address from 0x%x to 0x%x", m.input, m.recorded.ptr,
                             m.now.ptr);
    case RerecordReason::kManagedInput:
      return absl::StrFormat("input %d changed from %s at 0x%x to %s at 0x%x", m.input,
                             InputRoleName(m.recorded.role), m.recorded.ptr, InputRoleName(m.now.role),
                             m.now.ptr);
    case RerecordReason::kInputSize:
      if (m.input_count_changed) {
        return absl::StrFormat("the number of inputs changed (input %d is new or gone)", m.input);
      }
      return absl::StrFormat("input %d changed size from %d to %d bytes", m.input, m.recorded.bytes,
                             m.now.bytes);
    case RerecordReason::kLiveness:
      return absl::StrFormat(
          "output %d of the call at depth %d is live, but was dead when this was recorded (a replay could "
          "overwrite it)",
          m.output, m.depth);
    case RerecordReason::kInputLayout:
      return absl::StrFormat("input %d changed layout (dtype, shape or strides) at the same size of %d bytes",
                             m.input, m.now.bytes);
  }
  return "?";
}

}  // namespace graphalloc

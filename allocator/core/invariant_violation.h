// The error every invariant check returns (CachingAllocator::CheckInvariants), one wording for all.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_INVARIANT_VIOLATION_H_
#define GRAPHALLOC_ALLOCATOR_CORE_INVARIANT_VIOLATION_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace graphalloc {

inline absl::Status InvariantViolation(absl::string_view what) {
  return absl::InternalError(absl::StrCat("allocator invariant violated: ", what));
}

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_INVARIANT_VIOLATION_H_

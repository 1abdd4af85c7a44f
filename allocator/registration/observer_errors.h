// What the registration observers keep of their failures: an observer cannot fail the map it is told of
// (mapping_observer.h), so each keeps its first error, for the caller to ask, and counts them all.
#ifndef GRAPHALLOC_ALLOCATOR_REGISTRATION_OBSERVER_ERRORS_H_
#define GRAPHALLOC_ALLOCATOR_REGISTRATION_OBSERVER_ERRORS_H_

#include <cstddef>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "graphalloc/allocator/base/mutex.h"

namespace graphalloc {

class ObserverErrors {
 public:
  void Add(absl::Status status) {
    MutexLock lock(&mu_);
    ++count_;
    if (first_.ok()) first_ = std::move(status);
  }
  // The first error (OK if none).
  absl::Status first() const {
    MutexLock lock(&mu_);
    return first_;
  }
  std::size_t count() const {
    MutexLock lock(&mu_);
    return count_;
  }

 private:
  mutable Mutex mu_;
  absl::Status first_ ABSL_GUARDED_BY(mu_);
  std::size_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_REGISTRATION_OBSERVER_ERRORS_H_

// Early returns for absl::Status and absl::StatusOr, the one copy every layer uses (Abseil ships none).
//
//   GRAPHALLOC_RETURN_IF_ERROR(driver.MemUnmap(ptr, size));          // returns the error, if any
//   GRAPHALLOC_ASSIGN_OR_RETURN(DevicePtr p, driver.MemAlloc(size));  // declares p, or returns the error
#ifndef GRAPHALLOC_ALLOCATOR_BASE_STATUS_MACROS_H_
#define GRAPHALLOC_ALLOCATOR_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define GRAPHALLOC_RETURN_IF_ERROR(expr)                                        \
  do {                                                                          \
    if (::absl::Status graphalloc_status_ = (expr); !graphalloc_status_.ok()) { \
      return graphalloc_status_;                                                \
    }                                                                           \
  } while (false)

#define GRAPHALLOC_STATUS_CONCAT_(a, b) a##b
#define GRAPHALLOC_STATUS_CONCAT(a, b) GRAPHALLOC_STATUS_CONCAT_(a, b)
#define GRAPHALLOC_ASSIGN_OR_RETURN(lhs, expr) \
  GRAPHALLOC_ASSIGN_OR_RETURN_IMPL_(GRAPHALLOC_STATUS_CONCAT(graphalloc_statusor_, __LINE__), lhs, expr)
#define GRAPHALLOC_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                                      \
  if (!var.ok()) return std::move(var).status();          \
  lhs = std::move(*var)

#endif  // GRAPHALLOC_ALLOCATOR_BASE_STATUS_MACROS_H_

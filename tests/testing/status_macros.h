// ASSERT_OK and ASSERT_OK_AND_ASSIGN for absl::Status / absl::StatusOr in GoogleTest tests (Debian's
// GoogleTest and Abseil ship no status matchers).
#ifndef GRAPHALLOC_TESTS_TESTING_STATUS_MACROS_H_
#define GRAPHALLOC_TESTS_TESTING_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "gtest/gtest.h"

#define GA_CAT_(a, b) a##b
#define GA_CAT(a, b) GA_CAT_(a, b)
#define ASSERT_OK(expr)                         \
  do {                                          \
    const absl::Status ga_status_ = (expr);     \
    ASSERT_TRUE(ga_status_.ok()) << ga_status_; \
  } while (false)
// Records a failure (the test goes on) when the status is an error; more context may be streamed in.
#define EXPECT_OK(expr)                                            \
  switch (0)                                                       \
  case 0:                                                          \
  default:                                                         \
    if (const absl::Status ga_status_ = (expr); ga_status_.ok()) { \
    } else                                                         \
      ADD_FAILURE() << ga_status_ << " "
// Declares or assigns `lhs` from a StatusOr expression, failing the test (and returning) on an error.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) ASSERT_OK_AND_ASSIGN_IMPL(GA_CAT(ga_sor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL(var, lhs, expr) \
  auto var = (expr);                              \
  ASSERT_TRUE(var.ok()) << var.status();          \
  lhs = std::move(*var)

#endif  // GRAPHALLOC_TESTS_TESTING_STATUS_MACROS_H_

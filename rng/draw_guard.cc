#include "graphalloc/rng/draw_guard.h"

namespace graphalloc {
namespace {
thread_local const std::string_view* active_guard = nullptr;
}  // namespace

DrawGuard::DrawGuard(std::string_view function) : function_(function), outer_(active_guard) {
  active_guard = &function_;
}

DrawGuard::~DrawGuard() { active_guard = outer_; }

const std::string_view* DrawGuard::Active() { return active_guard; }

}  // namespace graphalloc

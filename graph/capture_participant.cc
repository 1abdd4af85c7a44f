#include "graphalloc/graph/capture_participant.h"

namespace graphalloc {
namespace {
thread_local const std::string_view* active_scope = nullptr;
}  // namespace

RecordingScope::RecordingScope(std::string_view function) : function_(function), outer_(active_scope) {
  active_scope = &function_;
}

RecordingScope::~RecordingScope() { active_scope = outer_; }

const std::string_view* RecordingScope::Active() { return active_scope; }

}  // namespace graphalloc

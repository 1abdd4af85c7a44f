// The process-wide annotation table of history_ring.h: interned strings, looked up by id when a history
// is read.
#include <deque>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/history/history_ring.h"

namespace graphalloc {
namespace history_internal {
constinit thread_local std::uint32_t current_annotation = 0;
}  // namespace history_internal

namespace {

struct AnnotationTable {
  Mutex mu;
  absl::flat_hash_map<std::string, std::uint32_t> ids ABSL_GUARDED_BY(mu);
  std::deque<std::string> texts ABSL_GUARDED_BY(mu);  // texts[id - 1]
};

AnnotationTable& Table() {
  static AnnotationTable* table = new AnnotationTable();  // never destroyed: threads may annotate at exit
  return *table;
}

}  // namespace

std::uint32_t InternAnnotation(absl::string_view text) {
  if (text.empty()) return 0;
  AnnotationTable& table = Table();
  MutexLock lock(&table.mu);
  auto [it, inserted] = table.ids.try_emplace(std::string(text), 0);
  if (inserted) {
    table.texts.emplace_back(text);
    it->second = static_cast<std::uint32_t>(table.texts.size());
  }
  return it->second;
}

std::string AnnotationText(std::uint32_t id) {
  if (id == 0) return {};
  AnnotationTable& table = Table();
  MutexLock lock(&table.mu);
  if (id > table.texts.size()) return {};
  return table.texts[id - 1];
}

}  // namespace graphalloc

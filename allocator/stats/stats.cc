#include "graphalloc/allocator/stats/stats.h"

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/stats/stat_names.h"

namespace graphalloc {

void DeviceStats::ResetAccumulated() {
  for (const StatArrayName& a : kStatArrays) {
    for (Stat& s : (this->*a.member).by_type) s.ResetAccumulated();
  }
  for (const StatCounterName& c : kStatCounters) {
    if (c.accumulated) this->*c.member = 0;
  }
}

void DeviceStats::ResetPeak() {
  for (const StatArrayName& a : kStatArrays) {
    for (Stat& s : (this->*a.member).by_type) s.ResetPeak();
  }
}

void AddBlockStats(DeviceStats& into, const DeviceStats& from) {
  for (const StatArrayName& a : kStatArrays) {
    if (a.scope != StatScope::kBlock) continue;
    for (int t = 0; t < kNumStatTypes; ++t) {
      Stat& to = (into.*a.member).by_type[t];
      const Stat& add = (from.*a.member).by_type[t];
      to.current += add.current;
      to.allocated += add.allocated;
      to.freed += add.freed;
    }
  }
}

void CopySegmentStats(DeviceStats& into, const DeviceStats& from) {
  for (const StatArrayName& a : kStatArrays) {
    if (a.scope == StatScope::kSegment) into.*a.member = from.*a.member;
  }
  for (const StatCounterName& c : kStatCounters) into.*c.member = from.*c.member;
}

std::string DeviceStats::ToJson() const {
  std::string out = "{";
  bool first = true;
  auto add = [&](absl::string_view prefix, const Stat& s) {
    for (const auto& [name, field] : kStatFields) {
      absl::StrAppend(&out, first ? "" : ", ", "\"", prefix, name, "\": ", s.*field);
      first = false;
    }
  };
  // PyTorch's order: the arrays kept per pool kind, then those it keeps for all pools only.
  for (const StatArrayName& a : kStatArrays) {
    if (a.pytorch_aggregate_only) continue;
    for (int t = 0; t < kNumStatTypes; ++t) {
      add(absl::StrCat(a.name, ".", kStatTypeNames[t], "."), (this->*a.member).by_type[t]);
    }
  }
  for (const StatArrayName& a : kStatArrays) {
    if (a.pytorch_aggregate_only) add(absl::StrCat(a.name, "."), (this->*a.member).all());
  }
  for (const StatCounterName& c : kStatCounters) {
    absl::StrAppend(&out, first ? "" : ", ", "\"", c.name, "\": ", this->*c.member);
    first = false;
  }
  out += "}";
  return out;
}

}  // namespace graphalloc

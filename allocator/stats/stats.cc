#include "graphalloc/allocator/stats/stats.h"

#include "absl/strings/str_cat.h"

namespace graphalloc {
namespace {

template <typename F>
void ForEachArray(DeviceStats& s, F f) {
  for (StatArray* a : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                       &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes,
                       &s.oversize_allocations, &s.oversize_segments}) {
    for (Stat& stat : a->by_type) f(stat);
  }
}

}  // namespace

void DeviceStats::ResetAccumulated() {
  ForEachArray(*this, [](Stat& s) { s.ResetAccumulated(); });
  num_alloc_retries = num_ooms = num_sync_all_streams = num_device_alloc = num_device_free = 0;
}

void DeviceStats::ResetPeak() {
  ForEachArray(*this, [](Stat& s) { s.ResetPeak(); });
}

void AddBlockStats(DeviceStats& into, const DeviceStats& from) {
  const std::pair<StatArray*, const StatArray*> arrays[] = {
      {&into.allocation, &from.allocation},
      {&into.active, &from.active},
      {&into.inactive_split, &from.inactive_split},
      {&into.allocated_bytes, &from.allocated_bytes},
      {&into.active_bytes, &from.active_bytes},
      {&into.inactive_split_bytes, &from.inactive_split_bytes},
      {&into.requested_bytes, &from.requested_bytes},
      {&into.oversize_allocations, &from.oversize_allocations},
  };
  for (auto [to, add] : arrays) {
    for (int t = 0; t < kNumStatTypes; ++t) {
      to->by_type[t].current += add->by_type[t].current;
      to->by_type[t].peak += add->by_type[t].peak;
      to->by_type[t].allocated += add->by_type[t].allocated;
      to->by_type[t].freed += add->by_type[t].freed;
    }
  }
}

void CopySegmentStats(DeviceStats& into, const DeviceStats& from) {
  into.segment = from.segment;
  into.reserved_bytes = from.reserved_bytes;
  into.oversize_segments = from.oversize_segments;
  into.num_alloc_retries = from.num_alloc_retries;
  into.num_ooms = from.num_ooms;
  into.num_sync_all_streams = from.num_sync_all_streams;
  into.num_device_alloc = from.num_device_alloc;
  into.num_device_free = from.num_device_free;
  into.max_split_size = from.max_split_size;
}

std::string DeviceStats::ToJson() const {
  std::string out = "{";
  bool first = true;
  auto add = [&](absl::string_view key, std::int64_t value) {
    absl::StrAppend(&out, first ? "" : ", ", "\"", key, "\": ", value);
    first = false;
  };
  const std::pair<absl::string_view, const StatArray*> arrays[] = {
      {"allocation", &allocation},
      {"segment", &segment},
      {"active", &active},
      {"inactive_split", &inactive_split},
      {"allocated_bytes", &allocated_bytes},
      {"reserved_bytes", &reserved_bytes},
      {"active_bytes", &active_bytes},
      {"inactive_split_bytes", &inactive_split_bytes},
      {"requested_bytes", &requested_bytes},
  };
  constexpr absl::string_view kTypes[] = {"all", "small_pool", "large_pool"};
  for (const auto& [name, array] : arrays) {
    for (int t = 0; t < kNumStatTypes; ++t) {
      const Stat& s = array->by_type[t];
      const std::string prefix = absl::StrCat(name, ".", kTypes[t], ".");
      add(prefix + "current", s.current);
      add(prefix + "peak", s.peak);
      add(prefix + "allocated", s.allocated);
      add(prefix + "freed", s.freed);
    }
  }
  // PyTorch keeps the oversize counters for all pools only, without the ".all" level.
  for (const auto& [name, array] :
       {std::pair<absl::string_view, const StatArray*>{"oversize_allocations", &oversize_allocations},
        {"oversize_segments", &oversize_segments}}) {
    const Stat& s = array->all();
    add(absl::StrCat(name, ".current"), s.current);
    add(absl::StrCat(name, ".peak"), s.peak);
    add(absl::StrCat(name, ".allocated"), s.allocated);
    add(absl::StrCat(name, ".freed"), s.freed);
  }
  add("num_alloc_retries", num_alloc_retries);
  add("num_ooms", num_ooms);
  add("num_sync_all_streams", num_sync_all_streams);
  add("num_device_alloc", num_device_alloc);
  add("num_device_free", num_device_free);
  add("max_split_size", max_split_size);
  out += "}";
  return out;
}

}  // namespace graphalloc

// What the simulated device really has mapped, and with which access, read back from /proc/self/maps: the
// stress tests compare it with what the allocator believes (its snapshot) and check that a block lies in
// accessible memory before touching it (touching memory without access crashes the test).
#ifndef GRAPHALLOC_TESTS_STRESS_SIM_MAPPINGS_H_
#define GRAPHALLOC_TESTS_STRESS_SIM_MAPPINGS_H_

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"
#include "gtest/gtest.h"

namespace graphalloc::testing {

// A range of device addresses; `accessible` when it is mapped and readable and writable.
struct Range {
  DevicePtr begin = 0;
  DevicePtr end = 0;
  bool accessible = false;
  friend bool operator==(const Range&, const Range&) = default;
};
inline std::ostream& operator<<(std::ostream& os, const Range& r) {
  return os << absl::StrFormat("[0x%x, 0x%x)%s", r.begin, r.end, r.accessible ? "" : " without access");
}

// Sorts and joins adjacent ranges of the same access.
inline std::vector<Range> Coalesce(std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> out;
  for (const Range& r : ranges) {
    if (!out.empty() && out.back().end == r.begin && out.back().accessible == r.accessible) {
      out.back().end = r.end;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

// The simulated device maps physical memory as a MAP_SHARED view of its memfd ("graphalloc-sim-device"),
// without access until MemSetAccess grants it.
inline std::vector<Range> SimDeviceMappings() {
  std::vector<Range> ranges;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("graphalloc-sim-device") == std::string::npos) continue;
    unsigned long long begin = 0, end = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %4s", &begin, &end, perms) != 3) continue;
    ranges.push_back({begin, end, perms[0] == 'r' && perms[1] == 'w'});
  }
  return Coalesce(std::move(ranges));
}

// Whether [ptr, ptr + size) lies wholly in one accessible range of `mappings`.
inline bool Accessible(const std::vector<Range>& mappings, DevicePtr ptr, std::size_t size) {
  return std::any_of(mappings.begin(), mappings.end(),
                     [&](const Range& r) { return r.accessible && r.begin <= ptr && ptr + size <= r.end; });
}

// Where memory is mapped agrees with the allocator's view of it, `snapshot`: inside each expandable segment
// the device has mapped exactly the ranges the snapshot says, with access exactly where the snapshot does
// not say otherwise (a chunk mapped without access that the allocator does not know of, or mapped where
// the allocator does not know, is caught here); every regular segment is accessible memory. Sets
// `*without_access` to whether the device has memory of expandable segments mapped without access.
inline ::testing::AssertionResult MappingsMatchSnapshot(const MemorySnapshot& snapshot,
                                                        bool* without_access) {
  const std::vector<Range> device = SimDeviceMappings();
  std::vector<Range> expected, found;
  for (const SegmentSnapshot& seg : snapshot.segments) {
    const DevicePtr begin = seg.address, end = seg.address + seg.total_size;
    if (!seg.expandable) {
      if (!Accessible(device, begin, end - begin)) {
        return ::testing::AssertionFailure()
               << "regular segment " << Range{begin, end, true} << " is not accessible device memory";
      }
      continue;
    }
    for (const MappedRange& m : seg.mapped)
      expected.push_back({begin + m.offset, begin + m.offset + m.size, m.accessible});
    for (const Range& r : device) {
      if (r.end > begin && r.begin < end)
        found.push_back({std::max(r.begin, begin), std::min(r.end, end), r.accessible});
    }
  }
  expected = Coalesce(std::move(expected));
  found = Coalesce(std::move(found));
  *without_access = std::any_of(found.begin(), found.end(), [](const Range& r) { return !r.accessible; });
  if (expected != found) {
    ::testing::AssertionResult failure = ::testing::AssertionFailure()
                                         << "expandable segments: the allocator has mapped";
    for (const Range& r : expected) failure << " " << r;
    failure << "; the device has mapped";
    for (const Range& r : found) failure << " " << r;
    return failure;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_STRESS_SIM_MAPPINGS_H_

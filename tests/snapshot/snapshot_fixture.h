// Test fixtures for the snapshot tests: a hand-built snapshot that uses every field of the data model
// (three pools, two streams, an expandable segment with a hole, all block states, stacks, annotations,
// every history action PyTorch has), with statistics that agree with its blocks; and a pool that slept,
// woke and sleeps again, for graphalloc's own actions (sleep, wake) and sleeping ranges.
#ifndef GRAPHALLOC_TESTS_SNAPSHOT_SNAPSHOT_FIXTURE_H_
#define GRAPHALLOC_TESTS_SNAPSHOT_SNAPSHOT_FIXTURE_H_

#include <cstdint>
#include <string>

#include "graphalloc/allocator/snapshot/memory_snapshot.h"

namespace graphalloc::testing {

// The fixture: 3 segments, 10 blocks (4 allocated, 1 pending free, 5 free), 15 history events.
MemorySnapshot MakeFixtureSnapshot();
inline constexpr int kFixtureBlocks = 10;

// A pool that sleeps: one expandable segment of pool 3 at kSleepingBase, 8 MiB of address space. Its
// history maps a 2 MiB and a 4 MiB chunk, allocates 2 MiB and 3 MiB in them, sleeps both chunks, wakes
// them, frees the 3 MiB block and sleeps both chunks again; the snapshot is taken asleep (the 6 MiB asleep,
// nothing mapped, the 2 MiB block still allocated), with statistics that agree. 12 history events; the
// reserved bytes after each are kSleepingReservedMiB.
MemorySnapshot MakeSleepingSnapshot();
inline constexpr std::uint64_t kSleepingBase = 0x7f0000000000;
inline constexpr std::int64_t kSleepingReservedMiB[12] = {2, 6, 6, 6, 4, 0, 2, 6, 6, 6, 4, 0};

// A fresh, empty directory for the calling test's files (under TEST_TMPDIR or /tmp); removed when the test
// passes, kept when it fails.
std::string TestDir();

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_SNAPSHOT_SNAPSHOT_FIXTURE_H_

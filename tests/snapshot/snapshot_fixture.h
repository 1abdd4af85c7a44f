// Test fixtures for the snapshot tests: a hand-built snapshot that uses every field of the data model
// (three pools, two streams, an expandable segment with a hole, all block states, stacks, annotations,
// every history action), with statistics that agree with its blocks.
#ifndef GRAPHALLOC_TESTS_SNAPSHOT_SNAPSHOT_FIXTURE_H_
#define GRAPHALLOC_TESTS_SNAPSHOT_SNAPSHOT_FIXTURE_H_

#include <string>

#include "graphalloc/allocator/snapshot/memory_snapshot.h"

namespace graphalloc::testing {

// The fixture: 3 segments, 10 blocks (4 allocated, 1 pending free, 5 free), 15 history events.
MemorySnapshot MakeFixtureSnapshot();
inline constexpr int kFixtureBlocks = 10;

// A fresh, empty directory for the calling test's files (under TEST_TMPDIR or /tmp); removed when the test
// passes, kept when it fails.
std::string TestDir();

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_SNAPSHOT_SNAPSHOT_FIXTURE_H_

// An out-of-memory error that explains itself: why memory that looks free could not serve a request, read
// from the allocator's state at the failure (a MemorySnapshot), so that the allocator's error (C++, the C
// ABI, PyTorch's OutOfMemoryError) and `graphalloc oom-report SNAPSHOT` say the same thing.
//
// The report names the request (size, stream, pool), the device's memory (total, free, held by the
// allocator, held by anything else), and splits what the allocator holds but could not hand out by cause,
// largest first, so that the true cause comes first:
//   - live allocations of the request's own pool (the largest listed, with their stacks when the history
//     recorded them);
//   - free memory cached for other streams of that pool (a block is reused only by its stream);
//   - memory of other pools: private pools, PyTorch MemPools and CUDA graph pools, each named with its
//     owner, graph pins and how much of it is free;
//   - blocks freed but waiting for other streams' work (RecordStream / record_stream);
//   - fragmentation: free memory of the request's stream and pool with no contiguous run large enough
//     (the largest run against the request, and 1 - largest / free);
//   - memory outside the allocator (device total - free - reserved: other processes, the CUDA context,
//     NCCL, cuBLAS workspaces, graphs' own driver memory).
// Expandable segments' mapped bytes are set against the address space they reserved. Remedies are listed
// only for the causes present (never "enable expandable segments" when they are on).
#ifndef GRAPHALLOC_ALLOCATOR_SNAPSHOT_OOM_REPORT_H_
#define GRAPHALLOC_ALLOCATOR_SNAPSHOT_OOM_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"

namespace graphalloc {

// The request that failed, and what only the allocator knew at that moment.
struct OomRequest {
  std::uint64_t size = 0;                    // bytes the allocation needed (rounded as the allocator rounds)
  std::uint64_t stream = 0;                  // 0: the default stream
  std::uint64_t pool_id = 0;                 // 0: the default pool
  std::optional<std::uint64_t> device_free;  // the device's free bytes when it failed
  std::uint64_t cap = 0;                     // the allocator's cap on reserved bytes (0: none)
  bool expandable = true;                    // the configuration's expandable_segments
};

// The request of the newest `oom` event of the snapshot's history (its size, stream, pool and the device's
// free bytes). NotFound, saying how to get one, when the history has none.
absl::StatusOr<OomRequest> OomRequestFromHistory(const MemorySnapshot& snapshot);

struct OomCause {
  enum class Kind { kLive, kOtherStreams, kOtherPool, kPendingFree, kFragmentation, kOutside };
  Kind kind = Kind::kLive;
  std::uint64_t bytes = 0;  // what it holds; causes are ordered by it, largest first
  std::string text;         // one line, without a leading dash
  std::string remedy;       // what to do about it (empty: nothing of its own)
};

struct OomLiveAllocation {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::uint64_t pool_id = 0;
  std::vector<Frame> frames;  // innermost first; empty when the history did not record it
};

struct OomReport {
  OomRequest request;
  std::string pool;  // the request's pool, described ("the default pool", "private pool 2 (owner, ...)")
  std::uint64_t device_total = 0;
  std::uint64_t reserved = 0;
  std::uint64_t allocated = 0;
  std::uint64_t expandable_mapped = 0;    // mapped bytes of expandable segments
  std::uint64_t expandable_reserved = 0;  // their reserved address space
  std::optional<std::uint64_t> outside;   // device total - free - reserved, when the free bytes are known
  std::vector<OomCause> causes;           // largest first
  std::vector<OomLiveAllocation> largest_live;
  std::vector<std::string> remedies;  // of the causes present, in their order, each once
};

// How many live allocations a report lists.
inline constexpr int kOomLargestLive = 5;

OomReport ExplainOutOfMemory(const MemorySnapshot& snapshot, const OomRequest& request);

// The report as lines of text (each ending in "\n"), for people: what the allocator appends to its
// out-of-memory error and what `graphalloc oom-report` prints.
std::string FormatOomReport(const OomReport& report);

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_SNAPSHOT_OOM_REPORT_H_

// Trace replay (trace_replay.h): validate and measure the trace, then drive the allocator with it.
#include "graphalloc/allocator/trace/trace_replay.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace graphalloc {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kTouchBytes = 4096;

// Trace stream ids to driver streams; creates streams on first use and destroys them at the end.
class StreamMap {
 public:
  explicit StreamMap(Driver& driver) : driver_(driver) {}
  ~StreamMap() { (void)DestroyAll(); }

  absl::StatusOr<Stream> Get(std::uint64_t trace_stream) {
    if (trace_stream == 0) return kDefaultStream;
    if (auto it = streams_.find(trace_stream); it != streams_.end()) return it->second;
    absl::StatusOr<Stream> stream = driver_.StreamCreate();
    if (!stream.ok()) return stream.status();
    streams_.emplace(trace_stream, *stream);
    return *stream;
  }

  absl::Status DestroyAll() {
    absl::Status first;
    for (const auto& [id, stream] : streams_) first.Update(driver_.StreamDestroy(stream));
    streams_.clear();
    return first;
  }

 private:
  Driver& driver_;
  absl::flat_hash_map<std::uint64_t, Stream> streams_;
};

absl::Status Touch(Driver& driver, DevicePtr ptr, std::size_t size, Stream stream) {
  if (size == 0) return absl::OkStatus();
  const std::size_t head = std::min(size, kTouchBytes);
  absl::Status status = driver.MemsetAsync(ptr, 0xa5, head, stream);
  if (status.ok() && size > head) {
    const std::size_t tail = std::min(size - head, kTouchBytes);
    status = driver.MemsetAsync(ptr + size - tail, 0x5a, tail, stream);
  }
  return status;
}

absl::Status WithEvent(const absl::Status& status, const Trace& trace, std::size_t index,
                       absl::string_view what) {
  return absl::Status(status.code(), absl::StrCat(trace.Where(index), ": ", what, ": ", status.message()));
}

}  // namespace

absl::StatusOr<TraceSummary> SummarizeTrace(const Trace& trace) {
  TraceSummary summary;
  absl::flat_hash_map<std::uint64_t, std::uint64_t> live;  // trace address -> size
  std::uint64_t live_bytes = 0;
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    if (e.action == TraceAction::kAlloc) {
      if (!live.emplace(e.addr, e.size).second) {
        return absl::InvalidArgumentError(absl::StrCat(trace.Where(i), ": bad trace: alloc at address ",
                                                       e.addr,
                                                       " which is still live (allocated and not freed)"));
      }
      ++summary.allocs;
      live_bytes += e.size;
      if (live_bytes > summary.peak_live_bytes) {
        summary.peak_live_bytes = live_bytes;
        summary.peak_live_event = i;
      }
    } else if (e.action == TraceAction::kFreeCompleted) {
      auto it = live.find(e.addr);
      if (it == live.end()) {
        return absl::InvalidArgumentError(absl::StrCat(trace.Where(i),
                                                       ": bad trace: free_completed of address ", e.addr,
                                                       " which is not allocated (never, or freed already)"));
      }
      ++summary.frees;
      live_bytes -= it->second;
      live.erase(it);
    }
  }
  return summary;
}

absl::StatusOr<ReplayResult> ReplayTrace(const Trace& trace, CachingAllocator& allocator,
                                         const ReplayOptions& options) {
  absl::StatusOr<TraceSummary> summary = SummarizeTrace(trace);
  if (!summary.ok()) return summary.status();

  ReplayResult result;
  result.trace_peak_live_bytes = summary->peak_live_bytes;
  std::uint64_t live_bytes = 0;  // of the blocks the replay holds, for the peak up to a stop
  std::uint64_t peak_live_bytes = 0;
  Driver& driver = allocator.driver();
  StreamMap streams(driver);
  struct LiveBlock {
    DevicePtr ptr;
    std::uint64_t size;
  };
  absl::flat_hash_map<std::uint64_t, LiveBlock> live;  // trace address -> graphalloc pointer
  live.reserve(std::min<std::size_t>(summary->allocs, 1 << 20));

  allocator.ResetPeakStats();
  absl::Status error;  // an error that ends the replay (not out of memory)
  std::chrono::nanoseconds in_allocator{0};
  Clock::duration checking{0};
  const Clock::time_point start = Clock::now();
  std::size_t ops = 0;
  std::size_t i = 0;
  for (; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    if (e.action == TraceAction::kAlloc) {
      absl::StatusOr<Stream> stream = streams.Get(e.stream);
      if (!stream.ok()) {
        error = WithEvent(stream.status(), trace, i, absl::StrCat("creating stream ", e.stream));
        break;
      }
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<DevicePtr> ptr = allocator.Allocate(e.size, *stream);
      in_allocator += Clock::now() - t0;
      ++result.allocs;
      if (!ptr.ok()) {
        if (absl::IsResourceExhausted(ptr.status())) {
          result.failure = ReplayFailure{i, trace.Where(i), std::string(ptr.status().message())};
        } else {
          error = absl::InternalError(
              absl::StrCat(trace.Where(i), ": Allocate(", e.size, ") failed: ", ptr.status().ToString()));
        }
        break;
      }
      live.emplace(e.addr, LiveBlock{*ptr, e.size});
      live_bytes += e.size;
      peak_live_bytes = std::max(peak_live_bytes, live_bytes);
      if (options.snapshot_hook && i == summary->peak_live_event) options.snapshot_hook("peak", allocator);
      if (options.touch_memory) {
        if (absl::Status s = Touch(driver, *ptr, e.size, *stream); !s.ok()) {
          error = WithEvent(s, trace, i, "touching the allocated block");
          break;
        }
      }
    } else if (e.action == TraceAction::kFreeCompleted) {
      auto it = live.find(e.addr);  // SummarizeTrace() proved it is there
      const DevicePtr ptr = it->second.ptr;
      live_bytes -= it->second.size;
      live.erase(it);
      const Clock::time_point t0 = Clock::now();
      absl::Status s = allocator.Free(ptr);
      in_allocator += Clock::now() - t0;
      ++result.frees;
      if (!s.ok()) {
        error = absl::InternalError(absl::StrCat(trace.Where(i), ": Free failed: ", s.ToString()));
        break;
      }
    } else {
      continue;  // free_requested and segment_* rows are not replayed
    }
    ++ops;
    if (options.check_invariants_every != 0 && ops % options.check_invariants_every == 0) {
      const Clock::time_point t0 = Clock::now();
      absl::Status s = allocator.CheckInvariants();
      checking += Clock::now() - t0;
      if (!s.ok()) {
        error = absl::InternalError(absl::StrCat(trace.Where(i), ": invariant violated: ", s.message()));
        break;
      }
    }
  }
  const Clock::time_point end = Clock::now();
  result.events = i + (result.failure.has_value() || !error.ok() ? 1 : 0);
  result.completed = error.ok() && !result.failure.has_value();
  result.peak_live_bytes = result.completed ? summary->peak_live_bytes : peak_live_bytes;
  result.wall_seconds = std::chrono::duration<double>(end - start - checking).count();
  const std::size_t calls = result.allocs + result.frees;
  result.ns_per_op =
      calls == 0 ? 0.0 : static_cast<double>(in_allocator.count()) / static_cast<double>(calls);
  result.peak_reserved_bytes = static_cast<std::uint64_t>(allocator.GetStats().reserved_bytes.all().peak);
  result.ratio = result.peak_live_bytes == 0 ? 0.0
                                             : static_cast<double>(result.peak_reserved_bytes) /
                                                   static_cast<double>(result.peak_live_bytes);

  if (options.snapshot_hook && error.ok()) options.snapshot_hook(result.completed ? "end" : "oom", allocator);

  // Leave the allocator with nothing of the trace's live: free what the trace never freed.
  for (const auto& [addr, block] : live) {
    if (absl::Status s = allocator.Free(block.ptr); !s.ok() && error.ok()) {
      error = absl::InternalError(
          absl::StrCat(trace.name, ": freeing block left live at the end: ", s.message()));
    }
  }
  if (absl::Status s = streams.DestroyAll(); !s.ok() && error.ok()) {
    error = absl::InternalError(absl::StrCat(trace.name, ": destroying replay streams: ", s.message()));
  }
  if (!error.ok()) return error;
  return result;
}

}  // namespace graphalloc

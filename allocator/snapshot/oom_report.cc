#include "graphalloc/allocator/snapshot/oom_report.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "graphalloc/allocator/base/bytes.h"

namespace graphalloc {
namespace {

const PoolSnapshot* FindPool(const MemorySnapshot& snapshot, std::uint64_t id) {
  for (const PoolSnapshot& p : snapshot.pools) {
    if (p.id == id) return &p;
  }
  return nullptr;
}

// "the default pool", "private pool 3 (CUDA graph pool (1, 0), pinned by 2 graphs)".
std::string DescribePool(const MemorySnapshot& snapshot, std::uint64_t id) {
  if (id == 0) return "the default pool";
  const PoolSnapshot* p = FindPool(snapshot, id);
  std::vector<std::string> details;
  if (p != nullptr && !p->owner.empty()) details.push_back(p->owner);
  if (p != nullptr && p->graph_pins > 0) {
    details.push_back(absl::StrCat("pinned by ", p->graph_pins, p->graph_pins == 1 ? " graph" : " graphs"));
  }
  std::string out = absl::StrCat("private pool ", id);
  if (!details.empty()) absl::StrAppend(&out, " (", absl::StrJoin(details, ", "), ")");
  return out;
}

std::string Percent(double fraction) { return absl::StrFormat("%.0f%%", 100.0 * fraction); }

// What the free memory of one (pool, stream) adds up to.
struct FreeMemory {
  std::uint64_t bytes = 0;
  std::uint64_t largest = 0;  // the largest contiguous run
  void Add(const SegmentSnapshot& seg, const BlockSnapshot& block) {
    bytes += UsableBytes(seg, block);
    largest = std::max(largest, LargestUsableRun(seg, block));
  }
};

struct PoolMemory {
  std::uint64_t reserved = 0;
  std::uint64_t allocated = 0;
  FreeMemory free;
};

// The state at the failure, added up by what could and could not serve the request.
struct Tally {
  std::uint64_t reserved = 0, allocated = 0, pending = 0, mapped = 0, address_space = 0;
  std::uint64_t own_pool_live = 0;
  std::int64_t own_pool_live_blocks = 0;
  FreeMemory own;                                   // the request's pool and stream
  std::map<std::uint64_t, FreeMemory> streams;      // the request's pool, other streams
  std::map<std::uint64_t, PoolMemory> other_pools;  // by id
  std::vector<OomLiveAllocation> live;
};

Tally Add(const MemorySnapshot& snapshot, const OomRequest& request) {
  Tally t;
  for (const SegmentSnapshot& seg : snapshot.segments) {
    const bool own_pool = seg.pool_id == request.pool_id;
    t.reserved += seg.ReservedBytes();
    if (seg.expandable) {
      t.mapped += seg.ReservedBytes();
      t.address_space += seg.total_size;
    }
    if (!own_pool) t.other_pools[seg.pool_id].reserved += seg.ReservedBytes();
    for (const BlockSnapshot& b : seg.blocks) {
      switch (b.state) {
        case BlockState::kAllocated:
          t.allocated += b.size;
          t.live.push_back({b.address, b.size, b.stream, seg.pool_id, b.frames});
          if (own_pool) {
            t.own_pool_live += b.size;
            ++t.own_pool_live_blocks;
          } else {
            t.other_pools[seg.pool_id].allocated += b.size;
          }
          break;
        case BlockState::kPendingFree:
          t.pending += b.size;
          break;
        case BlockState::kFree:
          if (!own_pool) {
            t.other_pools[seg.pool_id].free.Add(seg, b);
          } else if (seg.stream == request.stream) {
            t.own.Add(seg, b);
          } else {
            t.streams[seg.stream].Add(seg, b);
          }
          break;
      }
    }
  }
  return t;
}

OomCause OtherStreams(const MemorySnapshot& snapshot, const OomRequest& request, const Tally& t) {
  OomCause c;
  c.kind = OomCause::Kind::kOtherStreams;
  std::vector<std::string> each;
  for (const auto& [stream, memory] : t.streams) {
    if (memory.bytes == 0) continue;
    c.bytes += memory.bytes;
    each.push_back(absl::StrCat("stream ", HexAddress(stream), ": ", FormatBytes(memory.bytes),
                                ", largest run ", FormatBytes(memory.largest)));
  }
  c.text = absl::StrCat(FormatBytes(c.bytes), " free in the cache of other streams of ",
                        DescribePool(snapshot, request.pool_id),
                        ", each block reused only by the stream it was allocated on (",
                        absl::StrJoin(each, "; "), ")");
  c.remedy =
      "allocate on fewer streams: a tensor another stream uses can be allocated on one stream and passed "
      "with "
      "record_stream(), so that its memory returns to that stream's cache";
  return c;
}

OomCause OtherPool(const MemorySnapshot& snapshot, std::uint64_t id, const PoolMemory& pool) {
  OomCause c;
  c.kind = OomCause::Kind::kOtherPool;
  c.bytes = pool.reserved;
  c.text = absl::StrCat(FormatBytes(pool.reserved), " held by ", DescribePool(snapshot, id), ", ",
                        FormatBytes(pool.free.bytes), " of it free");
  const PoolSnapshot* p = FindPool(snapshot, id);
  if (id == 0) {
    c.remedy = "empty_cache() returns the default pool's free cached memory to the device";
  } else if (p != nullptr && p->graph_pins > 0) {
    c.remedy = absl::StrCat(
        "private pool ", id,
        " stays reserved while the graphs that replay into it live: delete them (torch.compile's graph "
        "trees: torch._dynamo.reset(), or fewer recordings), then empty_cache()");
  } else {
    c.remedy = absl::StrCat("private pool ", id,
                            " keeps its memory while it has users (PyTorch: the MemPool, or the CUDA graphs "
                            "recorded into it): release them (del the MemPool or the CUDAGraph; "
                            "torch._dynamo.reset() for torch.compile's graph trees), then empty_cache()");
  }
  return c;
}

OomCause Fragmentation(const MemorySnapshot& snapshot, const OomRequest& request, const Tally& t) {
  OomCause c;
  c.kind = OomCause::Kind::kFragmentation;
  c.bytes = t.own.bytes;
  const double fraction = 1.0 - static_cast<double>(t.own.largest) / static_cast<double>(t.own.bytes);
  c.text = absl::StrCat("fragmentation: ", FormatBytes(t.own.bytes), " free in ",
                        DescribePool(snapshot, request.pool_id), " for stream ", HexAddress(request.stream),
                        ", but its largest contiguous run is ", FormatBytes(t.own.largest),
                        ", less than the ", FormatBytes(request.size),
                        " asked (fragmentation 1 - largest / free = ", Percent(fraction), ")");
  c.remedy =
      request.expandable
          ? "allocate long-lived tensors first and free short-lived ones early: live blocks between free "
            "ones keep that memory mapped"
          : "set GRAPHALLOC_CONF=expandable_segments:True: free memory then stays contiguous and "
            "merges";
  return c;
}

}  // namespace

absl::StatusOr<OomRequest> OomRequestFromHistory(const MemorySnapshot& snapshot) {
  for (auto it = snapshot.history.rbegin(); it != snapshot.history.rend(); ++it) {
    if (it->action != HistoryAction::kOom) continue;
    OomRequest request;
    request.size = it->size;
    request.stream = it->stream;
    request.pool_id = it->pool_id;
    request.device_free = it->address;
    // What the configuration says (GRAPHALLOC_CONF syntax); a memory limit set in code is not in it.
    request.expandable = !absl::StrContains(snapshot.config, "expandable_segments:False");
    double fraction = 1.0;
    const std::size_t at = snapshot.config.find("per_process_memory_fraction:");
    if (at != std::string::npos &&
        absl::SimpleAtod(snapshot.config.substr(at + 28, snapshot.config.find(',', at) - at - 28),
                         &fraction) &&
        fraction < 1.0) {
      request.cap = static_cast<std::uint64_t>(fraction * static_cast<double>(snapshot.device.total_memory));
    }
    return request;
  }
  return absl::NotFoundError(
      snapshot.history_max_entries == 0
          ? "the snapshot has no history, so no out-of-memory event: record history (GRAPHALLOC_CONF="
            "record_history:True, or graphalloc replay --snapshot) and take the snapshot after the failure"
          : "the snapshot's history has no out-of-memory event: take the snapshot after the failure "
            "(graphalloc "
            "replay --capacity ... --snapshot X writes X.oom.json then)");
}

OomReport ExplainOutOfMemory(const MemorySnapshot& snapshot, const OomRequest& request) {
  OomReport r;
  r.request = request;
  r.pool = DescribePool(snapshot, request.pool_id);
  r.device_total = snapshot.device.total_memory;
  const Tally t = Add(snapshot, request);
  r.reserved = t.reserved;
  r.allocated = t.allocated;
  r.expandable_mapped = t.mapped;
  r.expandable_reserved = t.address_space;
  if (request.device_free.has_value() && r.device_total >= *request.device_free + r.reserved) {
    r.outside = r.device_total - *request.device_free - r.reserved;
  }

  if (t.own_pool_live > 0) {
    r.causes.push_back(
        {OomCause::Kind::kLive, t.own_pool_live,
         absl::StrCat(FormatBytes(t.own_pool_live), " held by ", t.own_pool_live_blocks,
                      t.own_pool_live_blocks == 1 ? " live allocation of " : " live allocations of ",
                      DescribePool(snapshot, request.pool_id), " (the largest are listed below)"),
         "free tensors you no longer need (del, or let them go out of scope), or lower the batch "
         "size"});
  }
  OomCause streams = OtherStreams(snapshot, request, t);
  if (streams.bytes > 0) r.causes.push_back(std::move(streams));
  for (const auto& [id, pool] : t.other_pools) {
    if (pool.reserved > 0) r.causes.push_back(OtherPool(snapshot, id, pool));
  }
  if (t.pending > 0) {
    r.causes.push_back({OomCause::Kind::kPendingFree, t.pending,
                        absl::StrCat(FormatBytes(t.pending),
                                     " freed but waiting for other streams' work (blocks used there, "
                                     "record_stream): each returns once its streams pass the free"),
                        "synchronize the streams that use freed blocks (torch.cuda.synchronize()) before "
                        "allocating again"});
  }
  if (t.own.bytes >= request.size && t.own.largest < request.size) {
    r.causes.push_back(Fragmentation(snapshot, request, t));
  } else if (t.own.bytes > 0 && t.own.largest < request.size) {
    // Too little even if it were contiguous: not what stopped the request, but memory it could not use.
    r.causes.push_back(
        {OomCause::Kind::kFragmentation, t.own.bytes,
         absl::StrCat(FormatBytes(t.own.bytes), " free in ", r.pool, " for stream ",
                      HexAddress(request.stream), " (largest contiguous run ", FormatBytes(t.own.largest),
                      "), too little for the request even together"),
         ""});
  }
  if (r.outside.has_value() && *r.outside > 0) {
    r.causes.push_back({OomCause::Kind::kOutside, *r.outside,
                        absl::StrCat(FormatBytes(*r.outside),
                                     " of the device is not held by graphalloc: other processes, the CUDA "
                                     "context, NCCL, cuBLAS workspaces, graphs' own driver memory"),
                        "see what else uses the device (nvidia-smi), and leave room for it"});
  }
  std::stable_sort(r.causes.begin(), r.causes.end(),
                   [](const OomCause& a, const OomCause& b) { return a.bytes > b.bytes; });

  // A cap that refuses what the device could still give comes before every other remedy.
  const bool capped = request.cap != 0 && r.reserved + request.size > request.cap &&
                      (!request.device_free.has_value() || *request.device_free >= request.size);
  if (capped) {
    r.remedies.push_back(absl::StrCat("raise the allocator's cap (", FormatBytes(request.cap),
                                      "; set_per_process_memory_fraction, per_process_memory_fraction): the "
                                      "device has room the cap refuses"));
  }
  for (const OomCause& c : r.causes) {
    if (!c.remedy.empty() && std::find(r.remedies.begin(), r.remedies.end(), c.remedy) == r.remedies.end())
      r.remedies.push_back(c.remedy);
  }

  std::vector<OomLiveAllocation> live = t.live;
  std::stable_sort(live.begin(), live.end(),
                   [](const OomLiveAllocation& a, const OomLiveAllocation& b) { return a.size > b.size; });
  if (live.size() > static_cast<std::size_t>(kOomLargestLive)) live.resize(kOomLargestLive);
  r.largest_live = std::move(live);
  return r;
}

std::string FormatOomReport(const OomReport& r) {
  std::string out = absl::StrCat("Request: ", FormatBytes(r.request.size), " on stream ",
                                 HexAddress(r.request.stream), " for ", r.pool, "\n");
  absl::StrAppend(&out, "Memory: device total ", FormatBytes(r.device_total));
  if (r.request.device_free.has_value())
    absl::StrAppend(&out, ", free ", FormatBytes(*r.request.device_free));
  absl::StrAppend(&out, "; graphalloc reserved ", FormatBytes(r.reserved), ", allocated ",
                  FormatBytes(r.allocated));
  if (r.request.cap != 0) absl::StrAppend(&out, ", capped at ", FormatBytes(r.request.cap));
  if (r.outside.has_value()) absl::StrAppend(&out, "; not held by graphalloc ", FormatBytes(*r.outside));
  absl::StrAppend(&out, "\n");
  if (r.expandable_reserved > 0) {
    absl::StrAppend(&out, "Expandable segments: ", FormatBytes(r.expandable_mapped), " mapped of ",
                    FormatBytes(r.expandable_reserved), " reserved address space\n");
  }
  absl::StrAppend(&out, "Why it could not be served, largest first:\n");
  if (r.causes.empty())
    absl::StrAppend(&out, "  - nothing is held: the device itself has too little memory\n");
  for (const OomCause& c : r.causes) absl::StrAppend(&out, "  - ", c.text, "\n");
  if (!r.largest_live.empty()) {
    absl::StrAppend(&out, "Largest live allocations:\n");
    for (const OomLiveAllocation& a : r.largest_live) {
      absl::StrAppend(&out, "  - ", FormatBytes(a.size), " at ", HexAddress(a.address), " (stream ",
                      HexAddress(a.stream), a.pool_id == 0 ? "" : absl::StrCat(", private pool ", a.pool_id),
                      ")");
      for (std::size_t i = 0; i < a.frames.size() && i < 4; ++i) {
        const Frame& f = a.frames[i];
        absl::StrAppend(&out, i == 0 ? " in " : " < ", f.function);
        if (!f.file.empty())
          absl::StrAppend(&out, " (", f.file, f.line > 0 ? absl::StrCat(":", f.line) : "", ")");
      }
      absl::StrAppend(&out, "\n");
    }
  }
  absl::StrAppend(&out, "What to try:\n");
  for (const std::string& remedy : r.remedies) absl::StrAppend(&out, "  - ", remedy, "\n");
  if (r.remedies.empty()) absl::StrAppend(&out, "  - a smaller request, or a device with more memory\n");
  return out;
}

}  // namespace graphalloc

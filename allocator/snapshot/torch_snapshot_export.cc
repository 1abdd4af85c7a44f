// SnapshotToTorchPickle of torch_snapshot.h.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "graphalloc/allocator/snapshot/pickle.h"
#include "graphalloc/allocator/snapshot/torch_snapshot.h"

namespace graphalloc {
namespace {

absl::string_view TorchState(BlockState state) {
  switch (state) {
    case BlockState::kAllocated:
      return "active_allocated";
    case BlockState::kPendingFree:
      return "active_pending_free";
    case BlockState::kFree:
      return "inactive";
  }
  return "inactive";
}

// PyTorch's name for an action. PyTorch's tools know only their own actions: a sleep gives memory back
// and a wake maps it again, which is what segment_unmap and segment_map draw (so import-torch reads them
// back as those).
absl::string_view TorchAction(HistoryAction action) {
  switch (action) {
    case HistoryAction::kSleep:
      return HistoryActionName(HistoryAction::kSegmentUnmap);
    case HistoryAction::kWake:
      return HistoryActionName(HistoryAction::kSegmentMap);
    default:
      return HistoryActionName(action);
  }
}

void WriteFrames(PickleWriter& w, const std::vector<Frame>& frames) {
  w.BeginList();
  for (const Frame& f : frames) {
    w.BeginDict();
    w.String("filename");
    w.String(f.file);
    w.String("line");
    w.Int(f.line);
    w.String("name");
    w.String(f.function);
    w.EndDict();
  }
  w.EndList();
}

void WritePoolId(PickleWriter& w, std::uint64_t pool_id) {
  w.BeginTuple();
  w.Int(static_cast<std::int64_t>(pool_id >> 32));
  w.Int(static_cast<std::int64_t>(pool_id & 0xffffffffu));
  w.EndTuple();
}

// One PyTorch segment: [begin, end) of `seg` (the whole segment, or one mapped range of an expandable
// one), with the blocks clipped to it.
void WriteSegment(PickleWriter& w, int device, const SegmentSnapshot& seg, std::uint64_t begin,
                  std::uint64_t end) {
  struct Piece {
    const BlockSnapshot* block;
    std::uint64_t address, size;
  };
  std::vector<Piece> pieces;
  std::uint64_t allocated = 0, active = 0, requested = 0;
  for (const BlockSnapshot& b : seg.blocks) {
    const std::uint64_t lo = std::max(begin, b.address);
    const std::uint64_t hi = std::min(end, b.address + b.size);
    if (lo >= hi) continue;
    pieces.push_back({&b, lo, hi - lo});
    if (b.state == BlockState::kAllocated) allocated += hi - lo;
    if (b.state != BlockState::kFree) {
      active += hi - lo;
      requested += b.requested_size;
    }
  }
  w.BeginDict();
  w.String("device");
  w.Int(device);
  w.String("address");
  w.UInt(begin);
  w.String("total_size");
  w.UInt(end - begin);
  w.String("allocated_size");
  w.UInt(allocated);
  w.String("active_size");
  w.UInt(active);
  w.String("requested_size");
  w.UInt(requested);
  w.String("stream");
  w.UInt(seg.stream);
  w.String("segment_type");
  w.String(SegmentKindName(seg.kind));
  w.String("segment_pool_id");
  WritePoolId(w, seg.pool_id);
  w.String("is_expandable");
  w.Bool(seg.expandable);
  w.String("frames");
  WriteFrames(w, seg.frames);
  w.String("blocks");
  w.BeginList();
  for (const Piece& p : pieces) {
    w.BeginDict();
    w.String("address");
    w.UInt(p.address);
    w.String("size");
    w.UInt(p.size);
    w.String("requested_size");
    w.UInt(p.block->requested_size);
    w.String("state");
    w.String(TorchState(p.block->state));
    w.String("frames");
    WriteFrames(w, p.block->frames);
    if (!p.block->annotation.empty()) {  // as on trace entries; PyTorch's own blocks have no such key
      w.String("user_metadata");
      w.String(p.block->annotation);
    }
    w.EndDict();
  }
  w.EndList();
  w.EndDict();
}

void WriteTraceEntry(PickleWriter& w, const HistoryEvent& e) {
  w.BeginDict();
  w.String("action");
  w.String(TorchAction(e.action));
  w.String(e.action == HistoryAction::kOom ? "device_free" : "addr");
  w.UInt(e.address);
  w.String("size");
  w.UInt(e.size);
  w.String("stream");
  w.UInt(e.stream);
  w.String("time_us");
  w.Int(e.time_us);
  w.String("compile_context");
  w.String("N/A");
  w.String("user_metadata");
  w.String(e.annotation);
  w.String("frames");
  WriteFrames(w, e.frames);
  if (e.pool_id != 0) {  // not a PyTorch key; read back by import-torch, ignored by PyTorch's tools
    w.String("pool_id");
    w.UInt(e.pool_id);
  }
  w.EndDict();
}

}  // namespace

std::string SnapshotToTorchPickle(const MemorySnapshot& snapshot) {
  const int device = snapshot.device.ordinal;
  PickleWriter w;
  w.BeginDict();
  w.String("segments");
  w.BeginList();
  bool any_expandable = false;
  for (const SegmentSnapshot& seg : snapshot.segments) {
    if (!seg.expandable) {
      WriteSegment(w, device, seg, seg.address, seg.address + seg.total_size);
      continue;
    }
    any_expandable = true;
    // Adjacent mapped ranges merge into one PyTorch segment.
    for (std::size_t i = 0; i < seg.mapped.size();) {
      const std::uint64_t begin = seg.address + seg.mapped[i].offset;
      std::uint64_t end = begin + seg.mapped[i].size;
      for (++i; i < seg.mapped.size() && seg.address + seg.mapped[i].offset == end; ++i) {
        end += seg.mapped[i].size;
      }
      WriteSegment(w, device, seg, begin, end);
    }
  }
  w.EndList();

  w.String("device_traces");
  w.BeginList();
  for (int d = 0; d <= device; ++d) {
    w.BeginList();
    if (d == device) {
      for (const HistoryEvent& e : snapshot.history) WriteTraceEntry(w, e);
    }
    w.EndList();
  }
  w.EndList();

  w.String("allocator_settings");
  w.BeginDict();
  w.String("PYTORCH_CUDA_ALLOC_CONF");
  w.String(snapshot.config);
  w.String("expandable_segments");
  w.Bool(any_expandable || absl::StrContains(snapshot.config, "expandable_segments:True"));
  w.String("max_split_size");
  w.Int(snapshot.stats.max_split_size);
  w.String("trace_alloc_max_entries");
  w.UInt(snapshot.history_max_entries);
  w.String("trace_alloc_overflowed");
  w.Bool(snapshot.history_overflowed);
  w.String("graphalloc_label");
  w.String(snapshot.label);
  w.String("graphalloc_device_name");
  w.String(snapshot.device.name);
  w.EndDict();

  w.String("external_annotations");
  w.BeginList();
  w.EndList();
  w.EndDict();
  return w.Finish();
}

}  // namespace graphalloc

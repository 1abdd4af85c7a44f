// SnapshotFromTorchPickle of torch_snapshot.h: walks the unpickled dicts with a path for every value.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graphalloc/allocator/base/status_macros.h"
#include "graphalloc/allocator/snapshot/pickle.h"
#include "graphalloc/allocator/snapshot/snapshot_internal.h"
#include "graphalloc/allocator/snapshot/torch_snapshot.h"

namespace graphalloc {
namespace {

using Kind = PickleValue::Kind;

using snapshot_internal::ChildPath;
using snapshot_internal::IndexPath;
using snapshot_internal::ReadError;

absl::Status TypeError(absl::string_view path, absl::string_view expected, const PickleValue& found) {
  return snapshot_internal::ReadTypeError(path, expected, found.TypeName());
}

// A dict of the pickle, with the path it was found at.
class Dict {
 public:
  static absl::StatusOr<Dict> Of(const PickleValue& v, std::string path) {
    if (v.kind != Kind::kDict) return TypeError(path, "a dict", v);
    return Dict(*v.node, std::move(path));
  }
  std::string PathOf(absl::string_view key) const { return ChildPath(path_, key); }
  const PickleValue* Find(absl::string_view key) const { return node_.Find(key); }

  absl::Status Int(absl::string_view key, std::int64_t* out, bool required) const {
    const PickleValue* v = Find(key);
    if (v == nullptr)
      return required
                 ? ReadError(path_.empty() ? "(top level)" : path_, absl::StrCat("missing key '", key, "'"))
                 : absl::OkStatus();
    if (!v->IsInt()) return TypeError(PathOf(key), "an int", *v);
    *out = v->integer;
    return absl::OkStatus();
  }
  absl::Status U64(absl::string_view key, std::uint64_t* out, bool required) const {
    std::int64_t i = static_cast<std::int64_t>(*out);
    GRAPHALLOC_RETURN_IF_ERROR(Int(key, &i, required));
    *out = static_cast<std::uint64_t>(i);  // addresses at or past 2^63 arrive as their bit pattern
    return absl::OkStatus();
  }
  absl::Status String(absl::string_view key, std::string* out, bool required) const {
    const PickleValue* v = Find(key);
    if (v == nullptr)
      return required ? ReadError(path_, absl::StrCat("missing key '", key, "'")) : absl::OkStatus();
    if (v->kind == Kind::kNone && !required) return absl::OkStatus();
    if (v->kind != Kind::kString) return TypeError(PathOf(key), "a str", *v);
    *out = v->text;
    return absl::OkStatus();
  }
  absl::Status Bool(absl::string_view key, bool* out) const {
    const PickleValue* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->IsInt()) return TypeError(PathOf(key), "a bool", *v);
    *out = v->integer != 0;
    return absl::OkStatus();
  }
  // The list (or tuple) under `key`; nullptr when absent and not required.
  absl::StatusOr<const PickleNode*> List(absl::string_view key, bool required) const {
    const PickleValue* v = Find(key);
    if (v == nullptr) {
      if (required)
        return ReadError(path_.empty() ? "(top level)" : path_, absl::StrCat("missing key '", key, "'"));
      return static_cast<const PickleNode*>(nullptr);
    }
    if (!v->IsSequence()) return TypeError(PathOf(key), "a list", *v);
    return v->node;
  }

 private:
  Dict(const PickleNode& node, std::string path) : node_(node), path_(std::move(path)) {}
  const PickleNode& node_;
  std::string path_;
};

absl::Status ReadFrames(const Dict& d, std::vector<Frame>* frames) {
  absl::StatusOr<const PickleNode*> list = d.List("frames", false);
  if (!list.ok()) return list.status();
  if (*list == nullptr) return absl::OkStatus();
  for (std::size_t i = 0; i < (*list)->items.size(); ++i) {
    absl::StatusOr<Dict> f = Dict::Of((*list)->items[i], IndexPath(d.PathOf("frames"), i));
    if (!f.ok()) return f.status();
    Frame frame;
    GRAPHALLOC_RETURN_IF_ERROR(f->String("name", &frame.function, false));
    GRAPHALLOC_RETURN_IF_ERROR(f->String("filename", &frame.file, false));
    std::int64_t line = 0;
    GRAPHALLOC_RETURN_IF_ERROR(f->Int("line", &line, false));
    frame.line = static_cast<int>(line);
    frames->push_back(std::move(frame));
  }
  return absl::OkStatus();
}

absl::StatusOr<BlockState> ReadState(const Dict& d) {
  std::string state;
  GRAPHALLOC_RETURN_IF_ERROR(d.String("state", &state, true));
  if (state == "active_allocated") return BlockState::kAllocated;
  if (state == "active_pending_free" || state == "active_awaiting_free") return BlockState::kPendingFree;
  if (state == "inactive") return BlockState::kFree;
  return ReadError(d.PathOf("state"), absl::StrCat("unknown block state '", state,
                                                   "'; expected active_allocated, active_pending_free (or "
                                                   "active_awaiting_free) or inactive"));
}

absl::Status ReadPoolId(const Dict& d, std::uint64_t* pool_id) {
  const PickleValue* v = d.Find("segment_pool_id");
  if (v == nullptr || v->kind == Kind::kNone) return absl::OkStatus();
  if (!v->IsSequence() || v->node->items.size() != 2 || !v->node->items[0].IsInt() ||
      !v->node->items[1].IsInt()) {
    return TypeError(d.PathOf("segment_pool_id"), "a tuple of two ints", *v);
  }
  *pool_id = (static_cast<std::uint64_t>(v->node->items[0].integer) << 32) +
             static_cast<std::uint64_t>(v->node->items[1].integer);
  return absl::OkStatus();
}

absl::Status ReadSegment(const Dict& d, SegmentSnapshot* seg) {
  GRAPHALLOC_RETURN_IF_ERROR(d.U64("address", &seg->address, true));
  GRAPHALLOC_RETURN_IF_ERROR(d.U64("total_size", &seg->total_size, true));
  GRAPHALLOC_RETURN_IF_ERROR(d.U64("stream", &seg->stream, false));
  std::string type = "large";
  GRAPHALLOC_RETURN_IF_ERROR(d.String("segment_type", &type, false));
  if (type != "small" && type != "large") {
    return ReadError(d.PathOf("segment_type"),
                     absl::StrCat("unknown segment type '", type, "'; expected small or large"));
  }
  seg->kind = type == "small" ? SegmentKind::kSmall : SegmentKind::kLarge;
  GRAPHALLOC_RETURN_IF_ERROR(ReadPoolId(d, &seg->pool_id));
  GRAPHALLOC_RETURN_IF_ERROR(d.Bool("is_expandable", &seg->expandable));
  if (seg->expandable) seg->mapped.push_back({0, seg->total_size});
  GRAPHALLOC_RETURN_IF_ERROR(ReadFrames(d, &seg->frames));
  absl::StatusOr<const PickleNode*> blocks = d.List("blocks", true);
  if (!blocks.ok()) return blocks.status();
  std::uint64_t next = seg->address;
  for (std::size_t i = 0; i < (*blocks)->items.size(); ++i) {
    absl::StatusOr<Dict> b = Dict::Of((*blocks)->items[i], IndexPath(d.PathOf("blocks"), i));
    if (!b.ok()) return b.status();
    BlockSnapshot block;
    block.address = next;  // older PyTorch leaves addresses out: blocks are contiguous
    GRAPHALLOC_RETURN_IF_ERROR(b->U64("address", &block.address, false));
    GRAPHALLOC_RETURN_IF_ERROR(b->U64("size", &block.size, true));
    GRAPHALLOC_RETURN_IF_ERROR(b->U64("requested_size", &block.requested_size, false));
    absl::StatusOr<BlockState> state = ReadState(*b);
    if (!state.ok()) return state.status();
    block.state = *state;
    if (block.state == BlockState::kFree) block.requested_size = 0;
    block.stream = seg->stream;
    GRAPHALLOC_RETURN_IF_ERROR(b->String("user_metadata", &block.annotation, false));
    GRAPHALLOC_RETURN_IF_ERROR(ReadFrames(*b, &block.frames));
    next = block.address + block.size;
    seg->blocks.push_back(std::move(block));
  }
  std::stable_sort(seg->blocks.begin(), seg->blocks.end(),
                   [](const BlockSnapshot& a, const BlockSnapshot& b) { return a.address < b.address; });
  return absl::OkStatus();
}

absl::Status ReadTraceEntry(const Dict& d, bool* keep, HistoryEvent* e) {
  std::string action;
  GRAPHALLOC_RETURN_IF_ERROR(d.String("action", &action, true));
  std::optional<HistoryAction> parsed = ParseHistoryAction(action);
  *keep = parsed.has_value();  // newer PyTorch actions this model has no name for are skipped
  if (!*keep) return absl::OkStatus();
  e->action = *parsed;
  GRAPHALLOC_RETURN_IF_ERROR(
      d.U64(e->action == HistoryAction::kOom ? "device_free" : "addr", &e->address, false));
  GRAPHALLOC_RETURN_IF_ERROR(d.U64("size", &e->size, false));
  GRAPHALLOC_RETURN_IF_ERROR(d.U64("stream", &e->stream, false));
  GRAPHALLOC_RETURN_IF_ERROR(d.Int("time_us", &e->time_us, false));
  GRAPHALLOC_RETURN_IF_ERROR(d.U64("pool_id", &e->pool_id, false));
  GRAPHALLOC_RETURN_IF_ERROR(d.String("user_metadata", &e->annotation, false));
  return ReadFrames(d, &e->frames);
}

// Statistics (current values) and pools, from the blocks.
void Recompute(MemorySnapshot& s) {
  DeviceStats& st = s.stats;
  std::map<std::uint64_t, PoolSnapshot> pools;
  for (const SegmentSnapshot& seg : s.segments) {
    const bool small = seg.kind == SegmentKind::kSmall;
    const auto reserved = static_cast<std::int64_t>(seg.ReservedBytes());
    if (!seg.expandable) st.segment.Increase(small, 1);
    st.reserved_bytes.Increase(small, reserved);
    PoolSnapshot& pool = pools[seg.pool_id];
    pool.id = seg.pool_id;
    pool.reserved_bytes += seg.ReservedBytes();
    for (const BlockSnapshot& b : seg.blocks) {
      const auto size = static_cast<std::int64_t>(b.size);
      if (b.state == BlockState::kAllocated) {
        st.allocation.Increase(small, 1);
        st.allocated_bytes.Increase(small, size);
        pool.allocated_bytes += b.size;
      }
      if (b.state != BlockState::kFree) {
        st.active.Increase(small, 1);
        st.active_bytes.Increase(small, size);
        st.requested_bytes.Increase(small, static_cast<std::int64_t>(b.requested_size));
      } else if (seg.blocks.size() > 1 && !seg.expandable) {
        st.inactive_split.Increase(small, 1);
        st.inactive_split_bytes.Increase(small, size);
      }
    }
  }
  for (auto& [id, pool] : pools) {
    pool.peak_reserved_bytes = pool.reserved_bytes;
    pool.peak_allocated_bytes = pool.allocated_bytes;
    s.pools.push_back(pool);
  }
}

absl::Status Convert(const PickleValue& root, int device, MemorySnapshot* out, std::vector<int>* devices) {
  absl::StatusOr<Dict> top = Dict::Of(root, "");
  if (!top.ok()) return ReadError("(top level)", absl::StrCat("expected a dict, found ", root.TypeName()));
  absl::StatusOr<const PickleNode*> segments = top->List("segments", true);
  if (!segments.ok()) return segments.status();
  absl::StatusOr<const PickleNode*> traces = top->List("device_traces", false);
  if (!traces.ok()) return traces.status();

  std::vector<std::int64_t> segment_devices((*segments)->items.size(), 0);
  for (std::size_t i = 0; i < segment_devices.size(); ++i) {
    absl::StatusOr<Dict> d = Dict::Of((*segments)->items[i], IndexPath("segments", i));
    if (!d.ok()) return d.status();
    GRAPHALLOC_RETURN_IF_ERROR(d->Int("device", &segment_devices[i], false));
  }
  // The devices with data: a segment, or a non-empty trace.
  std::set<std::int64_t> present(segment_devices.begin(), segment_devices.end());
  for (std::size_t t = 0; *traces != nullptr && t < (*traces)->items.size(); ++t) {
    const PickleValue& list = (*traces)->items[t];
    if (list.IsSequence() && !list.node->items.empty()) present.insert(static_cast<std::int64_t>(t));
  }
  if (devices != nullptr) {
    for (std::int64_t d : present) devices->push_back(static_cast<int>(d));
  }
  if (device < 0) {
    device = present.empty() ? 0 : static_cast<int>(std::max<std::int64_t>(*present.begin(), 0));
  } else if (!present.contains(device)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", device, " has no segments or trace entries in this snapshot; devices present: ",
        present.empty() ? std::string("none") : absl::StrJoin(present, ", ")));
  }
  out->device.ordinal = device;

  for (std::size_t i = 0; i < segment_devices.size(); ++i) {
    if (segment_devices[i] != device) continue;
    absl::StatusOr<Dict> d = Dict::Of((*segments)->items[i], IndexPath("segments", i));
    SegmentSnapshot seg;
    GRAPHALLOC_RETURN_IF_ERROR(ReadSegment(*d, &seg));
    out->segments.push_back(std::move(seg));
  }
  std::stable_sort(out->segments.begin(), out->segments.end(),
                   [](const SegmentSnapshot& a, const SegmentSnapshot& b) { return a.address < b.address; });

  if (*traces != nullptr && static_cast<std::size_t>(device) < (*traces)->items.size()) {
    const std::string path = IndexPath("device_traces", static_cast<std::size_t>(device));
    const PickleValue& list = (*traces)->items[static_cast<std::size_t>(device)];
    if (!list.IsSequence()) return TypeError(path, "a list", list);
    out->history.reserve(list.node->items.size());
    for (std::size_t i = 0; i < list.node->items.size(); ++i) {
      absl::StatusOr<Dict> d = Dict::Of(list.node->items[i], IndexPath(path, i));
      if (!d.ok()) return d.status();
      HistoryEvent e;
      bool keep = false;
      GRAPHALLOC_RETURN_IF_ERROR(ReadTraceEntry(*d, &keep, &e));
      if (keep) out->history.push_back(std::move(e));
    }
  }

  if (const PickleValue* settings = top->Find("allocator_settings"); settings != nullptr) {
    absl::StatusOr<Dict> d = Dict::Of(*settings, "allocator_settings");
    if (!d.ok()) return d.status();
    GRAPHALLOC_RETURN_IF_ERROR(d->String("PYTORCH_CUDA_ALLOC_CONF", &out->config, false));
    GRAPHALLOC_RETURN_IF_ERROR(d->Int("max_split_size", &out->stats.max_split_size, false));
    std::uint64_t max_entries = 0;
    GRAPHALLOC_RETURN_IF_ERROR(d->U64("trace_alloc_max_entries", &max_entries, false));
    out->history_max_entries = max_entries;
    GRAPHALLOC_RETURN_IF_ERROR(d->Bool("trace_alloc_overflowed", &out->history_overflowed));
    GRAPHALLOC_RETURN_IF_ERROR(d->String("graphalloc_label", &out->label, false));
    GRAPHALLOC_RETURN_IF_ERROR(d->String("graphalloc_device_name", &out->device.name, false));
  }
  if (out->history_max_entries == 0 && !out->history.empty()) out->history_max_entries = out->history.size();
  Recompute(*out);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MemorySnapshot> SnapshotFromTorchPickle(absl::string_view bytes, absl::string_view source,
                                                       int device, std::vector<int>* devices) {
  absl::StatusOr<std::unique_ptr<PickleDocument>> doc = ParsePickle(bytes, source);
  if (!doc.ok()) return doc.status();
  MemorySnapshot snapshot;
  snapshot.source = "pytorch";
  if (absl::Status s = Convert((*doc)->root, device, &snapshot, devices); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  if (absl::Status s = ValidateSnapshot(snapshot); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return snapshot;
}

}  // namespace graphalloc

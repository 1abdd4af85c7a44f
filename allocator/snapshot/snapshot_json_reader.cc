// SnapshotFromJson and ReadSnapshotFile of snapshot_json.h. Every conversion step knows the JSON path of
// what it reads, so a wrong or missing field is reported as "segments[3].blocks[7].size: ...".
#include <cstdint>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/base/status_macros.h"
#include "graphalloc/allocator/snapshot/snapshot_internal.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "graphalloc/allocator/stats/stat_names.h"

namespace graphalloc {
namespace {

using json = nlohmann::json;

using snapshot_internal::ChildPath;
using snapshot_internal::IndexPath;
using snapshot_internal::ReadError;

absl::Status TypeError(absl::string_view path, absl::string_view expected, const json& found) {
  return snapshot_internal::ReadTypeError(path, expected, found.type_name());
}

// Reads fields of one JSON object; `path` is the object's own path.
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string path) : object_(object), path_(std::move(path)) {}

  static absl::StatusOr<ObjectReader> Of(const json& value, std::string path) {
    if (!value.is_object()) return TypeError(path, "an object", value);
    return ObjectReader(value, std::move(path));
  }

  const std::string& path() const { return path_; }
  std::string PathOf(absl::string_view key) const { return ChildPath(path_, key); }

  // The member `key`, or nullptr when absent (an error when `required`).
  absl::StatusOr<const json*> Get(absl::string_view key, bool required) const {
    auto it = object_.find(std::string(key));
    if (it == object_.end()) {
      if (required)
        return ReadError(path_.empty() ? "(top level)" : path_, absl::StrCat("missing field '", key, "'"));
      return static_cast<const json*>(nullptr);
    }
    return &*it;
  }

  absl::Status U64(absl::string_view key, std::uint64_t* out, bool required = true) const {
    absl::StatusOr<const json*> v = Get(key, required);
    if (!v.ok()) return v.status();
    if (*v == nullptr) return absl::OkStatus();
    if ((*v)->is_number_unsigned()) {
      *out = (*v)->get<std::uint64_t>();
    } else if ((*v)->is_number_integer() && (*v)->get<std::int64_t>() >= 0) {
      *out = static_cast<std::uint64_t>((*v)->get<std::int64_t>());
    } else {
      return TypeError(PathOf(key), "a non-negative integer", **v);
    }
    return absl::OkStatus();
  }

  absl::Status I64(absl::string_view key, std::int64_t* out, bool required = true) const {
    absl::StatusOr<const json*> v = Get(key, required);
    if (!v.ok()) return v.status();
    if (*v == nullptr) return absl::OkStatus();
    if ((*v)->is_number_unsigned()) {
      const std::uint64_t u = (*v)->get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return ReadError(PathOf(key), absl::StrCat(u, " is out of range for a signed 64-bit integer"));
      }
      *out = static_cast<std::int64_t>(u);
    } else if ((*v)->is_number_integer()) {
      *out = (*v)->get<std::int64_t>();
    } else {
      return TypeError(PathOf(key), "an integer", **v);
    }
    return absl::OkStatus();
  }

  absl::Status Int(absl::string_view key, int* out, bool required = true) const {
    std::int64_t wide = *out;
    if (absl::Status s = I64(key, &wide, required); !s.ok()) return s;
    if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max()) {
      return ReadError(PathOf(key), absl::StrCat(wide, " is out of range"));
    }
    *out = static_cast<int>(wide);
    return absl::OkStatus();
  }

  absl::Status Bool(absl::string_view key, bool* out, bool required = true) const {
    absl::StatusOr<const json*> v = Get(key, required);
    if (!v.ok()) return v.status();
    if (*v == nullptr) return absl::OkStatus();
    if (!(*v)->is_boolean()) return TypeError(PathOf(key), "true or false", **v);
    *out = (*v)->get<bool>();
    return absl::OkStatus();
  }

  absl::Status String(absl::string_view key, std::string* out, bool required = true) const {
    absl::StatusOr<const json*> v = Get(key, required);
    if (!v.ok()) return v.status();
    if (*v == nullptr) return absl::OkStatus();
    if (!(*v)->is_string()) return TypeError(PathOf(key), "a string", **v);
    *out = (*v)->get_ref<const std::string&>();
    return absl::OkStatus();
  }

  // The array member `key`; nullptr when absent and not required.
  absl::StatusOr<const json*> Array(absl::string_view key, bool required = true) const {
    absl::StatusOr<const json*> v = Get(key, required);
    if (!v.ok() || *v == nullptr) return v;
    if (!(*v)->is_array()) return TypeError(PathOf(key), "an array", **v);
    return v;
  }

 private:
  const json& object_;
  std::string path_;
};

constexpr std::uint64_t kNoStack = std::numeric_limits<std::uint64_t>::max();

// A reference from a block, segment or event to the "stacks" table, resolved once the table is read.
struct StackRef {
  std::vector<Frame>* frames;
  std::uint64_t index;
  std::string path;  // of the "stack" field, for the error when the index is out of range
};

absl::Status ReadStackRef(const ObjectReader& r, std::vector<Frame>* frames, std::vector<StackRef>* refs) {
  std::uint64_t index = kNoStack;
  GRAPHALLOC_RETURN_IF_ERROR(r.U64("stack", &index, /*required=*/false));
  if (index != kNoStack) refs->push_back({frames, index, r.PathOf("stack")});
  return absl::OkStatus();
}

// Reads one history event; its "stack" index (kNoStack when absent) goes to `stack`, resolved later.
absl::Status ReadEvent(const json& value, const std::string& path, HistoryEvent* e, std::uint64_t* stack) {
  absl::StatusOr<ObjectReader> r = ObjectReader::Of(value, path);
  if (!r.ok()) return r.status();
  std::string action;
  GRAPHALLOC_RETURN_IF_ERROR(r->String("action", &action));
  std::optional<HistoryAction> parsed = ParseHistoryAction(action);
  if (!parsed.has_value()) {
    return ReadError(
        r->PathOf("action"),
        absl::StrCat("unknown action '", action,
                     "'; expected alloc, free_requested, free_completed, segment_alloc, segment_free, "
                     "segment_map, segment_unmap, oom, snapshot, sleep or wake"));
  }
  e->action = *parsed;
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("address", &e->address));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("size", &e->size));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("stream", &e->stream));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("pool_id", &e->pool_id, false));
  GRAPHALLOC_RETURN_IF_ERROR(r->I64("time_us", &e->time_us));
  GRAPHALLOC_RETURN_IF_ERROR(r->String("annotation", &e->annotation, false));
  *stack = kNoStack;
  return r->U64("stack", stack, false);
}

// Converts history events as the parser finishes each one, and drops them from the tree it builds.
class HistoryStreamer {
 public:
  bool OnEvent(int depth, json::parse_event_t event, json& parsed) {
    const auto d = static_cast<std::size_t>(depth);
    if (keys_.size() <= d + 1) {
      keys_.resize(d + 2);
      containers_.resize(d + 2);
    }
    switch (event) {
      case json::parse_event_t::key:
        keys_[d] = parsed.get<std::string>();
        return true;
      case json::parse_event_t::object_start:
        containers_[d] = '{';
        return true;
      case json::parse_event_t::array_start:
        containers_[d] = '[';
        return true;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
      case json::parse_event_t::value:
        break;
    }
    if (depth != 3 || containers_[0] != '{' || keys_[1] != "history" || containers_[1] != '{' ||
        keys_[2] != "events" || containers_[2] != '[') {
      return true;
    }
    // One element of history.events, complete.
    const std::string path = IndexPath("history.events", index_++);
    if (!status_.ok()) return false;
    HistoryEvent e;
    std::uint64_t stack = kNoStack;
    status_ = ReadEvent(parsed, path, &e, &stack);
    if (status_.ok()) {
      events_.push_back(std::move(e));
      stacks_.push_back(stack);
    }
    return false;
  }

  bool seen() const { return index_ > 0; }
  const absl::Status& status() const { return status_; }
  std::vector<HistoryEvent>& events() { return events_; }
  const std::vector<std::uint64_t>& stacks() const { return stacks_; }

 private:
  std::vector<std::string> keys_;
  std::vector<char> containers_;
  std::size_t index_ = 0;
  absl::Status status_;
  std::vector<HistoryEvent> events_;
  std::vector<std::uint64_t> stacks_;  // each event's stack index (kNoStack: none)
};

absl::Status ReadStats(const ObjectReader& root, DeviceStats* stats) {
  absl::StatusOr<const json*> v = root.Get("stats", false);
  if (!v.ok() || *v == nullptr) return v.status();
  absl::StatusOr<ObjectReader> r = ObjectReader::Of(**v, "stats");
  if (!r.ok()) return r.status();
  for (const StatArrayName& array : kStatArrays) {
    absl::StatusOr<const json*> a = r->Get(array.name, false);
    if (!a.ok()) return a.status();
    if (*a == nullptr) continue;
    absl::StatusOr<ObjectReader> ar = ObjectReader::Of(**a, r->PathOf(array.name));
    if (!ar.ok()) return ar.status();
    for (int t = 0; t < kNumStatTypes; ++t) {
      absl::StatusOr<const json*> s = ar->Get(kStatTypeNames[t], false);
      if (!s.ok()) return s.status();
      if (*s == nullptr) continue;
      absl::StatusOr<ObjectReader> sr = ObjectReader::Of(**s, ar->PathOf(kStatTypeNames[t]));
      if (!sr.ok()) return sr.status();
      for (const auto& [field_name, field] : kStatFields) {
        GRAPHALLOC_RETURN_IF_ERROR(sr->I64(field_name, &((stats->*array.member).by_type[t].*field), false));
      }
    }
  }
  for (const StatCounterName& counter : kStatCounters)
    GRAPHALLOC_RETURN_IF_ERROR(r->I64(counter.name, &(stats->*counter.member), false));
  return absl::OkStatus();
}

absl::Status ReadFrames(const json& value, const std::string& path, std::vector<Frame>* frames) {
  if (!value.is_array()) return TypeError(path, "an array of frames", value);
  for (std::size_t i = 0; i < value.size(); ++i) {
    absl::StatusOr<ObjectReader> r = ObjectReader::Of(value[i], IndexPath(path, i));
    if (!r.ok()) return r.status();
    Frame f;
    GRAPHALLOC_RETURN_IF_ERROR(r->String("function", &f.function));
    GRAPHALLOC_RETURN_IF_ERROR(r->String("file", &f.file, false));
    GRAPHALLOC_RETURN_IF_ERROR(r->Int("line", &f.line, false));
    frames->push_back(std::move(f));
  }
  return absl::OkStatus();
}

absl::Status ReadBlock(const json& value, const std::string& path, BlockSnapshot* b,
                       std::vector<StackRef>* refs) {
  absl::StatusOr<ObjectReader> r = ObjectReader::Of(value, path);
  if (!r.ok()) return r.status();
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("address", &b->address));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("size", &b->size));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("requested_size", &b->requested_size, false));
  std::string state;
  GRAPHALLOC_RETURN_IF_ERROR(r->String("state", &state));
  std::optional<BlockState> parsed = ParseBlockState(state);
  if (!parsed.has_value()) {
    return ReadError(r->PathOf("state"),
                     absl::StrCat("unknown state '", state, "'; expected allocated, pending_free or free"));
  }
  b->state = *parsed;
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("stream", &b->stream, false));
  GRAPHALLOC_RETURN_IF_ERROR(r->String("annotation", &b->annotation, false));
  return ReadStackRef(*r, &b->frames, refs);
}

absl::Status ReadSegment(const json& value, const std::string& path, SegmentSnapshot* s,
                         std::vector<StackRef>* refs) {
  absl::StatusOr<ObjectReader> r = ObjectReader::Of(value, path);
  if (!r.ok()) return r.status();
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("address", &s->address));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("total_size", &s->total_size));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("stream", &s->stream, false));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("pool_id", &s->pool_id, false));
  std::string kind = "large";
  GRAPHALLOC_RETURN_IF_ERROR(r->String("kind", &kind, false));
  std::optional<SegmentKind> parsed = ParseSegmentKind(kind);
  if (!parsed.has_value()) {
    return ReadError(r->PathOf("kind"), absl::StrCat("unknown kind '", kind, "'; expected small or large"));
  }
  s->kind = *parsed;
  GRAPHALLOC_RETURN_IF_ERROR(r->Bool("expandable", &s->expandable, false));
  absl::StatusOr<const json*> mapped = r->Array("mapped", false);
  if (!mapped.ok()) return mapped.status();
  if (*mapped != nullptr) {
    for (std::size_t i = 0; i < (*mapped)->size(); ++i) {
      absl::StatusOr<ObjectReader> m = ObjectReader::Of((**mapped)[i], IndexPath(r->PathOf("mapped"), i));
      if (!m.ok()) return m.status();
      MappedRange range;
      GRAPHALLOC_RETURN_IF_ERROR(m->U64("offset", &range.offset));
      GRAPHALLOC_RETURN_IF_ERROR(m->U64("size", &range.size));
      GRAPHALLOC_RETURN_IF_ERROR(m->Bool("accessible", &range.accessible, false));
      s->mapped.push_back(range);
    }
  }
  absl::StatusOr<const json*> asleep = r->Array("asleep", false);
  if (!asleep.ok()) return asleep.status();
  if (*asleep != nullptr) {
    for (std::size_t i = 0; i < (*asleep)->size(); ++i) {
      absl::StatusOr<ObjectReader> m = ObjectReader::Of((**asleep)[i], IndexPath(r->PathOf("asleep"), i));
      if (!m.ok()) return m.status();
      MappedRange range;
      GRAPHALLOC_RETURN_IF_ERROR(m->U64("offset", &range.offset));
      GRAPHALLOC_RETURN_IF_ERROR(m->U64("size", &range.size));
      s->asleep.push_back(range);
    }
  }
  GRAPHALLOC_RETURN_IF_ERROR(ReadStackRef(*r, &s->frames, refs));
  absl::StatusOr<const json*> blocks = r->Array("blocks");
  if (!blocks.ok()) return blocks.status();
  s->blocks.resize((*blocks)->size());
  for (std::size_t i = 0; i < s->blocks.size(); ++i) {
    GRAPHALLOC_RETURN_IF_ERROR(
        ReadBlock((**blocks)[i], IndexPath(r->PathOf("blocks"), i), &s->blocks[i], refs));
  }
  return absl::OkStatus();
}

absl::Status ReadPool(const json& value, const std::string& path, PoolSnapshot* p) {
  absl::StatusOr<ObjectReader> r = ObjectReader::Of(value, path);
  if (!r.ok()) return r.status();
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("id", &p->id));
  GRAPHALLOC_RETURN_IF_ERROR(r->I64("use_count", &p->use_count, false));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("reserved_bytes", &p->reserved_bytes, false));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("allocated_bytes", &p->allocated_bytes, false));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("peak_reserved_bytes", &p->peak_reserved_bytes, false));
  GRAPHALLOC_RETURN_IF_ERROR(r->U64("peak_allocated_bytes", &p->peak_allocated_bytes, false));
  GRAPHALLOC_RETURN_IF_ERROR(r->String("owner", &p->owner, false));
  GRAPHALLOC_RETURN_IF_ERROR(r->I64("graph_pins", &p->graph_pins, false));
  return absl::OkStatus();
}

absl::Status ReadHeader(const ObjectReader& root) {
  std::string format;
  absl::StatusOr<const json*> f = root.Get("format", false);
  if (!f.ok()) return f.status();
  if (*f == nullptr || !(*f)->is_string() || (*f)->get_ref<const std::string&>() != kSnapshotFormatName) {
    return ReadError("format",
                     absl::StrCat("not a graphalloc snapshot: expected \"format\": \"", kSnapshotFormatName,
                                  "\"", *f == nullptr ? " (the field is missing)" : ""));
  }
  std::int64_t version = 0;
  GRAPHALLOC_RETURN_IF_ERROR(root.I64("version", &version));
  if (version != kSnapshotFormatVersion) {
    return ReadError(
        "version", absl::StrCat("snapshot format version ", version,
                                " is not supported; this graphalloc reads version ", kSnapshotFormatVersion));
  }
  return absl::OkStatus();
}

absl::Status Convert(const json& doc, HistoryStreamer& streamer, MemorySnapshot* out) {
  absl::StatusOr<ObjectReader> root = ObjectReader::Of(doc, "");
  if (!root.ok())
    return ReadError("(top level)", absl::StrCat("expected a JSON object, found ", doc.type_name()));
  GRAPHALLOC_RETURN_IF_ERROR(ReadHeader(*root));
  if (!streamer.status().ok()) return streamer.status();
  out->format_version = kSnapshotFormatVersion;
  GRAPHALLOC_RETURN_IF_ERROR(root->String("label", &out->label, false));
  GRAPHALLOC_RETURN_IF_ERROR(root->String("source", &out->source, false));
  GRAPHALLOC_RETURN_IF_ERROR(root->I64("time_us", &out->time_us, false));
  absl::StatusOr<const json*> device = root->Get("device", false);
  if (!device.ok()) return device.status();
  if (*device != nullptr) {
    absl::StatusOr<ObjectReader> d = ObjectReader::Of(**device, "device");
    if (!d.ok()) return d.status();
    GRAPHALLOC_RETURN_IF_ERROR(d->Int("ordinal", &out->device.ordinal, false));
    GRAPHALLOC_RETURN_IF_ERROR(d->String("name", &out->device.name, false));
    GRAPHALLOC_RETURN_IF_ERROR(d->U64("total_memory", &out->device.total_memory, false));
    GRAPHALLOC_RETURN_IF_ERROR(d->U64("granularity", &out->device.granularity, false));
  }
  GRAPHALLOC_RETURN_IF_ERROR(root->String("config", &out->config, false));
  GRAPHALLOC_RETURN_IF_ERROR(ReadStats(*root, &out->stats));

  absl::StatusOr<const json*> pools = root->Array("pools", false);
  if (!pools.ok()) return pools.status();
  if (*pools != nullptr) {
    out->pools.resize((*pools)->size());
    for (std::size_t i = 0; i < out->pools.size(); ++i) {
      GRAPHALLOC_RETURN_IF_ERROR(ReadPool((**pools)[i], IndexPath("pools", i), &out->pools[i]));
    }
  }

  std::vector<std::vector<Frame>> stacks;
  absl::StatusOr<const json*> stack_table = root->Array("stacks", false);
  if (!stack_table.ok()) return stack_table.status();
  if (*stack_table != nullptr) {
    stacks.resize((*stack_table)->size());
    for (std::size_t i = 0; i < stacks.size(); ++i) {
      GRAPHALLOC_RETURN_IF_ERROR(ReadFrames((**stack_table)[i], IndexPath("stacks", i), &stacks[i]));
    }
  }

  std::vector<StackRef> refs;
  absl::StatusOr<const json*> segments = root->Array("segments");
  if (!segments.ok()) return segments.status();
  out->segments.resize((*segments)->size());
  for (std::size_t i = 0; i < out->segments.size(); ++i) {
    GRAPHALLOC_RETURN_IF_ERROR(
        ReadSegment((**segments)[i], IndexPath("segments", i), &out->segments[i], &refs));
  }

  absl::StatusOr<const json*> history = root->Get("history", false);
  if (!history.ok()) return history.status();
  if (*history != nullptr) {
    absl::StatusOr<ObjectReader> h = ObjectReader::Of(**history, "history");
    if (!h.ok()) return h.status();
    std::uint64_t max_entries = 0;
    GRAPHALLOC_RETURN_IF_ERROR(h->U64("max_entries", &max_entries, false));
    out->history_max_entries = max_entries;
    GRAPHALLOC_RETURN_IF_ERROR(h->Bool("overflowed", &out->history_overflowed, false));
    absl::StatusOr<const json*> events = h->Array("events", false);
    if (!events.ok()) return events.status();
    // The streamer took every object; anything left is not one.
    if (*events != nullptr && !(*events)->empty()) {
      return TypeError("history.events[?]", "an object", (**events)[0]);
    }
    out->history = std::move(streamer.events());
    for (std::size_t i = 0; i < out->history.size(); ++i) {
      if (streamer.stacks()[i] == kNoStack) continue;
      refs.push_back(
          {&out->history[i].frames, streamer.stacks()[i], IndexPath("history.events", i) + ".stack"});
    }
  }

  for (const StackRef& ref : refs) {
    if (ref.index >= stacks.size()) {
      return ReadError(ref.path, absl::StrCat("stack ", ref.index, " does not exist; the file has ",
                                              stacks.size(), " stacks"));
    }
    *ref.frames = stacks[ref.index];
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MemorySnapshot> SnapshotFromJson(absl::string_view text, absl::string_view source) {
  auto prefixed = [&](const absl::Status& s) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  };
  try {
    HistoryStreamer streamer;
    json doc;
    try {
      doc = json::parse(text.begin(), text.end(),
                        [&streamer](int depth, json::parse_event_t event, json& parsed) {
                          return streamer.OnEvent(depth, event, parsed);
                        });
    } catch (const json::parse_error& e) {
      std::string what = e.what();
      if (const std::size_t close = what.find("] ");
          absl::StartsWith(what, "[json.exception") && close != std::string::npos) {
        what = what.substr(close + 2);
      }
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": not valid JSON at byte ", e.byte, " of ", text.size(),
                       e.byte >= text.size() ? " (truncated?)" : "", ": ", what));
    }
    MemorySnapshot snapshot;
    if (absl::Status s = Convert(doc, streamer, &snapshot); !s.ok()) return prefixed(s);
    if (absl::Status s = ValidateSnapshot(snapshot); !s.ok()) return prefixed(s);
    return snapshot;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": cannot read the snapshot: ", e.what()));
  }
}

absl::StatusOr<MemorySnapshot> ReadSnapshotFile(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileBytes(path);
  if (!bytes.ok()) return bytes.status();
  return SnapshotFromJson(*bytes, path);
}

}  // namespace graphalloc

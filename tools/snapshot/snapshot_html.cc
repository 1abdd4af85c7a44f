// RenderHtml of snapshot_views.h: the interactive viewer (tools/snapshot/viewer.html, compiled in as
// kViewerHtml) with the snapshot embedded as compact JSON. The page rebuilds allocation lifetimes from the
// history itself, so the JSON carries the raw data only: columns of small integers for the events
// (addresses, sizes, streams and pools interned into tables), interned strings, frames and stacks, and the
// final segments with their blocks as flat arrays. Addresses are written relative to one base (a hex
// string) so that JavaScript's doubles hold them exactly.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "tools/snapshot/snapshot_views.h"
#include "tools/snapshot/viewer_html.h"

namespace graphalloc::tools {
namespace {

constexpr absl::string_view kDataMarker = "/*GRAPHALLOC_SNAPSHOT_JSON*/";

// A JSON string that is safe inside <script>: "<" escaped so the text can never close the element.
std::string JsonString(const std::string& text) {
  const std::string quoted =
      nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return absl::StrReplaceAll(quoted, {{"<", "\\u003c"}});
}

// Values in first-seen order, each replaced by its index.
template <typename T>
class Interner {
 public:
  int Add(const T& value) {
    auto [it, inserted] = index_.try_emplace(value, static_cast<int>(values_.size()));
    if (inserted) values_.push_back(value);
    return it->second;
  }
  const std::vector<T>& values() const { return values_; }

 private:
  std::map<T, int> index_;
  std::vector<T> values_;
};

bool IsAddressAction(HistoryAction action) {
  return action != HistoryAction::kOom && action != HistoryAction::kSnapshot;
}

class DataWriter {
 public:
  explicit DataWriter(const MemorySnapshot& s) : s_(s) {
    base_ = UINT64_MAX;
    for (const SegmentSnapshot& seg : s.segments) base_ = std::min(base_, seg.address);
    for (const HistoryEvent& e : s.history) {
      if (IsAddressAction(e.action)) base_ = std::min(base_, e.address);
    }
    if (base_ == UINT64_MAX) base_ = 0;
  }

  std::string Write(absl::string_view title) {
    std::string segments = Segments();
    std::string events = Events();
    std::string out;
    out.reserve(segments.size() + events.size() + 4096);
    absl::StrAppend(&out, "{\"title\":", JsonString(std::string(title)), ",\"label\":", JsonString(s_.label),
                    ",\"source\":", JsonString(s_.source), ",\"config\":", JsonString(s_.config),
                    ",\"device\":{\"name\":", JsonString(s_.device.name),
                    ",\"total\":", s_.device.total_memory, ",\"gran\":", s_.device.granularity,
                    "},\"base\":\"0x", absl::Hex(base_),
                    "\",\"overflowed\":", s_.history_overflowed ? "true" : "false");
    absl::StrAppend(&out, ",\"segments\":", segments, ",\"events\":", events);
    // The tables last: the segments and events above filled them.
    AppendArray(&out, "addrs", addrs_.values());
    AppendArray(&out, "sizes", sizes_.values());
    AppendStrings(&out, "streams", streams_.values());
    AppendStrings(&out, "pools", pools_.values());
    std::vector<std::string> strings = strings_.values();
    absl::StrAppend(&out, ",\"strings\":[");
    for (std::size_t i = 0; i < strings.size(); ++i)
      absl::StrAppend(&out, i ? "," : "", JsonString(strings[i]));
    absl::StrAppend(&out, "],\"frames\":[");
    const auto& frames = frames_.values();
    for (std::size_t i = 0; i < frames.size(); ++i) {
      absl::StrAppend(&out, i ? "," : "", std::get<0>(frames[i]), ",", std::get<1>(frames[i]), ",",
                      std::get<2>(frames[i]));
    }
    absl::StrAppend(&out, "],\"stacks\":[");
    const auto& stacks = stacks_.values();
    for (std::size_t i = 0; i < stacks.size(); ++i) {
      absl::StrAppend(&out, i ? ",[" : "[");
      for (std::size_t j = 0; j < stacks[i].size(); ++j) absl::StrAppend(&out, j ? "," : "", stacks[i][j]);
      absl::StrAppend(&out, "]");
    }
    absl::StrAppend(&out, "],\"t0\":", s_.history.empty() ? 0 : s_.history.front().time_us, "}");
    return out;
  }

 private:
  // Signed, so that an oom event's free-bytes value below the base survives as a negative number.
  std::int64_t Rel(std::uint64_t address) const { return static_cast<std::int64_t>(address - base_); }

  int Stack(const std::vector<Frame>& frames) {
    if (frames.empty()) return -1;
    std::vector<int> ids;
    ids.reserve(frames.size());
    for (const Frame& f : frames)
      ids.push_back(frames_.Add({strings_.Add(f.function), strings_.Add(f.file), f.line}));
    return stacks_.Add(ids);
  }

  std::string Segments() {
    std::string out = "[";
    for (std::size_t i = 0; i < s_.segments.size(); ++i) {
      const SegmentSnapshot& seg = s_.segments[i];
      absl::StrAppend(&out, i ? "," : "", "{\"a\":", Rel(seg.address), ",\"t\":", seg.total_size,
                      ",\"s\":", streams_.Add(seg.stream), ",\"p\":", pools_.Add(seg.pool_id),
                      ",\"k\":", seg.kind == SegmentKind::kSmall ? 0 : 1, ",\"x\":", seg.expandable ? 1 : 0,
                      ",\"st\":", Stack(seg.frames), ",\"m\":[");
      for (std::size_t j = 0; j < seg.mapped.size(); ++j) {
        absl::StrAppend(&out, j ? "," : "", seg.mapped[j].offset, ",", seg.mapped[j].size, ",",
                        seg.mapped[j].accessible ? 1 : 0);
      }
      absl::StrAppend(&out, "],\"b\":[");
      for (std::size_t j = 0; j < seg.blocks.size(); ++j) {
        const BlockSnapshot& b = seg.blocks[j];
        absl::StrAppend(&out, j ? "," : "", b.size, ",", b.requested_size, ",", static_cast<int>(b.state),
                        ",", streams_.Add(b.stream), ",", Stack(b.frames), ",",
                        b.annotation.empty() ? -1 : strings_.Add(b.annotation));
      }
      absl::StrAppend(&out, "]}");
    }
    absl::StrAppend(&out, "]");
    return out;
  }

  // One array per field; the stream, pool and stack columns are left out when every event has the same
  // (first) stream and pool, or no stack.
  std::string Events() {
    const std::vector<HistoryEvent>& h = s_.history;
    std::string act, addr, size, stream, pool, dt, stack;
    bool one_stream = true, one_pool = true, any_stack = false;
    std::int64_t prev = h.empty() ? 0 : h.front().time_us;
    for (std::size_t i = 0; i < h.size(); ++i) {
      const HistoryEvent& e = h[i];
      const char* sep = i ? "," : "";
      const int st = streams_.Add(e.stream), po = pools_.Add(e.pool_id), sk = Stack(e.frames);
      one_stream = one_stream && st == 0;
      one_pool = one_pool && po == 0;
      any_stack = any_stack || sk >= 0;
      absl::StrAppend(&act, sep, static_cast<int>(e.action));
      absl::StrAppend(&addr, sep, addrs_.Add(Rel(e.address)));
      absl::StrAppend(&size, sep, sizes_.Add(static_cast<std::int64_t>(e.size)));
      absl::StrAppend(&stream, sep, st);
      absl::StrAppend(&pool, sep, po);
      absl::StrAppend(&dt, sep, e.time_us - prev);
      absl::StrAppend(&stack, sep, sk);
      prev = e.time_us;
    }
    std::string out =
        absl::StrCat("{\"act\":[", act, "],\"addr\":[", addr, "],\"size\":[", size, "],\"dt\":[", dt, "]");
    if (!one_stream) absl::StrAppend(&out, ",\"stream\":[", stream, "]");
    if (!one_pool) absl::StrAppend(&out, ",\"pool\":[", pool, "]");
    if (any_stack) absl::StrAppend(&out, ",\"stack\":[", stack, "]");
    absl::StrAppend(&out, "}");
    return out;
  }

  static void AppendArray(std::string* out, absl::string_view key, const std::vector<std::int64_t>& values) {
    absl::StrAppend(out, ",\"", key, "\":[");
    for (std::size_t i = 0; i < values.size(); ++i) absl::StrAppend(out, i ? "," : "", values[i]);
    absl::StrAppend(out, "]");
  }
  // Stream handles and pool ids are 64-bit: written as decimal strings, exact in JavaScript.
  static void AppendStrings(std::string* out, absl::string_view key,
                            const std::vector<std::uint64_t>& values) {
    absl::StrAppend(out, ",\"", key, "\":[");
    for (std::size_t i = 0; i < values.size(); ++i) absl::StrAppend(out, i ? ",\"" : "\"", values[i], "\"");
    absl::StrAppend(out, "]");
  }

  const MemorySnapshot& s_;
  std::uint64_t base_ = 0;
  Interner<std::int64_t> addrs_, sizes_;
  Interner<std::uint64_t> streams_, pools_;
  Interner<std::string> strings_;
  Interner<std::tuple<int, int, int>> frames_;
  Interner<std::vector<int>> stacks_;
};

}  // namespace

std::string RenderHtml(const MemorySnapshot& snapshot, absl::string_view title) {
  const std::size_t at = kViewerHtml.find(kDataMarker);
  const std::string data = DataWriter(snapshot).Write(title);
  std::string out;
  out.reserve(kViewerHtml.size() + data.size());
  absl::StrAppend(&out, kViewerHtml.substr(0, at), data, kViewerHtml.substr(at + kDataMarker.size()));
  return out;
}

}  // namespace graphalloc::tools

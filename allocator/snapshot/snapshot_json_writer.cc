// SnapshotToJson and the file helpers of snapshot_json.h, written with JsonWriter (json_writer_internal.h).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/snapshot/json_writer_internal.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "graphalloc/allocator/stats/stat_names.h"

namespace graphalloc {
namespace {

// Stacks, de-duplicated: each distinct non-empty frame list gets an index into the "stacks" table.
class StackTable {
 public:
  // The stack's index, or -1 for an empty one.
  std::int64_t Intern(const std::vector<Frame>& frames) {
    if (frames.empty()) return -1;
    auto [it, inserted] = index_.try_emplace(&frames, static_cast<std::int64_t>(stacks_.size()));
    if (inserted) stacks_.push_back(&frames);
    return it->second;
  }
  const std::vector<const std::vector<Frame>*>& stacks() const { return stacks_; }

 private:
  struct Hash {
    std::size_t operator()(const std::vector<Frame>* f) const {
      std::size_t h = f->size();
      for (const Frame& frame : *f) {
        h = absl::HashOf(h, frame.function, frame.file, frame.line);
      }
      return h;
    }
  };
  struct Eq {
    bool operator()(const std::vector<Frame>* a, const std::vector<Frame>* b) const { return *a == *b; }
  };
  absl::flat_hash_map<const std::vector<Frame>*, std::int64_t, Hash, Eq> index_;
  std::vector<const std::vector<Frame>*> stacks_;
};

void WriteStat(JsonWriter& j, const Stat& stat) {
  bool first = true;
  j.Char('{');
  for (const auto& [name, field] : kStatFields) {
    j.Key(name, first);
    j.I64(stat.*field);
    first = false;
  }
  j.Char('}');
}

void WriteStats(JsonWriter& j, const DeviceStats& stats) {
  j.Char('{');
  bool first = true;
  for (const StatArrayName& array : kStatArrays) {
    j.Key(array.name, first);
    first = false;
    j.Char('{');
    for (int t = 0; t < kNumStatTypes; ++t) {
      j.Key(kStatTypeNames[t], t == 0);
      WriteStat(j, (stats.*array.member).by_type[t]);
    }
    j.Char('}');
  }
  for (const StatCounterName& counter : kStatCounters) {
    j.Key(counter.name);
    j.I64(stats.*counter.member);
  }
  j.Char('}');
}

void WriteStackRef(JsonWriter& j, StackTable& stacks, const std::vector<Frame>& frames) {
  const std::int64_t id = stacks.Intern(frames);
  if (id < 0) return;
  j.Key("stack");
  j.I64(id);
}

void WriteBlock(JsonWriter& j, StackTable& stacks, const BlockSnapshot& b) {
  j.Raw("{\"address\":");
  j.U64(b.address);
  j.Key("size");
  j.U64(b.size);
  j.Key("requested_size");
  j.U64(b.requested_size);
  j.Key("state");
  j.String(BlockStateName(b.state));
  j.Key("stream");
  j.U64(b.stream);
  WriteStackRef(j, stacks, b.frames);
  if (!b.annotation.empty()) {
    j.Key("annotation");
    j.String(b.annotation);
  }
  j.Char('}');
}

void WriteSegment(JsonWriter& j, StackTable& stacks, const SegmentSnapshot& s) {
  j.Raw("{\"address\":");
  j.U64(s.address);
  j.Key("total_size");
  j.U64(s.total_size);
  j.Key("stream");
  j.U64(s.stream);
  j.Key("pool_id");
  j.U64(s.pool_id);
  j.Key("kind");
  j.String(SegmentKindName(s.kind));
  j.Key("expandable");
  j.Bool(s.expandable);
  if (s.expandable) {
    j.Key("mapped");
    j.Char('[');
    for (std::size_t i = 0; i < s.mapped.size(); ++i) {
      if (i != 0) j.Char(',');
      j.Raw("{\"offset\":");
      j.U64(s.mapped[i].offset);
      j.Raw(",\"size\":");
      j.U64(s.mapped[i].size);
      if (!s.mapped[i].accessible) j.Raw(",\"accessible\":false");
      j.Char('}');
    }
    j.Char(']');
    // Only while a pool sleeps, so that every other snapshot reads as before.
    if (!s.asleep.empty()) {
      j.Key("asleep");
      j.Char('[');
      for (std::size_t i = 0; i < s.asleep.size(); ++i) {
        if (i != 0) j.Char(',');
        j.Raw("{\"offset\":");
        j.U64(s.asleep[i].offset);
        j.Raw(",\"size\":");
        j.U64(s.asleep[i].size);
        j.Char('}');
      }
      j.Char(']');
    }
  }
  WriteStackRef(j, stacks, s.frames);
  j.Key("blocks");
  j.Char('[');
  for (std::size_t i = 0; i < s.blocks.size(); ++i) {
    j.Raw(i == 0 ? "\n    " : ",\n    ");
    WriteBlock(j, stacks, s.blocks[i]);
  }
  j.Raw("]}");
}

void WriteEvent(JsonWriter& j, StackTable& stacks, const HistoryEvent& e) {
  j.Raw("{\"action\":");
  j.String(HistoryActionName(e.action));
  j.Key("address");
  j.U64(e.address);
  j.Key("size");
  j.U64(e.size);
  j.Key("stream");
  j.U64(e.stream);
  j.Key("pool_id");
  j.U64(e.pool_id);
  j.Key("time_us");
  j.I64(e.time_us);
  WriteStackRef(j, stacks, e.frames);
  if (!e.annotation.empty()) {
    j.Key("annotation");
    j.String(e.annotation);
  }
  j.Char('}');
}

}  // namespace

std::string SnapshotToJson(const MemorySnapshot& snapshot) {
  // The stack table is written before the segments and the history that refer to it: intern every stack
  // first, in the order the writer meets them below, so the indexes agree.
  StackTable stacks;
  std::size_t blocks = 0;
  for (const SegmentSnapshot& s : snapshot.segments) {
    stacks.Intern(s.frames);
    for (const BlockSnapshot& block : s.blocks) stacks.Intern(block.frames);
    blocks += s.blocks.size();
  }
  for (const HistoryEvent& e : snapshot.history) stacks.Intern(e.frames);

  std::string out;
  out.reserve(4096 + stacks.stacks().size() * 256 + snapshot.segments.size() * 160 + blocks * 110 +
              snapshot.history.size() * 130);
  JsonWriter j(&out);
  j.Raw("{\"format\":");
  j.String(kSnapshotFormatName);
  j.Raw(",\"version\":");
  j.I64(snapshot.format_version);
  j.Raw(",\n\"label\":");
  j.String(snapshot.label);
  j.Key("source");
  j.String(snapshot.source);
  j.Key("time_us");
  j.I64(snapshot.time_us);
  j.Raw(",\n\"device\":{\"ordinal\":");
  j.I64(snapshot.device.ordinal);
  j.Key("name");
  j.String(snapshot.device.name);
  j.Key("total_memory");
  j.U64(snapshot.device.total_memory);
  j.Key("granularity");
  j.U64(snapshot.device.granularity);
  j.Raw("},\n\"config\":");
  j.String(snapshot.config);
  j.Raw(",\n\"stats\":");
  WriteStats(j, snapshot.stats);
  j.Raw(",\n\"pools\":[");
  for (std::size_t i = 0; i < snapshot.pools.size(); ++i) {
    const PoolSnapshot& p = snapshot.pools[i];
    j.Raw(i == 0 ? "\n  {\"id\":" : ",\n  {\"id\":");
    j.U64(p.id);
    j.Key("use_count");
    j.I64(p.use_count);
    j.Key("reserved_bytes");
    j.U64(p.reserved_bytes);
    j.Key("allocated_bytes");
    j.U64(p.allocated_bytes);
    j.Key("peak_reserved_bytes");
    j.U64(p.peak_reserved_bytes);
    j.Key("peak_allocated_bytes");
    j.U64(p.peak_allocated_bytes);
    if (!p.owner.empty()) {
      j.Key("owner");
      j.String(p.owner);
    }
    if (p.graph_pins != 0) {
      j.Key("graph_pins");
      j.I64(p.graph_pins);
    }
    j.Char('}');
  }
  j.Raw("],\n\"stacks\":[");
  for (std::size_t i = 0; i < stacks.stacks().size(); ++i) {
    j.Raw(i == 0 ? "\n  [" : ",\n  [");
    const std::vector<Frame>& frames = *stacks.stacks()[i];
    for (std::size_t f = 0; f < frames.size(); ++f) {
      j.Raw(f == 0 ? "{\"function\":" : ",{\"function\":");
      j.String(frames[f].function);
      j.Key("file");
      j.String(frames[f].file);
      j.Key("line");
      j.I64(frames[f].line);
      j.Char('}');
    }
    j.Char(']');
  }
  j.Char(']');
  j.Raw(",\n\"segments\":[");
  for (std::size_t i = 0; i < snapshot.segments.size(); ++i) {
    j.Raw(i == 0 ? "\n  " : ",\n  ");
    WriteSegment(j, stacks, snapshot.segments[i]);
  }
  j.Raw("],\n\"history\":{\"max_entries\":");
  j.U64(snapshot.history_max_entries);
  j.Raw(",\"overflowed\":");
  j.Bool(snapshot.history_overflowed);
  j.Raw(",\"events\":[");
  for (std::size_t i = 0; i < snapshot.history.size(); ++i) {
    j.Raw(i == 0 ? "\n  " : ",\n  ");
    WriteEvent(j, stacks, snapshot.history[i]);
  }
  j.Raw("]}\n}\n");

  return out;
}

absl::StatusOr<std::string> ReadFileBytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::string bytes;
  char buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return bytes;
}

absl::Status WriteFileBytes(const std::string& path, absl::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::InternalError(absl::StrCat(path, ": cannot open for writing: ", std::strerror(errno)));
  }
  // The reason matters (a full disk, a closed pipe): keep the first failure's errno.
  const bool wrote = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  int error = wrote ? 0 : errno;
  const bool flushed = std::fflush(f) == 0;
  if (!flushed && error == 0) error = errno;
  const bool closed = std::fclose(f) == 0;
  if (!closed && error == 0) error = errno;
  if (!wrote || !flushed || !closed) {
    return absl::InternalError(absl::StrCat(path, ": write failed: ", std::strerror(error)));
  }
  return absl::OkStatus();
}

absl::Status WriteSnapshotFile(const MemorySnapshot& snapshot, const std::string& path) {
  return WriteFileBytes(path, SnapshotToJson(snapshot));
}

}  // namespace graphalloc

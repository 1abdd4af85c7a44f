// Reading and writing allocation traces (trace_reader.h): CSV parsing with line-numbered errors, gzip via
// zlib's inflate/deflate on in-memory buffers.
#include "graphalloc/allocator/trace/trace_reader.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"

namespace graphalloc {
namespace {

constexpr std::array<absl::string_view, 5> kFieldNames = {"action", "addr", "size", "stream", "time_us"};

// Shortens what is quoted back to the user, so a binary file does not flood the terminal.
std::string Quote(absl::string_view text) {
  constexpr std::size_t kMax = 40;
  std::string out = "'";
  for (char c : text.substr(0, kMax)) {
    out += (static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f) ? c : '?';
  }
  if (text.size() > kMax) out += "...";
  out += "'";
  return out;
}

std::string ExpectedActions() {
  std::vector<absl::string_view> names;
  for (int a = 0; IsTraceAction(static_cast<HistoryAction>(a)); ++a) {
    names.push_back(HistoryActionName(static_cast<HistoryAction>(a)));
  }
  return absl::StrJoin(names, ", ");
}

template <typename Int>
bool ParseInt(absl::string_view text, Int* out) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

bool HasGzipMagic(absl::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

}  // namespace

std::optional<TraceAction> ParseTraceAction(absl::string_view name) {
  std::optional<HistoryAction> action = ParseHistoryAction(name);
  if (!action.has_value() || !IsTraceAction(*action)) return std::nullopt;
  return action;
}

std::string Trace::Where(std::size_t index) const {
  if (index < events.size() && events[index].line != 0) return absl::StrCat(name, ":", events[index].line);
  return absl::StrCat(name, ", event ", index);
}

absl::StatusOr<Trace> ParseTrace(absl::string_view csv, absl::string_view source) {
  Trace trace;
  const std::size_t slash = source.rfind('/');
  trace.name = std::string(slash == absl::string_view::npos ? source : source.substr(slash + 1));
  // Rows are ~50 bytes; reserving avoids regrowing a 134k-event vector many times.
  trace.events.reserve(csv.size() / 48 + 1);

  std::size_t pos = 0;
  std::uint64_t line_number = 0;
  bool saw_header = false;
  while (pos < csv.size()) {
    std::size_t eol = csv.find('\n', pos);
    if (eol == absl::string_view::npos) eol = csv.size();
    absl::string_view line = csv.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_number > std::numeric_limits<std::uint32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": more than ", std::numeric_limits<std::uint32_t>::max(), " lines"));
    }
    if (!saw_header) {
      if (line != kTraceHeader) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ":1: missing header; expected '", kTraceHeader, "', found ", Quote(line)));
      }
      saw_header = true;
      continue;
    }
    if (line.empty()) continue;  // blank lines (a trailing one, typically) carry no event

    std::array<absl::string_view, 5> fields;
    std::size_t count = 0;
    for (absl::string_view field : absl::StrSplit(line, ',')) {
      if (count < fields.size()) fields[count] = field;
      ++count;
    }
    if (count != fields.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": expected 5 fields (", kTraceHeader, "), found ", count));
    }
    TraceEvent event;
    event.line = static_cast<std::uint32_t>(line_number);
    std::optional<TraceAction> action = ParseTraceAction(fields[0]);
    if (!action.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_number, ": unknown action ",
                                                     Quote(fields[0]), "; expected one of ",
                                                     ExpectedActions()));
    }
    event.action = *action;
    std::uint64_t* unsigned_fields[] = {&event.addr, &event.size, &event.stream};
    for (int i = 0; i < 3; ++i) {
      if (!ParseInt(fields[i + 1], unsigned_fields[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ":", line_number, ": field '", kFieldNames[i + 1],
                         "' is not a non-negative integer: ", Quote(fields[i + 1])));
      }
    }
    if (!ParseInt(fields[4], &event.time_us)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": field 'time_us' is not an integer: ", Quote(fields[4])));
    }
    trace.events.push_back(event);
  }
  if (!saw_header) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": empty trace; expected the header '", kTraceHeader, "'"));
  }
  trace.events.shrink_to_fit();
  return trace;
}

absl::StatusOr<std::string> GunzipBytes(absl::string_view gz, absl::string_view source) {
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
    return absl::InternalError(absl::StrCat(source, ": zlib failed to initialise"));
  }
  std::string out;
  out.resize(std::max<std::size_t>(gz.size() * 4, 1 << 16));
  std::size_t produced = 0;
  std::size_t consumed = 0;
  absl::Status status;
  while (true) {
    constexpr std::size_t kMaxChunk = std::size_t{1} << 30;  // avail_in/avail_out are 32-bit
    if (produced == out.size()) out.resize(out.size() * 2);
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data() + consumed));
    zs.avail_in = static_cast<uInt>(std::min(gz.size() - consumed, kMaxChunk));
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    zs.avail_out = static_cast<uInt>(std::min(out.size() - produced, kMaxChunk));
    const uInt in_before = zs.avail_in;
    const uInt out_before = zs.avail_out;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    consumed += in_before - zs.avail_in;
    produced += out_before - zs.avail_out;
    if (rc == Z_STREAM_END) {
      if (consumed == gz.size()) break;
      // Another gzip member may follow (as `cat a.gz b.gz` makes); anything else is trailing garbage.
      if (!HasGzipMagic(gz.substr(consumed))) {
        status = absl::DataLossError(absl::StrCat(source, ": ", gz.size() - consumed,
                                                  " bytes of trailing garbage after the gzip stream"));
        break;
      }
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && consumed == gz.size()) {
      status = absl::DataLossError(absl::StrCat(source, ": truncated gzip file (ends after ", gz.size(),
                                                " bytes, in the middle of the compressed stream)"));
      break;
    }
    if (rc == Z_BUF_ERROR) continue;  // no progress possible with this output space: grow it
    status = absl::DataLossError(absl::StrCat(
        source, ": corrupt gzip data: ", zs.msg != nullptr ? zs.msg : "zlib error", " (code ", rc, ")"));
    break;
  }
  inflateEnd(&zs);
  if (!status.ok()) return status;
  out.resize(produced);
  return out;
}

absl::StatusOr<Trace> ReadTrace(const std::string& path, const TraceReadOptions& options) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    // An ifstream opens a directory and its first read throws std::ios_failure.
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory; give a trace file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open the trace: ", std::strerror(errno)));
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error: ", std::strerror(errno)));
  return TraceFromBytes(std::move(bytes), path, options);
}

absl::StatusOr<Trace> TraceFromBytes(std::string bytes, absl::string_view source,
                                     const TraceReadOptions& options) {
  if (HasGzipMagic(bytes)) {
    absl::StatusOr<std::string> csv = GunzipBytes(bytes, source);
    if (!csv.ok()) return csv.status();
    bytes = std::move(*csv);
  }
  const std::size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && bytes[first] == '{') {
    absl::StatusOr<MemorySnapshot> snapshot = SnapshotFromJson(bytes, source);
    if (!snapshot.ok()) return snapshot.status();
    return TraceFromHistory(*snapshot, source, options);
  }
  return ParseTrace(bytes, source);
}

std::string FormatTraceCsv(const Trace& trace) {
  std::string out;
  out.reserve(64 * (trace.events.size() + 1));
  absl::StrAppend(&out, kTraceHeader, "\n");
  for (const TraceEvent& e : trace.events) {
    absl::StrAppend(&out, HistoryActionName(e.action), ",", e.addr, ",", e.size, ",", e.stream, ",",
                    e.time_us, "\n");
  }
  return out;
}

absl::Status WriteTrace(const Trace& trace, const std::string& path, bool gzip) {
  std::string bytes = FormatTraceCsv(trace);
  if (gzip) {
    if (bytes.size() > std::numeric_limits<uInt>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": trace too large to gzip in one piece"));
    }
    z_stream zs{};
    if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
      return absl::InternalError(absl::StrCat(path, ": zlib failed to initialise"));
    }
    std::string gz(deflateBound(&zs, static_cast<uLong>(bytes.size())), '\0');
    zs.next_in = reinterpret_cast<Bytef*>(bytes.data());
    zs.avail_in = static_cast<uInt>(bytes.size());
    zs.next_out = reinterpret_cast<Bytef*>(gz.data());
    zs.avail_out = static_cast<uInt>(gz.size());
    const int rc = deflate(&zs, Z_FINISH);
    gz.resize(zs.total_out);
    deflateEnd(&zs);
    if (rc != Z_STREAM_END) {
      return absl::InternalError(absl::StrCat(path, ": gzip compression failed (code ", rc, ")"));
    }
    bytes = std::move(gz);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    return absl::NotFoundError(absl::StrCat(path, ": cannot create the file: ", std::strerror(errno)));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace graphalloc

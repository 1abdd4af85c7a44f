// ExportToken's printable form.
#include "graphalloc/allocator/ipc/export_token.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace graphalloc::ipc {
namespace {

constexpr absl::string_view kPrefix = "graphalloc-ipc";
constexpr absl::string_view kVersion = "1";

absl::Status Bad(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("not a graphalloc export token (", why, "): \"",
                                                 text.substr(0, ExportToken::kMaxLength), "\""));
}

}  // namespace

std::string ExportToken::ToString() const {
  return absl::StrFormat("%s:%s:%s:%d:%d:%x:%d:%c", kPrefix, kVersion, socket, pid, block_id, ptr, size,
                         kind == SegmentKind::kExpandable ? 'e' : 'r');
}

std::string ExportToken::Describe() const {
  return absl::StrFormat("block 0x%x (%d bytes) of pid %d", ptr, size, pid);
}

absl::StatusOr<ExportToken> ExportToken::Parse(absl::string_view text) {
  if (text.size() > kMaxLength) return Bad(text, absl::StrCat("longer than ", kMaxLength, " bytes"));
  const std::vector<absl::string_view> f = absl::StrSplit(text, ':');
  if (f.size() != 8) return Bad(text, "expected 8 fields separated by ':'");
  if (f[0] != kPrefix) return Bad(text, "no graphalloc-ipc prefix");
  if (f[1] != kVersion) return Bad(text, absl::StrCat("version ", f[1], ", this library reads ", kVersion));
  ExportToken t;
  t.socket = std::string(f[2]);
  if (t.socket.empty()) return Bad(text, "empty socket name");
  std::int64_t pid = 0;
  if (!absl::SimpleAtoi(f[3], &pid) || pid <= 0) return Bad(text, "bad pid");
  t.pid = static_cast<pid_t>(pid);
  if (!absl::SimpleAtoi(f[4], &t.block_id)) return Bad(text, "bad block id");
  std::uint64_t ptr = 0;
  if (!absl::SimpleHexAtoi(f[5], &ptr) || ptr == 0) return Bad(text, "bad address");
  t.ptr = static_cast<DevicePtr>(ptr);
  std::uint64_t size = 0;
  if (!absl::SimpleAtoi(f[6], &size) || size == 0) return Bad(text, "bad size");
  t.size = static_cast<std::size_t>(size);
  if (f[7] == "e") {
    t.kind = SegmentKind::kExpandable;
  } else if (f[7] == "r") {
    t.kind = SegmentKind::kRegular;
  } else {
    return Bad(text, "segment kind is neither 'e' nor 'r'");
  }
  return t;
}

}  // namespace graphalloc::ipc

#include "graphalloc/allocator/base/bytes.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace graphalloc {

std::string FormatBytes(std::uint64_t bytes) {
  if (bytes <= 1024) return absl::StrFormat("%d bytes", bytes);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (v >= 1024.0 && unit < 3) {
    v /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", v, kUnits[unit]);
}

std::string FormatBytesExact(std::uint64_t bytes) {
  if (bytes <= 1024) return FormatBytes(bytes);
  return absl::StrFormat("%s (%d bytes)", FormatBytes(bytes), bytes);
}

std::string HexAddress(std::uint64_t address) { return absl::StrCat("0x", absl::Hex(address)); }

}  // namespace graphalloc

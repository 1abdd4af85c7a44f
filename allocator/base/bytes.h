// Byte quantities: the binary units, rounding up to a multiple, and sizes and addresses as people read them.
#ifndef GRAPHALLOC_ALLOCATOR_BASE_BYTES_H_
#define GRAPHALLOC_ALLOCATOR_BASE_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace graphalloc {

inline constexpr std::size_t kKiB = std::size_t{1} << 10;
inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kGiB = std::size_t{1} << 30;

// The smallest multiple of `multiple` (> 0) that is >= `value`.
constexpr std::size_t RoundUp(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// "512 bytes", "1.50 KiB", "2.00 GiB", "3.00 TiB": PyTorch's format for sizes in messages, which
// graphalloc's errors, reports and CLI share (up to 1024 in bytes, then two decimals of the largest unit
// below the size).
std::string FormatBytes(std::uint64_t bytes);
// FormatBytes with the exact count beside a rounded figure: "2.00 MiB (2097152 bytes)", "512 bytes".
std::string FormatBytesExact(std::uint64_t bytes);
// An address (or stream handle) as messages, snapshots' validation errors and the CLI print it: "0x" and
// lowercase hex digits, no padding ("0x7f3a00200000").
std::string HexAddress(std::uint64_t address);

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_BASE_BYTES_H_

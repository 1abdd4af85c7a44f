#include <cmath>
#include <cstddef>

#include "graphalloc/allocator/snapshot/json_writer_internal.h"
#include "graphalloc/allocator/snapshot/snapshot_internal.h"

namespace graphalloc {

void JsonWriter::Double(double v) {
  if (!std::isfinite(v)) {
    Raw("null");
    return;
  }
  const std::size_t start = out_.size();
  Number(v);
  // An integral value gets a fraction, so that parsers read a floating-point number: "-0" would come back
  // as the integer 0, losing the sign.
  if (out_.find_first_of(".e", start) == std::string::npos) Raw(".0");
}

void JsonWriter::String(absl::string_view s) {
  Char('"');
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      // A run of characters that need no escaping, appended at once.
      std::size_t j = i + 1;
      while (j < s.size()) {
        const auto d = static_cast<unsigned char>(s[j]);
        if (d < 0x20 || d >= 0x80 || d == '"' || d == '\\') break;
        ++j;
      }
      out_.append(s.data() + i, j - i);
      i = j;
      continue;
    }
    if (c == '"' || c == '\\') {
      Char('\\');
      Char(static_cast<char>(c));
    } else if (c == '\n') {
      Raw("\\n");
    } else if (c == '\t') {
      Raw("\\t");
    } else if (c < 0x20) {
      static constexpr char kHex[] = "0123456789abcdef";
      Raw("\\u00");
      Char(kHex[c >> 4]);
      Char(kHex[c & 15]);
    } else if (std::size_t n = snapshot_internal::Utf8SequenceLength(s, i); n != 0) {
      out_.append(s.data() + i, n);
      i += n;
      continue;
    } else {
      Raw("\\ufffd");
    }
    ++i;
  }
  Char('"');
}

}  // namespace graphalloc

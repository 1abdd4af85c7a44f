// A streaming JSON writer into one std::string: what the snapshot writer (snapshot_json_writer.cc) is made
// of. Numbers are formatted with std::to_chars, never printf or a stream: no locale can change a byte, and a
// double is written in the shortest form that reads back to the same value. Strings are escaped and made
// valid UTF-8 (an invalid byte becomes U+FFFD). It writes what it is told, in order: the caller places the
// braces and brackets, and Key() the comma before each key but the first.
#ifndef GRAPHALLOC_ALLOCATOR_SNAPSHOT_JSON_WRITER_INTERNAL_H_
#define GRAPHALLOC_ALLOCATOR_SNAPSHOT_JSON_WRITER_INTERNAL_H_

#include <charconv>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace graphalloc {

class JsonWriter {
 public:
  // Appends to `*out`, which must outlive the writer.
  explicit JsonWriter(std::string* out) : out_(*out) {}

  void Raw(absl::string_view text) { out_.append(text.data(), text.size()); }
  void Char(char c) { out_.push_back(c); }
  void U64(std::uint64_t v) { Number(v); }
  void I64(std::int64_t v) { Number(v); }
  // The shortest decimal form that parses back to `v` exactly ("0.1", "1e+300"), with ".0" after an
  // integral value ("1.0", "-0.0") so that parsers read it as floating point; NaN and the infinities, which
  // JSON cannot hold, as null.
  void Double(double v);
  void Bool(bool v) { Raw(v ? "true" : "false"); }
  // `s` as a JSON string, quotes included.
  void String(absl::string_view s);
  // `"key":`, with a comma before it unless `first`. `key` is written as is: it must need no escaping.
  void Key(absl::string_view key, bool first = false) {
    if (!first) Char(',');
    Char('"');
    Raw(key);
    Raw("\":");
  }

 private:
  template <typename T>
  void Number(T v) {
    char buf[32];  // the longest: a double's 24 characters ("-2.2250738585072014e-308")
    const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
    out_.append(buf, static_cast<std::size_t>(r.ptr - buf));
  }

  std::string& out_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_SNAPSHOT_JSON_WRITER_INTERNAL_H_

// A small Python pickle writer and reader for plain data (dicts, lists, tuples, str, int, float, bool,
// None): what PyTorch's memory snapshots are made of. No Python is needed and no class is ever
// instantiated; a pickle that asks for anything else (GLOBAL, REDUCE, BUILD, ...) is rejected.
//
// PickleWriter emits protocol 2 with only the opcodes both CPython and PyTorch's MemoryViz.js read.
// ParsePickle reads protocols 0-5 as far as the opcodes of plain data go: PROTO, FRAME, STOP, MARK,
// POP, POP_MARK, DUP, EMPTY_DICT, DICT, SETITEM(S), EMPTY_LIST, LIST, APPEND(S), EMPTY_TUPLE, TUPLE,
// TUPLE1-3, BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, BINBYTES, SHORT_BINBYTES, BININT, BININT1, BININT2,
// LONG1, NONE, NEWTRUE, NEWFALSE, BINFLOAT, PUT/BINPUT/LONG_BINPUT/MEMOIZE, GET/BINGET/LONG_BINGET. Errors
// name the byte offset; nothing throws.
#ifndef GRAPHALLOC_ALLOCATOR_SNAPSHOT_PICKLE_H_
#define GRAPHALLOC_ALLOCATOR_SNAPSHOT_PICKLE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace graphalloc {

struct PickleNode;

// One unpickled value. Containers live in the PickleDocument's arena (`node`), so that a value shared
// through the memo is one object, as in Python, and no teardown recurses.
struct PickleValue {
  enum class Kind : std::uint8_t { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict };
  Kind kind = Kind::kNone;
  bool boolean = false;
  std::int64_t integer = 0;  // also holds bools' 0/1 for callers that want ints
  double number = 0;
  std::string text;            // kString (UTF-8) and kBytes
  PickleNode* node = nullptr;  // kList, kTuple, kDict

  bool IsInt() const { return kind == Kind::kInt || kind == Kind::kBool; }
  bool IsSequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
  // Python's type name ("int", "str", "dict", ...) for error messages.
  absl::string_view TypeName() const;
};

struct PickleNode {
  std::vector<PickleValue> items;                            // list and tuple elements
  std::vector<std::pair<PickleValue, PickleValue>> entries;  // dict entries in insertion order

  // The value of the dict entry whose key is the string `key`, or nullptr.
  const PickleValue* Find(absl::string_view key) const;
};

struct PickleDocument {
  std::deque<PickleNode> nodes;
  PickleValue root;
};

// Parses a pickle. InvalidArgument naming the byte offset for a truncated stream, an unknown or
// unsupported opcode, a stack or memo misuse, or an integer beyond 64 bits. `source` starts the message.
absl::StatusOr<std::unique_ptr<PickleDocument>> ParsePickle(absl::string_view bytes,
                                                            absl::string_view source);

// Writes a pickle (protocol 2) by streaming values: the caller opens and closes containers in order.
//   PickleWriter w; w.BeginDict(); w.String("a"); w.Int(1); w.EndDict(); std::string bytes = w.Finish();
class PickleWriter {
 public:
  PickleWriter();
  void None();
  void Bool(bool value);
  void Int(std::int64_t value);
  void UInt(std::uint64_t value);
  void String(absl::string_view value);
  // Dict entries are written as key, value, key, value ... between BeginDict and EndDict.
  void BeginDict();
  void EndDict();
  void BeginList();
  void EndList();
  // A tuple of exactly the values written between BeginTuple and EndTuple.
  void BeginTuple();
  void EndTuple();
  // Adds STOP and returns the bytes; the writer is empty afterwards.
  std::string Finish();

 private:
  void Long1(std::uint64_t magnitude_bits, int bytes);
  std::string out_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_SNAPSHOT_PICKLE_H_

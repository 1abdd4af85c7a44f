#include "tests/testing/cli_run.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>

#include "gtest/gtest.h"

namespace graphalloc::testing {

CliRun RunCommand(const std::string& command) {
  CliRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  std::size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) run.output.append(buf, n);
  const int status = pclose(pipe);
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  return dir;
}

CliRun RunCli(const std::string& binary, const std::string& args, const std::string& env) {
  return RunCommand((env.empty() ? "" : env + " ") + binary + " " + args + " 2>&1");
}

}  // namespace graphalloc::testing

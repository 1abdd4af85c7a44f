// Runs a command (the built graphalloc command line, or a browser) in a shell and collects its exit code and
// output, for the tests that check each subcommand's messages and exit codes end to end.
#ifndef GRAPHALLOC_TESTS_TESTING_CLI_RUN_H_
#define GRAPHALLOC_TESTS_TESTING_CLI_RUN_H_

#include <string>

namespace graphalloc::testing {

struct CliRun {
  int code = -1;       // the exit code; -1 when the process did not exit normally
  std::string output;  // stdout and stderr, interleaved
};

// Runs `command` through the shell (popen) and collects its stdout and exit code.
CliRun RunCommand(const std::string& command);

// A fresh, empty directory `name` under GoogleTest's temporary directory (removed first when it is there),
// for a test's files; its path.
std::string FreshDir(const std::string& name);

// Runs "`binary` `args` 2>&1" through the shell (so `args` may hold redirections and `env` assignments
// like "GRAPHALLOC_CONF=x" that go before the binary).
CliRun RunCli(const std::string& binary, const std::string& args, const std::string& env = "");

#ifdef GRAPHALLOC_CLI_PATH
// The graphalloc binary the test was built against (its CMake target passes GRAPHALLOC_CLI_PATH).
inline CliRun Cli(const std::string& args, const std::string& env = "") {
  return RunCli(GRAPHALLOC_CLI_PATH, args, env);
}
#endif

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_TESTING_CLI_RUN_H_

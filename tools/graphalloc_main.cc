// The graphalloc command-line tool: main() only wires the subcommands together, and makes sure what they
// print on stdout arrived.
//
// Each subcommand lives in its own file and registers itself onto the CLI11 app (AddXCommand(app)). Its
// callback prints its result and reports failure by throwing CLI::RuntimeError(code); the exit codes are
// tools/cli_common.h's, the same for every subcommand. Output that could not be written (a full disk, a
// closed pipe) is an error too: exit 2 with the reason, never 0 with the output lost.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "graphalloc/allocator/c_api/graphalloc.h"
#include "tools/cli_common.h"
#include "tools/device_command.h"
#include "tools/oom_report_command.h"
#include "tools/replay_command.h"
#include "tools/snapshot_command.h"

namespace {

// The first word that names no subcommand where one is required ("graphalloc help", "graphalloc
// snapshot sumary"), or "" when there is none. CLI11 would report "A subcommand is required" instead.
std::string UnknownSubcommand(CLI::App& app, int argc, char** argv, std::string* path) {
  CLI::App* current = &app;
  *path = "graphalloc";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return "";
    const std::vector<CLI::App*> found =
        current->get_subcommands([&word](CLI::App* sub) { return sub->check_name(word); });
    if (found.empty()) return current->get_subcommands({}).empty() ? "" : word;
    current = found.front();
    *path += " " + current->get_name();
  }
  return "";
}

// Flushes stdout; on failure says why on stderr and returns kExitCannotWrite, else `code`.
int FinishStdout(int code) {
  // std::cout writes through stdout (synced with stdio), and its flush flushes stdout: the first failing
  // write sets errno.
  errno = 0;
  std::cout.flush();
  int error = errno;
  const bool flushed = std::fflush(stdout) == 0;
  if (error == 0) error = errno;
  if (flushed && !std::ferror(stdout) && std::cout.good()) return code;
  std::cerr << "graphalloc: cannot write the output to stdout: "
            << (error != 0 ? std::strerror(error) : "write error") << "\n";
  return graphalloc::tools::kExitCannotWrite;
}

int Run(int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
  // A closed pipe is a write error to report (EPIPE), not a silent death by SIGPIPE. Output to a file or a
  // pipe goes out in one buffer, so that a failure shows at the final flush with its errno.
  std::signal(SIGPIPE, SIG_IGN);
  static char buffer[1 << 20];
  if (isatty(STDOUT_FILENO) == 0) std::setvbuf(stdout, buffer, _IOFBF, sizeof(buffer));
  return FinishStdout(Run(argc, argv));
}

namespace {

int Run(int argc, char** argv) {
  CLI::App app{
      "graphalloc: a caching CUDA memory allocator with private pools; inspection and self-check tool\n"
      "Exit codes: 0 ok, 1 a failed check (snapshot check, a replay out of memory, the device check), "
      "2 bad input or usage (also an output that cannot be written)"};
  app.require_subcommand(1);
  app.set_version_flag("-V,--version", graphalloc_version(), "Print the version and exit");
  CLI::App* version = app.add_subcommand("version", "Print the version");
  version->callback([] { std::cout << graphalloc_version() << "\n"; });
  graphalloc::tools::AddDeviceCommand(app);
  graphalloc::tools::AddReplayCommand(app);
  graphalloc::tools::AddSnapshotCommand(app);
  graphalloc::tools::AddOomReportCommand(app);

  std::string path;
  if (const std::string unknown = UnknownSubcommand(app, argc, argv, &path); !unknown.empty()) {
    std::cerr << path << ": unknown subcommand '" << unknown << "'; run " << path << " --help\n";
    return graphalloc::tools::kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a subcommand's own failure: it has printed why
    return e.get_exit_code();
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints what was wrong with the command line
    return graphalloc::tools::kExitBadInput;
  }
  return graphalloc::tools::kExitOk;
}

}  // namespace

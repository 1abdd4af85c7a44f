// The graphalloc command-line tool: main() only wires the subcommands together.
//
// Each subcommand lives in its own file and registers itself onto the CLI11 app (AddXCommand(app)). Its
// callback prints its result and reports failure by throwing CLI::RuntimeError(code). Exit codes, for every
// subcommand: 0 ok, 1 a failed check or operation, 2 bad input (unknown option, bad value, missing argument).
#include <CLI/CLI.hpp>

#include "tools/device_command.h"
#include "tools/replay_command.h"
#include "tools/snapshot_command.h"

namespace {

constexpr int kExitBadInput = 2;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "graphalloc: a caching CUDA memory allocator with private pools; inspection and self-check tool"};
  app.require_subcommand(1);
  graphalloc::tools::AddDeviceCommand(app);
  graphalloc::tools::AddReplayCommand(app);
  graphalloc::tools::AddSnapshotCommand(app);
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
    return kExitBadInput;
  }
  return 0;
}

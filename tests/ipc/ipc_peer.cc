// The importing process of the ipc tests (block_sharing_test.cc starts it with posix_spawn): imports the
// block a token names on the device GRAPHALLOC_TEST_DEVICE selects, and does what its mode says.
//   ipc_peer check <token> <expect seed> <write seed>  import, check the exporter's pattern, write ours,
//                                                       close; exit 0
//   ipc_peer hold <token> <expect seed> <write seed>   the same, then print "ready" and keep the block
//                                                       until stdin closes
//   ipc_peer fail <token> <text>                        the import must fail with `text` in its message
// Exit codes: 0 done, 2 import failed, 3 wrong contents, 4 the expected failure did not come, 5 usage or
// device trouble. What went wrong is printed on stderr.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "graphalloc/allocator/ipc/block_importer.h"
#include "tests/ipc/ipc_pattern.h"
#include "tests/testing/test_device.h"

namespace {

using graphalloc::Driver;
using graphalloc::ipc::ExportToken;
using graphalloc::ipc::ImportBlock;
using graphalloc::ipc::ImportedBlock;

int Run(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: ipc_peer check|hold|fail <token> ...\n");
    return 5;
  }
  const std::string mode = argv[1];
  std::string skip;
  std::shared_ptr<Driver> driver = graphalloc::testing::MakeTestDriver(&skip);
  if (driver == nullptr) {
    std::fprintf(stderr, "ipc_peer: no device: %s\n", skip.c_str());
    return 5;
  }
  absl::StatusOr<ExportToken> token = ExportToken::Parse(argv[2]);
  absl::StatusOr<ImportedBlock> block =
      token.ok() ? ImportBlock(*driver, *token) : absl::StatusOr<ImportedBlock>(token.status());
  if (mode == "fail") {
    if (block.ok()) {
      std::fprintf(stderr, "ipc_peer: the import succeeded\n");
      return 4;
    }
    if (!absl::StrContains(block.status().ToString(), argv[3])) {
      std::fprintf(stderr, "ipc_peer: the import failed otherwise: %s\n", block.status().ToString().c_str());
      return 4;
    }
    return 0;
  }
  if (!block.ok()) {
    std::fprintf(stderr, "ipc_peer: %s\n", block.status().ToString().c_str());
    return 2;
  }
  if (argc < 5) return 5;
  const int expect = std::atoi(argv[3]);
  const int write = std::atoi(argv[4]);
  std::vector<std::uint8_t> bytes(block->size());
  if (!driver->CopyDeviceToHost(bytes.data(), block->ptr(), bytes.size()).ok()) return 5;
  if (bytes != graphalloc::testing::IpcPattern(bytes.size(), expect)) {
    std::fprintf(stderr, "ipc_peer: the block does not hold the exporter's pattern\n");
    return 3;
  }
  const std::vector<std::uint8_t> ours = graphalloc::testing::IpcPattern(bytes.size(), write);
  if (!driver->CopyHostToDevice(block->ptr(), ours.data(), ours.size()).ok()) return 5;
  if (!driver->DeviceSynchronize().ok()) return 5;
  if (mode == "hold") {
    std::printf("ready\n");
    std::fflush(stdout);
    char c;
    while (read(STDIN_FILENO, &c, 1) > 0) {
    }
  }
  if (absl::Status s = block->Close(); !s.ok()) {
    std::fprintf(stderr, "ipc_peer: close: %s\n", s.ToString().c_str());
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }

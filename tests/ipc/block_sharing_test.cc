// Two processes share blocks (allocator/ipc/): this test exports from its allocator and starts ipc_peer
// (posix_spawn: a fresh program, not a fork of this threaded one) to import, check the exporter's bytes
// and write its own. Cases: an expandable block over several chunks, a regular segment's block, the owner
// freeing while the importer holds, the importer killed while holding, a pool whose handles do not
// export, a bad token, an exporter that is gone. CheckInvariants() after every step.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/config.h"
#include "graphalloc/allocator/ipc/block_exporter.h"
#include "graphalloc/allocator/ipc/block_importer.h"
#include "graphalloc/allocator/ipc/export_token.h"
#include "gtest/gtest.h"
#include "tests/ipc/ipc_pattern.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_device.h"

extern char** environ;

namespace graphalloc {
namespace {

using ::graphalloc::testing::IpcPattern;
using ipc::BlockExporter;
using ipc::ExportToken;
using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr absl::Duration kWait = absl::Seconds(60);

// An ipc_peer process with its stdin and stdout on pipes.
class Peer {
 public:
  explicit Peer(const std::vector<std::string>& args) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    std::vector<std::string> all = {GRAPHALLOC_IPC_PEER};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, GRAPHALLOC_IPC_PEER, &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  ~Peer() {
    CloseStdin();
    if (stdout_ >= 0) close(stdout_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool started() const { return pid_ > 0; }
  // The peer's next line of output ("" when it ended first).
  std::string ReadLine() {
    std::string line;
    char c;
    while (read(stdout_, &c, 1) == 1 && c != '\n') line.push_back(c);
    return line;
  }
  void CloseStdin() {
    if (stdin_ >= 0) close(stdin_);
    stdin_ = -1;
  }
  void Kill() { kill(pid_, SIGKILL); }
  // The exit code, or 128 + the signal that ended it.
  int Wait() {
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
};

class BlockSharingTest : public testing::AllocatorFixture {
 protected:
  void SetUp() override { GRAPHALLOC_ALLOCATOR_SETUP(); }
  // An allocator whose expandable segments' handles export (unless told), and its exporter.
  void Make(bool expandable, bool shareable = true) {
    exporter_.reset();
    Config config;
    config.expandable_segments = expandable;
    config.shareable_handles = shareable;
    MakeAllocator(config);
    ASSERT_NE(allocator_, nullptr);
    absl::StatusOr<std::unique_ptr<BlockExporter>> exporter = BlockExporter::Create(*allocator_);
    ASSERT_TRUE(exporter.ok()) << exporter.status();
    exporter_ = std::move(*exporter);
  }
  void TearDown() override {
    exporter_.reset();  // its holds go before the fixture checks that nothing is left
    AllocatorFixture::TearDown();
  }
  void Fill(DevicePtr p, std::size_t bytes, int seed) {
    const std::vector<std::uint8_t> v = IpcPattern(bytes, seed);
    ASSERT_OK(driver_->CopyHostToDevice(p, v.data(), v.size()));
  }
  bool Holds(DevicePtr p, std::size_t bytes, int seed) {
    std::vector<std::uint8_t> v(bytes);
    if (!driver_->CopyDeviceToHost(v.data(), p, bytes).ok()) return false;
    return v == IpcPattern(bytes, seed);
  }
  std::int64_t Allocated() { return Stats().allocated_bytes.all().current; }
  std::int64_t Reserved() { return Stats().reserved_bytes.all().current; }
  // Runs ipc_peer in `mode` on `token` to its end; its exit code.
  int RunPeer(const std::string& mode, const ExportToken& token, const std::vector<std::string>& rest) {
    std::vector<std::string> args = {mode, token.ToString()};
    args.insert(args.end(), rest.begin(), rest.end());
    Peer peer(args);
    EXPECT_TRUE(peer.started());
    return peer.Wait();
  }

  std::unique_ptr<BlockExporter> exporter_;
};

TEST_F(BlockSharingTest, ExpandableBlockOverSeveralChunksIsSharedBothWays) {
  Make(/*expandable=*/true);
  // Three growths map three chunks; freed, they merge into one block the next request takes whole.
  const std::size_t gran = driver_->Info().granularity;
  std::vector<DevicePtr> parts;
  for (int i = 0; i < 3; ++i) parts.push_back(Alloc(2 * gran));
  for (DevicePtr p : parts) ASSERT_OK(allocator_->Free(p));
  ExpectInvariants();
  const DevicePtr p = Alloc(6 * gran);
  ASSERT_EQ(p, parts[0]);
  ASSERT_OK_AND_ASSIGN(const HeldBlock held, allocator_->HoldBlock(p));
  EXPECT_EQ(held.chunks.size(), 3u);
  ASSERT_OK(allocator_->ReleaseHold(p));
  Fill(p, 6 * gran, 1);
  ASSERT_OK_AND_ASSIGN(const ExportToken token, exporter_->Export(p));
  ExpectInvariants();
  EXPECT_EQ(token.kind, ipc::SegmentKind::kExpandable);
  EXPECT_LE(token.ToString().size(), ExportToken::kMaxLength);
  EXPECT_EQ(RunPeer("check", token, {"1", "2"}), 0);
  ASSERT_OK(exporter_->WaitForConnections(0, kWait));
  EXPECT_TRUE(Holds(p, 6 * gran, 2));
  ASSERT_OK(exporter_->Revoke(p));
  ASSERT_OK(allocator_->Free(p));
  ExpectInvariants();
  EXPECT_EQ(Allocated(), 0);
}

TEST_F(BlockSharingTest, RegularSegmentBlockIsSharedAtItsOffset) {
  Make(/*expandable=*/false);
  const DevicePtr first = Alloc(512 * 1024);
  const DevicePtr p = Alloc(512 * 1024);
  ASSERT_EQ(p, first + 512 * 1024);  // the second block of the same segment
  Fill(p, 512 * 1024, 7);
  ASSERT_OK_AND_ASSIGN(const ExportToken token, exporter_->Export(p));
  EXPECT_EQ(token.kind, ipc::SegmentKind::kRegular);
  EXPECT_EQ(RunPeer("check", token, {"7", "8"}), 0);
  ASSERT_OK(exporter_->WaitForConnections(0, kWait));
  EXPECT_TRUE(Holds(p, 512 * 1024, 8));
  ASSERT_OK(exporter_->Revoke(p));
  ASSERT_OK(allocator_->Free(p));
  ASSERT_OK(allocator_->Free(first));
  ExpectInvariants();
}

TEST_F(BlockSharingTest, OwnerFreeingWhileTheImporterHoldsReusesNothingUntilItCloses) {
  Make(/*expandable=*/true);
  const std::size_t size = 4 * kMiB;
  const DevicePtr p = Alloc(size);
  Fill(p, size, 3);
  ASSERT_OK_AND_ASSIGN(const ExportToken token, exporter_->Export(p));
  Peer peer({"hold", token.ToString(), "3", "4"});
  ASSERT_TRUE(peer.started());
  ASSERT_EQ(peer.ReadLine(), "ready");
  ASSERT_OK(exporter_->WaitForConnections(1, kWait));
  ASSERT_OK(exporter_->Revoke(p));
  ASSERT_OK(allocator_->Free(p));
  ExpectInvariants();
  // Freed, yet still allocated while the importer maps it: not handed out again.
  EXPECT_EQ(Allocated(), static_cast<std::int64_t>(size));
  const DevicePtr other = Alloc(size);
  EXPECT_NE(other, p);
  EXPECT_TRUE(Holds(p, size, 4));  // the importer's bytes, untouched
  peer.CloseStdin();
  EXPECT_EQ(peer.Wait(), 0);
  ASSERT_OK(exporter_->WaitForConnections(0, kWait));
  ExpectInvariants();
  EXPECT_EQ(Allocated(), static_cast<std::int64_t>(size));  // `other` alone
  EXPECT_EQ(Alloc(size), p);                                // free now, and reused
  ASSERT_OK(allocator_->Free(p));
  ASSERT_OK(allocator_->Free(other));
  ExpectInvariants();
}

TEST_F(BlockSharingTest, ImporterKilledWhileHoldingReleasesItsHold) {
  Make(/*expandable=*/true);
  const std::size_t size = 4 * kMiB;
  const DevicePtr p = Alloc(size);
  Fill(p, size, 5);
  ASSERT_OK_AND_ASSIGN(const ExportToken token, exporter_->Export(p));
  ASSERT_OK(exporter_->Revoke(p));
  ASSERT_OK_AND_ASSIGN(const ExportToken again, exporter_->Export(p));
  Peer peer({"hold", again.ToString(), "5", "6"});
  ASSERT_TRUE(peer.started());
  ASSERT_EQ(peer.ReadLine(), "ready");
  ASSERT_OK(exporter_->Revoke(p));
  ASSERT_OK(allocator_->Free(p));
  EXPECT_EQ(allocator_->HoldCount(p), 1);
  peer.Kill();
  EXPECT_EQ(peer.Wait(), 128 + SIGKILL);
  ASSERT_OK(exporter_->WaitForConnections(0, kWait));
  ExpectInvariants();
  EXPECT_EQ(allocator_->HoldCount(p), 0);
  EXPECT_EQ(Allocated(), 0);
  ASSERT_OK(allocator_->EmptyCache());
  ExpectInvariants();
  EXPECT_EQ(Reserved(), 0);
  (void)token;
}

TEST_F(BlockSharingTest, BlockOfAPoolWhoseHandlesDoNotExportIsRefused) {
  Make(/*expandable=*/true, /*shareable=*/false);
  const DevicePtr p = Alloc(2 * kMiB);
  const absl::StatusOr<ExportToken> token = exporter_->Export(p);
  EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(token.status().message(), HasSubstr("shareable_handles:True"));
  EXPECT_THAT(token.status().message(), HasSubstr("PoolOptions::shareable"));
  EXPECT_EQ(allocator_->HoldCount(p), 0);
  ASSERT_OK(allocator_->Free(p));
  ExpectInvariants();
}

TEST_F(BlockSharingTest, BadTokensAndRevokedBlocksAreRefusedWithTheReason) {
  Make(/*expandable=*/true);
  EXPECT_THAT(ExportToken::Parse("graphalloc-ipc:1:x:12").status().message(), HasSubstr("8 fields"));
  EXPECT_THAT(ExportToken::Parse("cuda-ipc:1:s:1:1:10:4096:e").status().message(), HasSubstr("prefix"));
  EXPECT_THAT(ExportToken::Parse("graphalloc-ipc:1:s:1:1:10:4096:x").status().message(),
              HasSubstr("segment kind"));
  const DevicePtr p = Alloc(2 * kMiB);
  ASSERT_OK_AND_ASSIGN(const ExportToken token, exporter_->Export(p));
  ASSERT_OK_AND_ASSIGN(const ExportToken parsed, ExportToken::Parse(token.ToString()));
  EXPECT_EQ(parsed, token);
  Peer garbage({"fail", "garbage", "not a graphalloc export token"});
  ASSERT_TRUE(garbage.started());
  EXPECT_EQ(garbage.Wait(), 0);
  ASSERT_OK(exporter_->Revoke(p));
  EXPECT_EQ(RunPeer("fail", token, {"is not exported"}), 0);
  ExportToken forged = token;
  forged.block_id += 100;
  EXPECT_EQ(RunPeer("fail", forged, {absl::StrCat("pid ", getpid())}), 0);
  ASSERT_OK(allocator_->Free(p));
  ExpectInvariants();
}

TEST_F(BlockSharingTest, ImportAfterTheExporterIsGoneSaysSo) {
  Make(/*expandable=*/true);
  const DevicePtr p = Alloc(2 * kMiB);
  ASSERT_OK_AND_ASSIGN(const ExportToken token, exporter_->Export(p));
  exporter_.reset();  // releases the export's hold
  ExpectInvariants();
  EXPECT_EQ(allocator_->HoldCount(p), 0);
  EXPECT_EQ(RunPeer("fail", token, {"the exporter is gone"}), 0);
  ASSERT_OK(allocator_->Free(p));
  ExpectInvariants();
}

}  // namespace
}  // namespace graphalloc

// BlockExporter: exports, the server thread and the holds of importing connections.
#include "graphalloc/allocator/ipc/block_exporter.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/ipc/ipc_protocol.h"

namespace graphalloc::ipc {
namespace {

// How long an importer may take to send its request once connected.
constexpr absl::Duration kRequestTimeout = absl::Seconds(10);

std::atomic<std::uint64_t> next_socket{0};

ImportReply Refusal(absl::StatusCode code, absl::string_view why) {
  ImportReply reply;
  reply.code = static_cast<std::int32_t>(code);
  const std::size_t n = std::min(why.size(), reply.message.size() - 1);
  std::memcpy(reply.message.data(), why.data(), n);
  return reply;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BlockExporter>> BlockExporter::Create(CachingAllocator& allocator) {
  const std::string name = absl::StrCat("graphalloc-ipc-", getpid(), "-", next_socket.fetch_add(1));
  absl::StatusOr<FdListener> listener = FdListener::Listen(name);
  if (!listener.ok()) return listener.status();
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) return absl::InternalError(absl::StrCat("BlockExporter: eventfd: ", std::strerror(errno)));
  return std::unique_ptr<BlockExporter>(new BlockExporter(allocator, *std::move(listener), wake));
}

BlockExporter::BlockExporter(CachingAllocator& allocator, FdListener listener, int wake_fd)
    : allocator_(allocator),
      listener_(std::move(listener)),
      socket_name_(listener_.name()),
      wake_fd_(wake_fd) {
  server_ = std::thread([this] { Serve(); });
}

BlockExporter::~BlockExporter() {
  const std::uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  server_.join();  // the server thread releases its connections' holds on the way out
  close(wake_fd_);
  std::map<DevicePtr, Exported> exports;
  {
    std::lock_guard<std::mutex> lock(mu_);
    exports.swap(exports_);
  }
  for (const auto& [ptr, e] : exports) (void)allocator_.ReleaseHold(ptr);
}

absl::StatusOr<ExportToken> BlockExporter::Export(DevicePtr ptr) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = exports_.find(ptr);
  if (it == exports_.end()) {
    lock.unlock();
    absl::StatusOr<HeldBlock> held = allocator_.HoldBlock(ptr);
    if (!held.ok()) return held.status();
    if (held->ptr != ptr) {
      (void)allocator_.ReleaseHold(ptr);
      return absl::InvalidArgumentError(absl::StrFormat("Export(0x%x): not the start of a block", ptr));
    }
    if (held->expandable && !held->shareable) {
      (void)allocator_.ReleaseHold(ptr);
      return absl::FailedPreconditionError(absl::StrFormat(
          "Export(0x%x): the block lies in an expandable segment whose physical memory was not created "
          "exportable; set GRAPHALLOC_CONF=shareable_handles:True (every pool) or PoolOptions::shareable "
          "(its pool) before allocating it",
          ptr));
    }
    lock.lock();
    auto [inserted, fresh] = exports_.try_emplace(ptr, Exported{next_id_, *std::move(held)});
    if (fresh) {
      ++next_id_;
    } else {
      (void)allocator_.ReleaseHold(ptr);  // another thread exported it meanwhile
    }
    it = inserted;
  }
  const Exported& e = it->second;
  ExportToken token{.socket = socket_name_,
                    .pid = getpid(),
                    .block_id = e.id,
                    .ptr = e.block.ptr,
                    .size = e.block.size,
                    .kind = e.block.expandable ? SegmentKind::kExpandable : SegmentKind::kRegular};
  return token;
}

absl::Status BlockExporter::Revoke(DevicePtr ptr) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (exports_.erase(ptr) == 0) {
      return absl::NotFoundError(absl::StrFormat("Revoke(0x%x): no block exported at this address", ptr));
    }
  }
  return allocator_.ReleaseHold(ptr);
}

std::size_t BlockExporter::connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connections_;
}

absl::Status BlockExporter::WaitForConnections(std::size_t n, absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (!changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return connections_ == n; })) {
    return absl::DeadlineExceededError(absl::StrCat("BlockExporter on @", socket_name_, ": ", connections_,
                                                    " importers connected after ",
                                                    absl::FormatDuration(timeout), ", waiting for ", n));
  }
  return absl::OkStatus();
}

void BlockExporter::Serve() {
  std::vector<Connection> connections;
  auto publish = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    connections_ = connections.size();
    changed_.notify_all();
  };
  for (;;) {
    std::vector<pollfd> fds;
    fds.push_back({.fd = wake_fd_, .events = POLLIN, .revents = 0});
    fds.push_back({.fd = listener_.fd(), .events = POLLIN, .revents = 0});
    for (const Connection& c : connections)
      fds.push_back({.fd = c.channel.fd(), .events = POLLIN, .revents = 0});
    if (poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
    if (fds[0].revents != 0) break;
    // An importer's end: any readable event on a held connection is its close (it sends nothing more).
    for (std::size_t i = fds.size(); i-- > 2;) {
      if (fds[i].revents == 0) continue;
      Connection& c = connections[i - 2];
      (void)allocator_.ReleaseHold(c.ptr);
      connections.erase(connections.begin() + static_cast<std::ptrdiff_t>(i - 2));
    }
    if ((fds[1].revents & POLLIN) != 0) {
      absl::StatusOr<FdChannel> accepted = listener_.Accept();
      if (accepted.ok()) {
        Connection c{*std::move(accepted), 0};
        if (Answer(c)) connections.push_back(std::move(c));
      }
    }
    publish();
  }
  for (const Connection& c : connections) (void)allocator_.ReleaseHold(c.ptr);
  connections.clear();
  publish();
}

bool BlockExporter::Answer(Connection& connection) {
  const pid_t pid = connection.channel.PeerPid();
  connection.channel.set_peer(absl::StrCat("importer pid ", pid, " on @", socket_name_));
  std::string payload;
  std::vector<int> fds;
  if (!connection.channel.Receive(&payload, &fds, kRequestTimeout).ok()) return false;
  for (int fd : fds) close(fd);
  ImportRequest request;
  if (!Decode(payload, &request) || request.magic != ImportRequest{}.magic ||
      request.version != kProtocolVersion) {
    (void)connection.channel.Send(Encode(Refusal(absl::StatusCode::kInvalidArgument,
                                                 "refused: not a graphalloc import request of "
                                                 "protocol version 1")));
    return false;
  }
  if (connection.channel.PeerUid() != getuid()) {
    (void)connection.channel.Send(
        Encode(Refusal(absl::StatusCode::kPermissionDenied,
                       "refused: the importer runs as another user than the exporter")));
    return false;
  }
  // The connection's own hold, taken under mu_ while the export's hold still stands: a Revoke() (which
  // drops the export's hold only after erasing it under mu_) and a Free() cannot slip in between, so the
  // address cannot have become another allocation's.
  Exported exported;
  absl::Status held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(exports_.begin(), exports_.end(),
                           [&](const auto& e) { return e.second.id == request.block_id; });
    if (it != exports_.end()) {
      exported = it->second;
      held = allocator_.HoldBlock(exported.block.ptr).status();
    }
  }
  if (exported.id == 0) {
    (void)connection.channel.Send(Encode(
        Refusal(absl::StatusCode::kNotFound,
                absl::StrCat("block id ", request.block_id, " is not exported (never, or revoked since)"))));
    return false;
  }
  if (!held.ok()) {
    (void)connection.channel.Send(Encode(Refusal(held.code(), held.message())));
    return false;
  }
  connection.ptr = exported.block.ptr;
  if (absl::Status s = SendBlock(connection, exported); !s.ok()) {
    (void)connection.channel.Send(Encode(Refusal(s.code(), s.message())));
    (void)allocator_.ReleaseHold(connection.ptr);
    return false;
  }
  return true;
}

absl::Status BlockExporter::SendBlock(Connection& connection, const Exported& exported) {
  Driver& driver = allocator_.driver();
  const HeldBlock& b = exported.block;
  ImportReply reply;
  reply.block_ptr = b.ptr;
  reply.block_size = b.size;
  if (!b.expandable) {
    absl::StatusOr<Driver::IpcMemHandle> handle = driver.IpcGetMemHandle(b.segment_base);
    if (!handle.ok()) return handle.status();
    reply.block_offset = b.ptr - b.segment_base;
    std::memcpy(reply.ipc_handle.data(), handle->bytes.data(), reply.ipc_handle.size());
    std::vector<int> fds;
    if (handle->fd >= 0) fds.push_back(handle->fd);
    absl::Status s = connection.channel.Send(Encode(reply), fds);
    if (handle->fd >= 0) close(handle->fd);
    return s;
  }
  reply.expandable = 1;
  reply.chunk_count = static_cast<std::uint32_t>(b.chunks.size());
  // Every descriptor first, so that a failure sends nothing but the refusal.
  std::vector<ChunkEntry> entries;
  std::vector<int> fds;
  absl::Status error;
  for (const ChunkPlacement& c : b.chunks) {
    absl::StatusOr<Driver::ShareableHandle> shared = driver.MemExportToShareableHandle(c.handle);
    if (!shared.ok()) {
      error = shared.status();
      break;
    }
    fds.push_back(shared->fd);
    entries.push_back({.offset = static_cast<std::int64_t>(c.ptr) - static_cast<std::int64_t>(b.ptr),
                       .size = c.size,
                       .fd_offset = shared->offset});
  }
  if (error.ok()) error = connection.channel.Send(Encode(reply));
  for (std::size_t first = 0; error.ok() && first < entries.size(); first += kMaxFdsPerFrame) {
    const std::size_t n = std::min(kMaxFdsPerFrame, entries.size() - first);
    std::string batch(reinterpret_cast<const char*>(entries.data() + first), n * sizeof(ChunkEntry));
    error = connection.channel.Send(batch, std::span<const int>(fds.data() + first, n));
  }
  for (int fd : fds) close(fd);
  return error;
}

}  // namespace graphalloc::ipc

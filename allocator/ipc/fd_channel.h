// A Unix-domain stream socket in the abstract namespace that carries framed messages, each with file
// descriptors attached (SCM_RIGHTS): how BlockExporter hands physical memory to another process.
//
// A frame is a header (payload length, descriptor count) and the payload; the descriptors travel with the
// header's first byte. Every call retries on EINTR, waits at most its timeout, and names its peer in its
// errors ("exporter pid 1234 on @graphalloc-ipc-1234-1"). Received descriptors belong to the caller.
#ifndef GRAPHALLOC_ALLOCATOR_IPC_FD_CHANNEL_H_
#define GRAPHALLOC_ALLOCATOR_IPC_FD_CHANNEL_H_

#include <sys/types.h>

#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace graphalloc::ipc {

// At most this many descriptors per frame (the kernel's SCM_MAX_FD is 253).
inline constexpr std::size_t kMaxFdsPerFrame = 200;
// At most this many payload bytes per frame.
inline constexpr std::size_t kMaxFramePayload = std::size_t{1} << 20;

// One connected end. Move-only; the destructor closes it.
class FdChannel {
 public:
  // Connects to the listener named `name` (abstract namespace, without the leading NUL). `peer` names the
  // other side in errors.
  static absl::StatusOr<FdChannel> Connect(absl::string_view name, std::string peer);

  FdChannel() = default;
  FdChannel(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  FdChannel(FdChannel&& other) noexcept;
  FdChannel& operator=(FdChannel&& other) noexcept;
  FdChannel(const FdChannel&) = delete;
  FdChannel& operator=(const FdChannel&) = delete;
  ~FdChannel() { Close(); }

  // Sends one frame: `payload` with `fds` attached (the caller keeps owning them).
  absl::Status Send(absl::string_view payload, std::span<const int> fds = {});
  // Receives one frame. Unavailable when the peer closed the connection (or died) before a whole frame.
  absl::Status Receive(std::string* payload, std::vector<int>* fds, absl::Duration timeout);

  // The peer's process id and user id (SO_PEERCRED); -1 when unknown.
  pid_t PeerPid() const;
  uid_t PeerUid() const;

  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  bool is_open() const { return fd_ >= 0; }
  void Close();
  // Says this end is done (shuts down its writing side), waits up to `timeout` for the peer to close its
  // end too, and closes: when it returns OK, the peer has seen the end and acted on it.
  absl::Status Finish(absl::Duration timeout);

 private:
  int fd_ = -1;
  std::string peer_;
};

// A listening socket. Move-only; the destructor closes it (the abstract name goes with it).
class FdListener {
 public:
  static absl::StatusOr<FdListener> Listen(std::string name);

  FdListener() = default;
  FdListener(FdListener&& other) noexcept;
  FdListener& operator=(FdListener&& other) noexcept;
  FdListener(const FdListener&) = delete;
  FdListener& operator=(const FdListener&) = delete;
  ~FdListener() { Close(); }

  // The next connection; call when fd() is readable (it does not block then).
  absl::StatusOr<FdChannel> Accept();
  int fd() const { return fd_; }
  const std::string& name() const { return name_; }
  void Close();

 private:
  int fd_ = -1;
  std::string name_;
};

}  // namespace graphalloc::ipc

#endif  // GRAPHALLOC_ALLOCATOR_IPC_FD_CHANNEL_H_

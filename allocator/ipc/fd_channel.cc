// FdChannel and FdListener: framed messages with attached file descriptors over abstract Unix sockets.
#include "graphalloc/allocator/ipc/fd_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace graphalloc::ipc {
namespace {

struct FrameHeader {
  std::uint32_t payload_size;
  std::uint32_t fd_count;
};

absl::Status Errno(absl::string_view what, absl::string_view peer, int err) {
  return absl::UnavailableError(absl::StrCat(what, " (", peer, "): ", std::strerror(err)));
}

// The abstract address of `name`, and its length.
socklen_t Address(absl::string_view name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  // sun_path[0] stays NUL: the abstract namespace, which needs no file and goes with the last socket.
  const std::size_t n = std::min(name.size(), sizeof(addr->sun_path) - 1);
  std::memcpy(addr->sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// Waits until `fd` is readable (or hung up); DeadlineExceeded after `timeout`.
absl::Status WaitReadable(int fd, absl::Duration timeout, absl::string_view peer) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    const int ms =
        left <= absl::ZeroDuration()
            ? 0
            : static_cast<int>(std::min<std::int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    const int r = poll(&p, 1, ms);
    if (r > 0) return absl::OkStatus();
    if (r == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no answer from ", peer, " within ", absl::FormatDuration(timeout)));
    }
    if (errno != EINTR) return Errno("poll", peer, errno);
  }
}

void CloseAll(std::vector<int>* fds) {
  for (int fd : *fds) close(fd);
  fds->clear();
}

}  // namespace

absl::StatusOr<FdChannel> FdChannel::Connect(absl::string_view name, std::string peer) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket", peer, errno);
  FdChannel channel(fd, std::move(peer));
  sockaddr_un addr;
  const socklen_t len = Address(name, &addr);
  // A stream connect to a listening Unix socket completes at once (or fails: nobody listens).
  int r;
  do {
    r = connect(fd, reinterpret_cast<const sockaddr*>(&addr), len);
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    const int err = errno;
    if (err == ECONNREFUSED || err == ENOENT) {
      return absl::UnavailableError(absl::StrCat("cannot connect to ", channel.peer(),
                                                 ": nobody listens there (the exporter is gone)"));
    }
    return Errno("connect", channel.peer(), err);
  }
  return channel;
}

FdChannel::FdChannel(FdChannel&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), peer_(std::move(other.peer_)) {}

FdChannel& FdChannel::operator=(FdChannel&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    peer_ = std::move(other.peer_);
  }
  return *this;
}

void FdChannel::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status FdChannel::Finish(absl::Duration timeout) {
  if (fd_ < 0) return absl::OkStatus();
  absl::Status s;
  if (shutdown(fd_, SHUT_WR) == 0) {
    // Whatever the peer still sends is dropped; its end shows as a read of 0 bytes (or a reset).
    const absl::Time deadline = absl::Now() + timeout;
    char sink[256];
    for (;;) {
      s = WaitReadable(fd_, deadline - absl::Now(), peer_);
      if (!s.ok()) break;
      const ssize_t n = recv(fd_, sink, sizeof(sink), 0);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      break;
    }
  }
  Close();
  return s;
}

absl::Status FdChannel::Send(absl::string_view payload, std::span<const int> fds) {
  if (fd_ < 0)
    return absl::FailedPreconditionError(absl::StrCat("send to ", peer_, ": the channel is closed"));
  if (fds.size() > kMaxFdsPerFrame || payload.size() > kMaxFramePayload) {
    return absl::InvalidArgumentError(absl::StrCat("send to ", peer_, ": frame of ", payload.size(),
                                                   " bytes and ", fds.size(), " descriptors is too large"));
  }
  std::string frame(sizeof(FrameHeader) + payload.size(), '\0');
  const FrameHeader header{static_cast<std::uint32_t>(payload.size()),
                           static_cast<std::uint32_t>(fds.size())};
  std::memcpy(frame.data(), &header, sizeof(header));
  if (!payload.empty()) std::memcpy(frame.data() + sizeof(header), payload.data(), payload.size());
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame), 0);
  std::size_t sent = 0;
  while (sent < frame.size()) {
    iovec iov{.iov_base = frame.data() + sent, .iov_len = frame.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (sent == 0 && !fds.empty()) {
      // The descriptors ride on the frame's first byte.
      msg.msg_control = control.data();
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) {
        return absl::UnavailableError(absl::StrCat("send to ", peer_, ": the peer closed the connection"));
      }
      return Errno("sendmsg", peer_, errno);
    }
    sent += static_cast<std::size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FdChannel::Receive(std::string* payload, std::vector<int>* fds, absl::Duration timeout) {
  fds->clear();
  payload->clear();
  if (fd_ < 0)
    return absl::FailedPreconditionError(absl::StrCat("receive from ", peer_, ": the channel is closed"));
  const absl::Time deadline = absl::Now() + timeout;
  FrameHeader header{};
  std::size_t got = 0;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame), 0);
  // Reads [got, want) of `into`; descriptors found on the way are collected.
  auto read_into = [&](char* into, std::size_t want) -> absl::Status {
    while (got < want) {
      if (absl::Status s = WaitReadable(fd_, deadline - absl::Now(), peer_); !s.ok()) return s;
      iovec iov{.iov_base = into + got, .iov_len = want - got};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      const ssize_t n = recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        if (errno == ECONNRESET) {
          return absl::UnavailableError(absl::StrCat(peer_, " closed the connection"));
        }
        return Errno("recvmsg", peer_, errno);
      }
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* data = reinterpret_cast<const int*>(CMSG_DATA(c));
        fds->insert(fds->end(), data, data + count);
      }
      if ((msg.msg_flags & MSG_CTRUNC) != 0) {
        return absl::DataLossError(absl::StrCat("receive from ", peer_, ": descriptors were truncated"));
      }
      if (n == 0) {
        return absl::UnavailableError(absl::StrCat(peer_, " closed the connection"));
      }
      got += static_cast<std::size_t>(n);
    }
    return absl::OkStatus();
  };
  absl::Status s = read_into(reinterpret_cast<char*>(&header), sizeof(header));
  if (s.ok() && (header.payload_size > kMaxFramePayload || header.fd_count > kMaxFdsPerFrame)) {
    s = absl::DataLossError(absl::StrCat("receive from ", peer_, ": a malformed frame header"));
  }
  if (s.ok()) {
    payload->assign(header.payload_size, '\0');
    got = 0;
    s = read_into(payload->data(), header.payload_size);
  }
  if (s.ok() && fds->size() != header.fd_count) {
    s = absl::DataLossError(absl::StrCat("receive from ", peer_, ": expected ", header.fd_count,
                                         " descriptors, got ", fds->size()));
  }
  if (!s.ok()) CloseAll(fds);
  return s;
}

pid_t FdChannel::PeerPid() const {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (fd_ < 0 || getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
  return cred.pid;
}

uid_t FdChannel::PeerUid() const {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (fd_ < 0 || getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return static_cast<uid_t>(-1);
  return cred.uid;
}

absl::StatusOr<FdListener> FdListener::Listen(std::string name) {
  FdListener listener;
  listener.name_ = std::move(name);
  const std::string where = absl::StrCat("listener @", listener.name_);
  listener.fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listener.fd_ < 0) return Errno("socket", where, errno);
  sockaddr_un addr;
  const socklen_t len = Address(listener.name_, &addr);
  if (bind(listener.fd_, reinterpret_cast<const sockaddr*>(&addr), len) != 0)
    return Errno("bind", where, errno);
  if (listen(listener.fd_, 64) != 0) return Errno("listen", where, errno);
  return listener;
}

FdListener::FdListener(FdListener&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), name_(std::move(other.name_)) {}

FdListener& FdListener::operator=(FdListener&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    name_ = std::move(other.name_);
  }
  return *this;
}

void FdListener::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::StatusOr<FdChannel> FdListener::Accept() {
  for (;;) {
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return FdChannel(fd, "an importer");
    if (errno == EINTR) continue;
    return Errno("accept", absl::StrCat("listener @", name_), errno);
  }
}

}  // namespace graphalloc::ipc

// ImportBlock and ImportedBlock: the importing side of ipc_protocol.h.
#include "graphalloc/allocator/ipc/block_importer.h"

#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/ipc/ipc_protocol.h"

namespace graphalloc::ipc {
namespace {

absl::Status Failed(const ExportToken& token, const absl::Status& why) {
  return absl::Status(why.code(), absl::StrCat("import of ", token.Describe(), ": ", why.message()));
}

void CloseAll(const std::vector<int>& fds) {
  for (int fd : fds) close(fd);
}

}  // namespace

ImportedBlock::ImportedBlock(ImportedBlock&& other) noexcept { *this = std::move(other); }

ImportedBlock& ImportedBlock::operator=(ImportedBlock&& other) noexcept {
  if (this != &other) {
    (void)Close();
    driver_ = std::exchange(other.driver_, nullptr);
    token_ = std::move(other.token_);
    channel_ = std::move(other.channel_);
    ptr_ = std::exchange(other.ptr_, 0);
    size_ = std::exchange(other.size_, 0);
    reservation_ = std::exchange(other.reservation_, 0);
    reservation_size_ = std::exchange(other.reservation_size_, 0);
    mapped_size_ = std::exchange(other.mapped_size_, 0);
    handles_ = std::move(other.handles_);
    other.handles_.clear();
    ipc_base_ = std::exchange(other.ipc_base_, 0);
  }
  return *this;
}

absl::Status ImportedBlock::Close() {
  if (driver_ == nullptr) return absl::OkStatus();
  absl::Status first;
  auto keep = [&first](absl::Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
  };
  if (mapped_size_ > 0) keep(driver_->MemUnmap(reservation_, mapped_size_));
  for (PhysicalHandle h : handles_) keep(driver_->MemRelease(h));
  if (reservation_size_ > 0) keep(driver_->AddressFree(reservation_, reservation_size_));
  if (ipc_base_ != 0) keep(driver_->IpcCloseMemHandle(ipc_base_));
  // Last, once nothing here maps the memory: the exporter releases its hold when it sees the end, and
  // closes its side; waiting for that makes the release done when Close() returns.
  if (absl::Status s = channel_.Finish(absl::Seconds(10)); !s.ok() && first.ok()) {
    first = absl::Status(s.code(), absl::StrCat("the exporter did not acknowledge the close: ", s.message()));
  }
  handles_.clear();
  mapped_size_ = reservation_size_ = 0;
  reservation_ = ipc_base_ = ptr_ = 0;
  driver_ = nullptr;
  if (!first.ok()) return Failed(token_, first);
  return absl::OkStatus();
}

absl::StatusOr<ImportedBlock> ImportBlock(Driver& driver, const ExportToken& token, absl::Duration timeout,
                                          std::span<const int> peers) {
  ImportedBlock block;
  block.token_ = token;
  absl::StatusOr<FdChannel> channel =
      FdChannel::Connect(token.socket, absl::StrCat("exporter pid ", token.pid, " on @", token.socket));
  if (!channel.ok()) return Failed(token, channel.status());
  block.channel_ = *std::move(channel);
  block.driver_ = &driver;  // from here on, Close() undoes what was done
  ImportRequest request;
  request.block_id = token.block_id;
  if (absl::Status s = block.channel_.Send(Encode(request)); !s.ok()) return Failed(token, s);
  std::string payload;
  std::vector<int> fds;
  if (absl::Status s = block.channel_.Receive(&payload, &fds, timeout); !s.ok()) return Failed(token, s);
  ImportReply reply;
  if (!Decode(payload, &reply) || reply.magic != ImportReply{}.magic) {
    CloseAll(fds);
    return Failed(token, absl::DataLossError("the exporter's reply is not a graphalloc import reply"));
  }
  if (reply.code != 0) {
    CloseAll(fds);
    reply.message.back() = '\0';
    return Failed(token, absl::Status(static_cast<absl::StatusCode>(reply.code),
                                      absl::StrCat("the exporter refused: ", reply.message.data())));
  }
  if (reply.block_ptr != token.ptr || reply.block_size != token.size ||
      (reply.expandable != 0) != (token.kind == SegmentKind::kExpandable)) {
    CloseAll(fds);
    return Failed(token, absl::DataLossError("the exporter answered with another block than the token's"));
  }
  block.size_ = reply.block_size;
  if (reply.expandable == 0) {
    Driver::IpcMemHandle handle;
    std::memcpy(handle.bytes.data(), reply.ipc_handle.data(), handle.bytes.size());
    handle.fd = fds.empty() ? -1 : fds[0];
    absl::StatusOr<DevicePtr> base = driver.IpcOpenMemHandle(handle);
    CloseAll(fds);
    if (!base.ok()) return Failed(token, base.status());
    block.ipc_base_ = *base;
    block.ptr_ = *base + reply.block_offset;
    return block;
  }
  // Every chunk's descriptor and placement, in batches.
  std::vector<ChunkEntry> entries;
  std::vector<int> chunk_fds;
  while (entries.size() < reply.chunk_count) {
    std::string batch;
    std::vector<int> batch_fds;
    absl::Status s = block.channel_.Receive(&batch, &batch_fds, timeout);
    if (s.ok() &&
        (batch.size() % sizeof(ChunkEntry) != 0 || batch.size() / sizeof(ChunkEntry) != batch_fds.size())) {
      s = absl::DataLossError("a malformed chunk batch");
    }
    chunk_fds.insert(chunk_fds.end(), batch_fds.begin(), batch_fds.end());
    if (!s.ok()) {
      CloseAll(chunk_fds);
      return Failed(token, s);
    }
    const std::size_t n = batch.size() / sizeof(ChunkEntry);
    const std::size_t at = entries.size();
    entries.resize(at + n);
    std::memcpy(entries.data() + at, batch.data(), batch.size());
  }
  if (entries.empty() || entries.size() != reply.chunk_count) {
    CloseAll(chunk_fds);
    return Failed(token, absl::DataLossError("the exporter sent no chunks"));
  }
  // The chunks tile [first chunk, last chunk end) contiguously (they cover an allocated block).
  const std::int64_t first = entries.front().offset;
  std::int64_t end = first;
  for (const ChunkEntry& e : entries) {
    if (e.offset != end) {
      CloseAll(chunk_fds);
      return Failed(token, absl::DataLossError("the exporter's chunks are not contiguous"));
    }
    end += static_cast<std::int64_t>(e.size);
  }
  const std::size_t span = static_cast<std::size_t>(end - first);
  absl::Status error;
  absl::StatusOr<DevicePtr> reserved = driver.AddressReserve(span, 0);
  if (reserved.ok()) {
    block.reservation_ = *reserved;
    block.reservation_size_ = span;
  } else {
    error = reserved.status();
  }
  for (std::size_t i = 0; error.ok() && i < entries.size(); ++i) {
    const Driver::ShareableHandle shared{
        .fd = chunk_fds[i], .offset = entries[i].fd_offset, .size = entries[i].size};
    absl::StatusOr<PhysicalHandle> h = driver.MemImportFromShareableHandle(shared);
    if (!h.ok()) {
      error = h.status();
      break;
    }
    block.handles_.push_back(*h);
    const DevicePtr at = block.reservation_ + static_cast<std::size_t>(entries[i].offset - first);
    error = driver.MemMap(at, entries[i].size, *h);
    if (error.ok()) block.mapped_size_ += entries[i].size;
  }
  CloseAll(chunk_fds);  // the imported handles hold the memory now
  if (error.ok()) error = driver.MemSetAccess(block.reservation_, span, peers);
  if (!error.ok()) {
    // Close() unmaps what was mapped (the chunks were mapped in order, from the reservation's start).
    return Failed(token, error);
  }
  block.ptr_ = block.reservation_ + static_cast<std::size_t>(-first);
  return block;
}

}  // namespace graphalloc::ipc

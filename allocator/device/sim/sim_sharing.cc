// SimDriver's sharing of memory with other processes: shareable handles exported as file descriptors and
// imported, the handle under a mapped address, and plain allocations opened through IPC handles.
//
// A shareable handle has a memfd of its own, so its pages live while any process holds the file or a
// mapping of it (CUDA's rule: until every process released every handle and mapping). An exported plain
// allocation is the device memfd and the allocation's offset in it, as the IPC handle's bytes say.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "graphalloc/allocator/device/sim/sim_state.h"
#include "graphalloc/allocator/device/sim_driver.h"

namespace graphalloc {
namespace {

// What a simulated IPC handle's bytes hold.
constexpr char kIpcMagic[8] = {'g', 'a', '-', 's', 'i', 'm', 'i', 'p'};
struct SimIpcBytes {
  char magic[8];
  std::uint64_t offset;
  std::uint64_t size;
};
static_assert(sizeof(SimIpcBytes) <= sizeof(Driver::IpcMemHandle::bytes));

}  // namespace

absl::StatusOr<PhysicalHandle> SimDriver::MemCreateShareable(std::size_t size) {
  constexpr absl::string_view kName = "cuMemCreate";
  if (absl::Status st = state_->Begin(SimCall::kMemCreate, kName); !st.ok()) return st;
  State& s = *state_;
  if (size == 0 || size % s.options.granularity != 0) return DriverError(kName, DriverResult::kInvalidValue);
  MutexLock lock(&s.mu);
  if (size > s.options.capacity - s.used_bytes) return DriverError(kName, DriverResult::kOutOfMemory);
  const int fd = memfd_create("graphalloc-sim-shareable", MFD_CLOEXEC);
  if (fd < 0) return DriverError(kName, DriverResult::kOutOfMemory);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return DriverError(kName, DriverResult::kOutOfMemory);
  }
  s.used_bytes += size;
  const std::uint64_t id = s.next_id++;
  s.physical.emplace(id, SimPhysical{.size = size, .fd = fd, .shareable = true});
  ++s.live_handles;
  s.live_handle_bytes += size;
  return PhysicalHandle{id};
}

absl::StatusOr<Driver::ShareableHandle> SimDriver::MemExportToShareableHandle(PhysicalHandle handle) {
  constexpr absl::string_view kName = "cuMemExportToShareableHandle";
  if (absl::Status st = state_->Begin(SimCall::kMemExport, kName); !st.ok()) return st;
  State& s = *state_;
  MutexLock lock(&s.mu);
  auto it = s.physical.find(static_cast<std::uint64_t>(handle));
  // A handle not created with a POSIX file descriptor handle type does not export (as on CUDA).
  if (it == s.physical.end() || it->second.released || !it->second.shareable) {
    return DriverError(kName, DriverResult::kInvalidValue);
  }
  const int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return DriverError(kName, DriverResult::kOutOfMemory);
  return ShareableHandle{.fd = fd, .offset = it->second.offset, .size = it->second.size};
}

absl::StatusOr<PhysicalHandle> SimDriver::MemImportFromShareableHandle(const ShareableHandle& shared) {
  constexpr absl::string_view kName = "cuMemImportFromShareableHandle";
  if (absl::Status st = state_->Begin(SimCall::kMemImport, kName); !st.ok()) return st;
  State& s = *state_;
  struct stat st {};
  if (shared.fd < 0 || shared.size == 0 || shared.size % s.options.granularity != 0 ||
      shared.offset % s.options.granularity != 0 || fstat(shared.fd, &st) != 0 ||
      shared.offset + shared.size > static_cast<std::uint64_t>(st.st_size)) {
    return DriverError(kName, DriverResult::kInvalidValue);
  }
  const int fd = fcntl(shared.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return DriverError(kName, DriverResult::kOutOfMemory);
  MutexLock lock(&s.mu);
  const std::uint64_t id = s.next_id++;
  s.physical.emplace(
      id, SimPhysical{
              .offset = shared.offset, .size = shared.size, .fd = fd, .shareable = true, .imported = true});
  ++s.live_handles;
  s.live_handle_bytes += shared.size;
  return PhysicalHandle{id};
}

absl::StatusOr<PhysicalHandle> SimDriver::MemRetainAllocationHandle(DevicePtr ptr) {
  constexpr absl::string_view kName = "cuMemRetainAllocationHandle";
  if (absl::Status st = state_->Begin(SimCall::kMemRetain, kName); !st.ok()) return st;
  State& s = *state_;
  MutexLock lock(&s.mu);
  auto it = s.MappingAt(ptr);
  if (it == s.mappings.end()) return DriverError(kName, DriverResult::kInvalidValue);
  SimPhysical& phys = s.physical.at(it->second.phys_id);
  if (phys.released) {
    // The id was given back while mapped: retaining brings it back, as CUDA hands out a new reference.
    phys.released = false;
    phys.refs = 1;
    ++s.live_handles;
    s.live_handle_bytes += phys.size;
  } else {
    ++phys.refs;
  }
  return PhysicalHandle{it->second.phys_id};
}

absl::StatusOr<Driver::IpcMemHandle> SimDriver::IpcGetMemHandle(DevicePtr ptr) {
  constexpr absl::string_view kName = "cuIpcGetMemHandle";
  if (absl::Status st = state_->Begin(SimCall::kIpcGetMemHandle, kName); !st.ok()) return st;
  State& s = *state_;
  MutexLock lock(&s.mu);
  auto it = s.allocations.find(ptr);
  if (it == s.allocations.end()) return DriverError(kName, DriverResult::kInvalidValue);
  IpcMemHandle handle;
  SimIpcBytes bytes{};
  std::memcpy(bytes.magic, kIpcMagic, sizeof(kIpcMagic));
  bytes.offset = it->second.offset;
  bytes.size = it->second.size;
  std::memcpy(handle.bytes.data(), &bytes, sizeof(bytes));
  handle.fd = fcntl(s.memfd, F_DUPFD_CLOEXEC, 0);
  if (handle.fd < 0) return DriverError(kName, DriverResult::kOutOfMemory);
  return handle;
}

absl::StatusOr<DevicePtr> SimDriver::IpcOpenMemHandle(const IpcMemHandle& handle) {
  constexpr absl::string_view kName = "cuIpcOpenMemHandle";
  if (absl::Status st = state_->Begin(SimCall::kIpcOpenMemHandle, kName); !st.ok()) return st;
  SimIpcBytes bytes{};
  std::memcpy(&bytes, handle.bytes.data(), sizeof(bytes));
  if (handle.fd < 0 || std::memcmp(bytes.magic, kIpcMagic, sizeof(kIpcMagic)) != 0 || bytes.size == 0) {
    return DriverError(kName, DriverResult::kInvalidValue);
  }
  void* p = mmap(nullptr, bytes.size, PROT_READ | PROT_WRITE, MAP_SHARED, handle.fd,
                 static_cast<off_t>(bytes.offset));
  if (p == MAP_FAILED) return DriverError(kName, DriverResult::kInvalidValue);
  MutexLock lock(&state_->mu);
  state_->ipc_opened.emplace(reinterpret_cast<DevicePtr>(p), bytes.size);
  return reinterpret_cast<DevicePtr>(p);
}

absl::Status SimDriver::IpcCloseMemHandle(DevicePtr ptr) {
  constexpr absl::string_view kName = "cuIpcCloseMemHandle";
  if (absl::Status st = state_->Begin(SimCall::kIpcCloseMemHandle, kName); !st.ok()) return st;
  MutexLock lock(&state_->mu);
  auto it = state_->ipc_opened.find(ptr);
  if (it == state_->ipc_opened.end()) return DriverError(kName, DriverResult::kInvalidValue);
  munmap(reinterpret_cast<void*>(ptr), it->second);
  state_->ipc_opened.erase(it);
  return absl::OkStatus();
}

}  // namespace graphalloc

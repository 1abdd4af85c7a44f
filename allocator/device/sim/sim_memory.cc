// SimDriver's memory: address reservations, physical handles, mappings, plain allocations, copies and
// dma-buf exports (a memfd holding a copy of the range).
//
// Physical memory is one sparse memfd per driver; a handle is an (offset, size) range of it, so tens of
// thousands of handles cost no file descriptors. Mapping is mmap(MAP_FIXED|MAP_SHARED) of that range, so
// two mappings of one handle alias; mapped memory stays PROT_NONE until MemSetAccess (as on CUDA), and
// unmapping puts back an anonymous PROT_NONE reservation, so stale accesses fault. Capacity is enforced by
// byte accounting; pages are committed only when touched and punched out when their range is freed.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "graphalloc/allocator/device/sim/sim_state.h"
#include "graphalloc/allocator/device/sim_driver.h"

namespace graphalloc {
namespace {

constexpr int kReserveFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

void* AsPtr(DevicePtr p) { return reinterpret_cast<void*>(p); }

}  // namespace

bool SimOffsetSpace::Take(std::uint64_t size, std::uint64_t* offset) {
  if (auto it = free_by_size_.find(size); it != free_by_size_.end()) {
    *offset = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) free_by_size_.erase(it);
    return true;
  }
  if (limit_ - bump_ >= size) {
    *offset = bump_;
    bump_ += size;
    return true;
  }
  auto it = free_by_size_.lower_bound(size);
  if (it == free_by_size_.end()) return false;
  const std::uint64_t big = it->first;
  *offset = it->second.back();
  it->second.pop_back();
  if (it->second.empty()) free_by_size_.erase(it);
  Give(*offset + size, big - size);
  return true;
}

void SimOffsetSpace::Give(std::uint64_t offset, std::uint64_t size) {
  if (size != 0) free_by_size_[size].push_back(offset);
}

namespace {

// Takes `size` physical bytes against capacity; false when the device is full.
bool TakePhysical(SimState& s, std::size_t size, std::uint64_t* offset) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (size > s.options.capacity - s.used_bytes) return false;
  if (!s.space.Take(size, offset)) return false;
  s.used_bytes += size;
  return true;
}

void GivePhysical(SimState& s, std::uint64_t offset, std::size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  // Give the pages back to the host now; a later handle at this offset reads zeros.
  fallocate(s.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
            static_cast<off_t>(size));
  s.space.Give(offset, size);
  s.used_bytes -= size;
}

// Frees a handle's memory once its id is released and its last mapping gone. A file of its own is only
// closed: other processes may still hold it, and the kernel frees its pages with the last holder.
void FreePhysical(SimState& s, const SimPhysical& phys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (phys.fd < 0) {
    GivePhysical(s, phys.offset, phys.size);
    return;
  }
  close(phys.fd);
  if (!phys.imported) s.used_bytes -= phys.size;
}

bool Aligned(const SimState& s, std::uint64_t v) { return v % s.options.granularity == 0; }

// The reservation that wholly contains [ptr, ptr+size), or end().
std::map<DevicePtr, std::size_t>::const_iterator FindReservation(const SimState& s, DevicePtr ptr,
                                                                 std::size_t size)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  auto it = s.reservations.upper_bound(ptr);
  if (it == s.reservations.begin()) return s.reservations.end();
  --it;
  if (ptr + size > it->first + it->second) return s.reservations.end();
  return it;
}

// True when every byte of [ptr, ptr+size) is mapped. With `exact`, the range must also start and end on
// mapping boundaries (what MemUnmap needs); with `with_access`, every mapping of it must have access (what
// queued work needs).
bool FullyMapped(const SimState& s, DevicePtr ptr, std::size_t size, bool exact, bool with_access = false)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  auto it = s.MappingAt(ptr);
  if (it == s.mappings.end()) return false;
  if (exact && it->first != ptr) return false;
  DevicePtr covered = it->first;
  const DevicePtr end = ptr + size;
  while (it != s.mappings.end() && it->first == covered && covered < end) {
    if (with_access && !it->second.accessible) return false;
    covered += it->second.size;
    ++it;
  }
  return exact ? covered == end : covered >= end;
}

}  // namespace

std::map<DevicePtr, SimMapping>::const_iterator SimState::MappingAt(DevicePtr ptr) const {
  auto it = mappings.upper_bound(ptr);
  if (it == mappings.begin()) return mappings.end();
  --it;
  return ptr < it->first + it->second.size ? it : mappings.end();
}

bool SimState::Accessible(DevicePtr ptr, std::size_t size) {
  if (size == 0) return true;
  const DevicePtr end = ptr + size;
  auto a = allocations.upper_bound(ptr);
  if (a != allocations.begin() && std::prev(a)->first + std::prev(a)->second.size >= end &&
      std::prev(a)->first <= ptr) {
    return true;
  }
  // Memory of no reservation here (another simulated device's, the host's) is not this device's to judge.
  if (FindReservation(*this, ptr, 1) == reservations.end()) return true;
  return FullyMapped(*this, ptr, size, /*exact=*/false, /*with_access=*/true);
}

bool SimState::CheckQueuedAccess(DevicePtr ptr, std::size_t size) {
  MutexLock lock(&mu);
  if (Accessible(ptr, size)) return true;
  ++illegal_accesses;
  return false;
}

absl::StatusOr<DevicePtr> SimDriver::AddressReserve(std::size_t size, std::size_t alignment) {
  constexpr absl::string_view kName = "cuMemAddressReserve";
  if (absl::Status st = state_->Begin(SimCall::kAddressReserve, kName); !st.ok()) return st;
  const std::size_t gran = state_->options.granularity;
  if (size == 0 || size % gran != 0 || (alignment != 0 && !std::has_single_bit(alignment))) {
    return DriverError(kName, DriverResult::kInvalidValue);
  }
  const std::size_t align = std::max(gran, alignment);
  // Over-reserve, then trim to an aligned range of exactly `size`.
  const std::size_t raw_size = size + align;
  void* raw = mmap(nullptr, raw_size, PROT_NONE, kReserveFlags, -1, 0);
  if (raw == MAP_FAILED) return DriverError(kName, DriverResult::kOutOfMemory);
  const DevicePtr raw_ptr = reinterpret_cast<DevicePtr>(raw);
  const DevicePtr ptr = (raw_ptr + align - 1) / align * align;
  if (ptr > raw_ptr) munmap(raw, ptr - raw_ptr);
  if (raw_ptr + raw_size > ptr + size) munmap(AsPtr(ptr + size), raw_ptr + raw_size - (ptr + size));
  MutexLock lock(&state_->mu);
  state_->reservations.emplace(ptr, size);
  return ptr;
}

absl::Status SimDriver::AddressFree(DevicePtr ptr, std::size_t size) {
  constexpr absl::string_view kName = "cuMemAddressFree";
  if (absl::Status st = state_->Begin(SimCall::kAddressFree, kName); !st.ok()) return st;
  MutexLock lock(&state_->mu);
  auto it = state_->reservations.find(ptr);
  if (it == state_->reservations.end() || it->second != size)
    return DriverError(kName, DriverResult::kInvalidValue);
  // CUDA requires the range to be unmapped first.
  auto m = state_->mappings.lower_bound(ptr);
  if (m != state_->mappings.end() && m->first < ptr + size)
    return DriverError(kName, DriverResult::kInvalidValue);
  munmap(AsPtr(ptr), size);
  state_->reservations.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<PhysicalHandle> SimDriver::MemCreate(std::size_t size) {
  constexpr absl::string_view kName = "cuMemCreate";
  if (absl::Status st = state_->Begin(SimCall::kMemCreate, kName); !st.ok()) return st;
  State& s = *state_;
  if (size == 0 || !Aligned(s, size)) return DriverError(kName, DriverResult::kInvalidValue);
  MutexLock lock(&s.mu);
  std::uint64_t offset = 0;
  if (!TakePhysical(s, size, &offset)) return DriverError(kName, DriverResult::kOutOfMemory);
  const std::uint64_t id = s.next_id++;
  s.physical.emplace(id, SimPhysical{.offset = offset, .size = size});
  ++s.live_handles;
  s.live_handle_bytes += size;
  return PhysicalHandle{id};
}

absl::Status SimDriver::MemRelease(PhysicalHandle handle) {
  constexpr absl::string_view kName = "cuMemRelease";
  if (absl::Status st = state_->Begin(SimCall::kMemRelease, kName); !st.ok()) return st;
  State& s = *state_;
  MutexLock lock(&s.mu);
  auto it = s.physical.find(static_cast<std::uint64_t>(handle));
  if (it == s.physical.end() || it->second.released) return DriverError(kName, DriverResult::kInvalidValue);
  if (--it->second.refs > 0) return absl::OkStatus();  // a retained reference remains
  --s.live_handles;
  s.live_handle_bytes -= it->second.size;
  if (it->second.map_count > 0) {
    // As CUDA: the memory stays until its last mapping goes.
    it->second.released = true;
    return absl::OkStatus();
  }
  FreePhysical(s, it->second);
  s.physical.erase(it);
  return absl::OkStatus();
}

absl::Status SimDriver::MemMap(DevicePtr ptr, std::size_t size, PhysicalHandle handle) {
  constexpr absl::string_view kName = "cuMemMap";
  if (absl::Status st = state_->Begin(SimCall::kMemMap, kName); !st.ok()) return st;
  State& s = *state_;
  if (ptr == 0 || size == 0 || !Aligned(s, ptr) || !Aligned(s, size)) {
    return DriverError(kName, DriverResult::kInvalidValue);
  }
  MutexLock lock(&s.mu);
  auto phys = s.physical.find(static_cast<std::uint64_t>(handle));
  if (phys == s.physical.end() || phys->second.released || phys->second.size != size ||
      FindReservation(s, ptr, size) == s.reservations.end()) {
    return DriverError(kName, DriverResult::kInvalidValue);
  }
  auto next = s.mappings.lower_bound(ptr);
  if (next != s.mappings.end() && next->first < ptr + size)
    return DriverError(kName, DriverResult::kInvalidValue);
  if (next != s.mappings.begin() && std::prev(next)->first + std::prev(next)->second.size > ptr) {
    return DriverError(kName, DriverResult::kInvalidValue);
  }
  const int fd = phys->second.fd >= 0 ? phys->second.fd : s.memfd;
  void* p =
      mmap(AsPtr(ptr), size, PROT_NONE, MAP_FIXED | MAP_SHARED, fd, static_cast<off_t>(phys->second.offset));
  if (p == MAP_FAILED) {
    // A failed MAP_FIXED may have dropped the old range: put the reservation back.
    mmap(AsPtr(ptr), size, PROT_NONE, MAP_FIXED | kReserveFlags, -1, 0);
    return DriverError(kName, DriverResult::kOutOfMemory);
  }
  ++phys->second.map_count;
  s.mappings.emplace(ptr, SimMapping{.size = size, .phys_id = phys->first});
  return absl::OkStatus();
}

absl::Status SimDriver::MemUnmap(DevicePtr ptr, std::size_t size) {
  constexpr absl::string_view kName = "cuMemUnmap";
  if (absl::Status st = state_->Begin(SimCall::kMemUnmap, kName); !st.ok()) return st;
  State& s = *state_;
  if (ptr == 0 || size == 0 || !Aligned(s, ptr) || !Aligned(s, size)) {
    return DriverError(kName, DriverResult::kInvalidValue);
  }
  MutexLock lock(&s.mu);
  if (!FullyMapped(s, ptr, size, /*exact=*/true)) return DriverError(kName, DriverResult::kInvalidValue);
  mmap(AsPtr(ptr), size, PROT_NONE, MAP_FIXED | kReserveFlags, -1, 0);
  for (auto it = s.mappings.find(ptr); it != s.mappings.end() && it->first < ptr + size;) {
    auto phys = s.physical.find(it->second.phys_id);
    if (--phys->second.map_count == 0 && phys->second.released) {
      FreePhysical(s, phys->second);
      s.physical.erase(phys);
    }
    it = s.mappings.erase(it);
  }
  return absl::OkStatus();
}

absl::Status SimDriver::MemSetAccess(DevicePtr ptr, std::size_t size, std::span<const int> peers) {
  constexpr absl::string_view kName = "cuMemSetAccess";
  if (absl::Status st = state_->Begin(SimCall::kMemSetAccess, kName); !st.ok()) return st;
  State& s = *state_;
  if (ptr == 0 || size == 0 || !Aligned(s, ptr) || !Aligned(s, size)) {
    return DriverError(kName, DriverResult::kInvalidValue);
  }
  MutexLock lock(&s.mu);
  for (int peer : peers) {
    if (peer != s.options.ordinal && !s.peers.contains(peer))
      return DriverError(kName, DriverResult::kInvalidDevice);
  }
  if (!FullyMapped(s, ptr, size, /*exact=*/false)) return DriverError(kName, DriverResult::kInvalidValue);
  if (mprotect(AsPtr(ptr), size, PROT_READ | PROT_WRITE) != 0) {
    return DriverError(kName, DriverResult::kOutOfMemory);
  }
  auto it = s.mappings.upper_bound(ptr);
  if (it != s.mappings.begin()) --it;
  for (; it != s.mappings.end() && it->first < ptr + size; ++it) {
    if (it->first + it->second.size > ptr) it->second.accessible = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<DevicePtr> SimDriver::MemAlloc(std::size_t size) {
  constexpr absl::string_view kName = "cuMemAlloc";
  if (absl::Status st = state_->Begin(SimCall::kMemAlloc, kName); !st.ok()) return st;
  State& s = *state_;
  if (size == 0) return DriverError(kName, DriverResult::kInvalidValue);
  const std::size_t gran = s.options.granularity;
  if (size > SIZE_MAX - gran) return DriverError(kName, DriverResult::kOutOfMemory);
  const std::size_t rounded = (size + gran - 1) / gran * gran;
  MutexLock lock(&s.mu);
  if (absl::Status st = s.RefuseDuringCapture(kName, SimState::Unsafe::kGlobalOnly); !st.ok()) return st;
  std::uint64_t offset = 0;
  if (!TakePhysical(s, rounded, &offset)) return DriverError(kName, DriverResult::kOutOfMemory);
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, s.memfd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    GivePhysical(s, offset, rounded);
    return DriverError(kName, DriverResult::kOutOfMemory);
  }
  const DevicePtr ptr = reinterpret_cast<DevicePtr>(p);
  s.allocations.emplace(ptr, SimAllocation{.offset = offset, .size = rounded});
  return ptr;
}

absl::Status SimDriver::MemFree(DevicePtr ptr) {
  constexpr absl::string_view kName = "cuMemFree";
  if (absl::Status st = state_->Begin(SimCall::kMemFree, kName); !st.ok()) return st;
  State& s = *state_;
  MutexLock lock(&s.mu);
  auto it = s.allocations.find(ptr);
  if (it == s.allocations.end()) return DriverError(kName, DriverResult::kInvalidValue);
  if (absl::Status st = s.RefuseDuringCapture(kName, SimState::Unsafe::kGlobalOnly); !st.ok()) return st;
  munmap(AsPtr(ptr), it->second.size);
  GivePhysical(s, it->second.offset, it->second.size);
  s.allocations.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<void*> SimDriver::HostAlloc(std::size_t size) {
  constexpr absl::string_view kName = "cuMemHostAlloc";
  if (absl::Status st = state_->Begin(SimCall::kHostAlloc, kName); !st.ok()) return st;
  if (size == 0) return DriverError(kName, DriverResult::kInvalidValue);
  // Page-aligned and zeroed, like the pages the driver pins; host memory is not the device's capacity.
  constexpr std::size_t kPage = 4096;
  if (size > SIZE_MAX - kPage) return DriverError(kName, DriverResult::kOutOfMemory);
  void* p = std::aligned_alloc(kPage, (size + kPage - 1) / kPage * kPage);
  if (p == nullptr) return DriverError(kName, DriverResult::kOutOfMemory);
  std::memset(p, 0, size);
  MutexLock lock(&state_->mu);
  state_->host_allocations.emplace(p, size);
  return p;
}

absl::Status SimDriver::HostFree(void* ptr) {
  constexpr absl::string_view kName = "cuMemFreeHost";
  if (absl::Status st = state_->Begin(SimCall::kHostFree, kName); !st.ok()) return st;
  {
    MutexLock lock(&state_->mu);
    if (state_->host_allocations.erase(ptr) == 0) return DriverError(kName, DriverResult::kInvalidValue);
  }
  std::free(ptr);
  return absl::OkStatus();
}

namespace {

// Copies `size` bytes at `offset` of the physical memfd to `out_offset` of `out`; false on an I/O error.
bool CopyPhysical(int memfd, std::uint64_t offset, int out, std::uint64_t out_offset, std::size_t size) {
  std::vector<char> buffer(std::min<std::size_t>(size, std::size_t{1} << 20));
  while (size > 0) {
    const std::size_t n = std::min(size, buffer.size());
    if (pread(memfd, buffer.data(), n, static_cast<off_t>(offset)) != static_cast<ssize_t>(n)) return false;
    if (pwrite(out, buffer.data(), n, static_cast<off_t>(out_offset)) != static_cast<ssize_t>(n))
      return false;
    offset += n;
    out_offset += n;
    size -= n;
  }
  return true;
}

}  // namespace

absl::StatusOr<int> SimDriver::MemGetDmaBufFd(DevicePtr ptr, std::size_t size) {
  constexpr absl::string_view kName = "cuMemGetHandleForAddressRange";
  if (absl::Status st = state_->Begin(SimCall::kMemGetDmaBufFd, kName); !st.ok()) return st;
  State& s = *state_;
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  if (ptr == 0 || size == 0 || ptr % page != 0 || size % page != 0) {
    return DriverError(kName, DriverResult::kInvalidValue);
  }
  MutexLock lock(&s.mu);
  // The pieces of the range: (physical offset, bytes), from a plain allocation or from mappings.
  std::vector<std::pair<std::uint64_t, std::size_t>> pieces;
  auto a = s.allocations.upper_bound(ptr);
  if (a != s.allocations.begin() && std::prev(a)->first <= ptr &&
      std::prev(a)->first + std::prev(a)->second.size >= ptr + size) {
    pieces.emplace_back(std::prev(a)->second.offset + (ptr - std::prev(a)->first), size);
  } else {
    if (!FullyMapped(s, ptr, size, /*exact=*/false)) return DriverError(kName, DriverResult::kInvalidValue);
    auto it = s.MappingAt(ptr);
    for (DevicePtr at = ptr; at < ptr + size; ++it) {
      const std::size_t skip = at - it->first;
      const std::size_t n = std::min(it->second.size - skip, ptr + size - at);
      pieces.emplace_back(s.physical.at(it->second.phys_id).offset + skip, n);
      at += n;
    }
  }
  const int fd = memfd_create("graphalloc-sim-dmabuf", MFD_CLOEXEC);
  if (fd < 0) return DriverError(kName, DriverResult::kOutOfMemory);
  bool ok = ftruncate(fd, static_cast<off_t>(size)) == 0;
  std::uint64_t out = 0;
  for (const auto& [offset, n] : pieces) {
    ok = ok && CopyPhysical(s.memfd, offset, fd, out, n);
    out += n;
  }
  if (!ok) {
    close(fd);
    return DriverError(kName, DriverResult::kOutOfMemory);
  }
  return fd;
}

absl::Status SimDriver::CopyHostToDevice(DevicePtr dst, const void* src, std::size_t bytes) {
  constexpr absl::string_view kName = "cuMemcpyHtoD";
  if (absl::Status st = state_->Begin(SimCall::kCopy, kName); !st.ok()) return st;
  {
    MutexLock lock(&state_->mu);
    if (absl::Status st = state_->RefuseDuringCapture(kName, SimState::Unsafe::kGlobalOnly); !st.ok())
      return st;
    // Synchronous copies run after the legacy default stream's work, as on CUDA.
    if (!state_->InClosure()) state_->DriveStream(state_->streams.at(0));
  }
  // Outside the lock: touching unmapped memory faults here, as an illegal address would.
  if (bytes != 0) std::memcpy(AsPtr(dst), src, bytes);
  return absl::OkStatus();
}

absl::Status SimDriver::CopyDeviceToHost(void* dst, DevicePtr src, std::size_t bytes) {
  constexpr absl::string_view kName = "cuMemcpyDtoH";
  if (absl::Status st = state_->Begin(SimCall::kCopy, kName); !st.ok()) return st;
  {
    MutexLock lock(&state_->mu);
    if (absl::Status st = state_->RefuseDuringCapture(kName, SimState::Unsafe::kGlobalOnly); !st.ok())
      return st;
    if (!state_->InClosure()) state_->DriveStream(state_->streams.at(0));
  }
  if (bytes != 0) std::memcpy(dst, AsPtr(src), bytes);
  return absl::OkStatus();
}

absl::Status SimDriver::CopyAsync(DevicePtr dst, DevicePtr src, std::size_t bytes, Stream stream) {
  constexpr absl::string_view kName = "cuMemcpyAsync";
  if (absl::Status st = state_->Begin(SimCall::kCopy, kName); !st.ok()) return st;
  // The check runs with the work, not now: what matters is the memory when the device gets to it.
  SimState* s = state_.get();
  return state_->Enqueue(
      stream, SimNodeKind::kMemcpy,
      [s, dst, src, bytes] {
        if (!s->CheckQueuedAccess(dst, bytes) || !s->CheckQueuedAccess(src, bytes)) return;
        if (bytes != 0) std::memmove(AsPtr(dst), AsPtr(src), bytes);
      },
      kName);
}

absl::Status SimDriver::MemsetAsync(DevicePtr dst, std::uint8_t value, std::size_t bytes, Stream stream) {
  constexpr absl::string_view kName = "cuMemsetD8Async";
  if (absl::Status st = state_->Begin(SimCall::kCopy, kName); !st.ok()) return st;
  SimState* s = state_.get();
  return state_->Enqueue(
      stream, SimNodeKind::kMemset,
      [s, dst, value, bytes] {
        if (!s->CheckQueuedAccess(dst, bytes)) return;
        if (bytes != 0) std::memset(AsPtr(dst), value, bytes);
      },
      kName);
}

}  // namespace graphalloc

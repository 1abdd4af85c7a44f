// SimDriver: construction, teardown, fault injection, counters and device info.
//
// The device's memory, streams and capture live in allocator/device/sim/ (see sim_state.h for the shared
// state and its locking rules).
#include "graphalloc/allocator/device/sim_driver.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/device/sim/sim_state.h"

namespace graphalloc {
namespace {

// The memfd is sized sparse to this much offset space: far more than any capacity, so handle offsets
// never need compaction, and it costs nothing until pages are touched.
constexpr std::uint64_t kOffsetSpace = std::uint64_t{64} << 40;

std::uint64_t SplitMix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

SimState::SimState(SimDriverOptions opts, int fd, std::uint64_t offset_limit)
    : options(std::move(opts)), memfd(fd), manual(options.manual_completion), space(offset_limit) {
  info.ordinal = options.ordinal;
  info.name = options.name;
  info.total_memory = options.capacity;
  info.granularity = options.granularity;
  info.recommended_granularity = options.granularity;
  info.compute_capability_major = 9;
  info.compute_capability_minor = 0;
  streams.emplace(0, std::make_shared<SimStreamState>());
}

absl::Status SimState::Begin(SimCall call, absl::string_view name) {
  const int k = static_cast<int>(call);
  MutexLock lock(&fault_mu);
  const std::uint64_t n = ++call_counts[k];
  auto& planned = planned_faults[k];
  for (auto it = planned.begin(); it != planned.end(); ++it) {
    if (it->first == n) {
      const DriverResult result = it->second;
      planned.erase(it);
      ++injected;
      return DriverError(name, result);
    }
  }
  if (random_rate > 0 && random_calls[k]) {
    // Keyed by (seed, kind, call number) only, so the same calls fail whatever other kinds do.
    const std::uint64_t bits = SplitMix64(random_seed ^ SplitMix64((std::uint64_t(k) << 48) ^ n));
    const double u = double(bits >> 11) * (1.0 / double(std::uint64_t{1} << 53));
    if (u < random_rate) {
      ++injected;
      return DriverError(name, random_result);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SimDriver>> SimDriver::Create(SimDriverOptions options) {
  const long page = sysconf(_SC_PAGESIZE);
  if (options.granularity == 0 || !std::has_single_bit(options.granularity) ||
      options.granularity % static_cast<std::size_t>(page) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SimDriver: granularity ", options.granularity,
                     " must be a power of two and a multiple of the page size (", page, ")"));
  }
  if (options.capacity == 0) return absl::InvalidArgumentError("SimDriver: capacity must be > 0");
  const int fd = memfd_create("graphalloc-sim-device", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("SimDriver: memfd_create: ", std::strerror(errno)));
  const std::uint64_t limit = std::max<std::uint64_t>(kOffsetSpace, std::uint64_t{4} * options.capacity);
  if (ftruncate(fd, static_cast<off_t>(limit)) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(
        absl::StrCat("SimDriver: ftruncate of the device memfd to ", limit, " bytes: ", std::strerror(err)));
  }
  return std::unique_ptr<SimDriver>(new SimDriver(std::make_unique<State>(std::move(options), fd, limit)));
}

SimDriver::SimDriver(std::unique_ptr<State> state) : state_(std::move(state)) {}

SimDriver::~SimDriver() {
  // Whatever the user leaked goes now. Queued closures are dropped unrun, outside the lock (their
  // captured objects may have destructors that do anything).
  std::vector<std::shared_ptr<SimStreamState>> streams;
  std::map<DevicePtr, std::size_t> reservations;
  std::map<DevicePtr, SimAllocation> allocations;
  std::map<void*, std::size_t> host_allocations;
  absl::flat_hash_map<std::uint64_t, SimGraphState> graphs, execs;
  absl::flat_hash_map<std::uint64_t, std::shared_ptr<SimCapture>> captures;
  {
    MutexLock lock(&state_->mu);
    for (auto& [id, s] : state_->streams) {
      s->capture.reset();
      streams.push_back(s);
    }
    state_->streams.clear();
    reservations.swap(state_->reservations);
    allocations.swap(state_->allocations);
    host_allocations.swap(state_->host_allocations);
    graphs.swap(state_->graphs);
    execs.swap(state_->execs);
    captures.swap(state_->captures);
  }
  for (auto& s : streams) s->queue.clear();
  // Unmapping a reservation drops the handle mappings inside it too.
  for (const auto& [ptr, size] : reservations) munmap(reinterpret_cast<void*>(ptr), size);
  for (const auto& [ptr, a] : allocations) munmap(reinterpret_cast<void*>(ptr), a.size);
  for (const auto& [ptr, size] : host_allocations) std::free(ptr);
  for (const auto& [ptr, size] : state_->ipc_opened) munmap(reinterpret_cast<void*>(ptr), size);
  for (const auto& [id, phys] : state_->physical) {
    if (phys.fd >= 0) close(phys.fd);
  }
  close(state_->memfd);
}

void SimDriver::InjectFault(SimCall call, int nth, DriverResult result) {
  if (nth < 1 || call == SimCall::kCount) return;
  const int k = static_cast<int>(call);
  MutexLock lock(&state_->fault_mu);
  state_->planned_faults[k].emplace_back(state_->call_counts[k] + static_cast<std::uint64_t>(nth), result);
}

void SimDriver::SetRandomFaults(double rate, std::uint64_t seed, std::span<const SimCall> calls,
                                DriverResult result) {
  MutexLock lock(&state_->fault_mu);
  state_->random_rate = rate;
  state_->random_seed = seed;
  state_->random_result = result;
  state_->random_calls.fill(false);
  for (SimCall c : calls) {
    if (c != SimCall::kCount) state_->random_calls[static_cast<int>(c)] = true;
  }
}

void SimDriver::ClearFaults() {
  MutexLock lock(&state_->fault_mu);
  for (auto& p : state_->planned_faults) p.clear();
  state_->random_rate = 0;
  state_->random_calls.fill(false);
}

std::uint64_t SimDriver::InjectedFaultCount() const {
  MutexLock lock(&state_->fault_mu);
  return state_->injected;
}

std::uint64_t SimDriver::CallCount(SimCall call) const {
  if (call == SimCall::kCount) return 0;
  MutexLock lock(&state_->fault_mu);
  return state_->call_counts[static_cast<int>(call)];
}

SimCounters SimDriver::Counters() const {
  MutexLock lock(&state_->mu);
  SimCounters c;
  c.reservations = state_->reservations.size();
  for (const auto& [ptr, size] : state_->reservations) c.reserved_bytes += size;
  c.handles = state_->live_handles;
  c.handle_bytes = state_->live_handle_bytes;
  c.mappings = state_->mappings.size();
  for (const auto& [ptr, m] : state_->mappings) c.mapped_bytes += m.size;
  c.allocations = state_->allocations.size();
  for (const auto& [ptr, a] : state_->allocations) c.allocated_bytes += a.size;
  c.host_allocations = state_->host_allocations.size();
  for (const auto& [ptr, size] : state_->host_allocations) c.host_bytes += size;
  c.ipc_mappings = state_->ipc_opened.size();
  for (const auto& [id, s] : state_->streams) c.streams += (id != 0 && !s->destroyed) ? 1 : 0;
  c.events = state_->events.size();
  c.graphs = state_->graphs.size();
  c.graph_execs = state_->execs.size();
  c.pending_work = state_->pending_runs;
  c.illegal_accesses = state_->illegal_accesses;
  return c;
}

std::size_t SimDriver::UsedBytes() const {
  MutexLock lock(&state_->mu);
  return state_->used_bytes;
}

const SimDriverOptions& SimDriver::Options() const { return state_->options; }
std::string_view SimDriver::Kind() const { return "sim"; }
const DeviceInfo& SimDriver::Info() const { return state_->info; }

absl::Status SimDriver::EnablePeerAccess(int peer_ordinal) {
  // The simulated host has any number of peer devices; only this device itself and negative ordinals
  // are not peers.
  if (peer_ordinal < 0 || peer_ordinal == state_->options.ordinal) {
    return DriverError("cuCtxEnablePeerAccess", DriverResult::kInvalidDevice);
  }
  MutexLock lock(&state_->mu);
  if (!state_->peers.insert(peer_ordinal).second) {
    return DriverError("cuCtxEnablePeerAccess", DriverResult::kPeerAccessAlreadyEnabled);
  }
  return absl::OkStatus();
}

absl::StatusOr<MemoryInfo> SimDriver::GetMemoryInfo() {
  MutexLock lock(&state_->mu);
  return MemoryInfo{.free = state_->options.capacity - state_->used_bytes, .total = state_->options.capacity};
}

}  // namespace graphalloc

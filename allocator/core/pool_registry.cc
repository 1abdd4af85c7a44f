#include "graphalloc/allocator/core/pool_registry.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace graphalloc {

PoolId PoolRegistry::Create(PoolOptions options, std::shared_ptr<SegmentSource> segment_source) {
  const PoolId id = next_id_++;
  auto state = std::make_unique<PoolState>(id, options, std::move(segment_source));
  state->users.store(1, std::memory_order_relaxed);
  pools_.emplace(id, std::move(state));
  return id;
}

PoolState* PoolRegistry::Find(PoolId id) const {
  auto it = pools_.find(id);
  return it == pools_.end() ? nullptr : it->second.get();
}

absl::Status PoolRegistry::AddUser(PoolId id) {
  PoolState* pool = Find(id);
  if (pool == nullptr || pool->orphaned.load(std::memory_order_relaxed)) {
    // PyTorch asserts here ("use_count > 0") when a pool id outlives its last user; we say what happened.
    return absl::NotFoundError(absl::StrFormat(
        "private pool %d does not exist (any more): every user and graph of it was dropped; create a new "
        "pool",
        id));
  }
  pool->users.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status PoolRegistry::AddPin(PoolId id) {
  PoolState* pool = Find(id);
  if (pool == nullptr) return absl::NotFoundError(absl::StrFormat("private pool %d is gone", id));
  pool->pins.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

bool PoolRegistry::DropUser(PoolId id) {
  PoolState* pool = Find(id);
  if (pool == nullptr) return false;
  const bool last = pool->users.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
                    pool->pins.load(std::memory_order_acquire) == 0;
  if (last) pool->orphaned.store(true, std::memory_order_release);
  return last;
}

bool PoolRegistry::DropPin(PoolId id) {
  PoolState* pool = Find(id);
  if (pool == nullptr) return false;
  const bool last = pool->pins.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
                    pool->users.load(std::memory_order_acquire) == 0;
  if (last) pool->orphaned.store(true, std::memory_order_release);
  return last;
}

absl::Status PoolRegistry::SetUseOnOom(PoolId id, bool use_on_oom) {
  PoolState* pool = Find(id);
  if (pool == nullptr) return absl::NotFoundError(absl::StrFormat("private pool %d does not exist", id));
  pool->use_on_oom.store(use_on_oom, std::memory_order_relaxed);
  return absl::OkStatus();
}

std::vector<PoolId> PoolRegistry::UseOnOomPools() const {
  std::vector<PoolId> out;
  for (const auto& [id, pool] : pools_) {
    if (pool->use_on_oom.load(std::memory_order_relaxed) && !pool->orphaned.load(std::memory_order_relaxed)) {
      out.push_back(id);
    }
  }
  return out;
}

std::vector<PoolId> PoolRegistry::Orphans() const {
  std::vector<PoolId> out;
  for (const auto& [id, pool] : pools_) {
    if (pool->orphaned.load(std::memory_order_acquire)) out.push_back(id);
  }
  return out;
}

bool PoolRegistry::Releasable(const PoolState* pool, PoolId scope) {
  if (scope != kDefaultPool) {
    return pool != nullptr && pool->id == scope && pool->pins.load(std::memory_order_acquire) == 0;
  }
  return pool == nullptr || (pool->users.load(std::memory_order_acquire) == 0 &&
                             pool->pins.load(std::memory_order_acquire) == 0);
}

}  // namespace graphalloc

#include "graphalloc/graph/site_executables.h"

namespace graphalloc {

void SiteExecutables::Give(std::size_t slot, ExecHolder& holder) {
  Slot& s = slots_[slot];
  if (s.holder != nullptr && s.holder != &holder) {
    s.holder->slot = ExecHolder::kNone;
    s.holder->evicted = true;
  }
  s.holder = &holder;
  s.last_use = ++clock_;
  holder.slot = slot;
}

absl::StatusOr<GraphExec> SiteExecutables::AcquireSlow(ExecHolder& holder, const OwnedGraph& graph) {
  holder.slot = ExecHolder::kNone;
  const bool reuse = !slots_.empty() && (slots_.size() >= capacity_ || (update_first_ && !holder.evicted));
  if (!reuse) {
    absl::StatusOr<OwnedGraphExec> exec = Instantiate(driver_, graph);
    if (!exec.ok()) return exec.status();
    ++counters_.instantiations;
    slots_.push_back(Slot{.exec = std::move(*exec)});
    Give(slots_.size() - 1, holder);
    return slots_.back().exec.get();
  }
  std::size_t victim = 0;
  for (std::size_t i = 1; i < slots_.size(); ++i) {
    if (slots_[i].last_use < slots_[victim].last_use) victim = i;
  }
  Slot& slot = slots_[victim];
  absl::StatusOr<GraphUpdateResult> update = driver_.GraphExecUpdate(slot.exec.get(), graph.get());
  if (update.ok() && *update == GraphUpdateResult::kSuccess) {
    ++counters_.updates;
    Give(victim, holder);
    return slot.exec.get();
  }
  // Refused (another topology) or failed: the old executable may be half-updated, so it goes either way.
  ++counters_.refused_updates;
  if (slot.holder != nullptr) {
    slot.holder->slot = ExecHolder::kNone;
    slot.holder->evicted = true;
  }
  slot.holder = nullptr;
  slot.exec.Reset();
  absl::StatusOr<OwnedGraphExec> exec = Instantiate(driver_, graph);
  if (!exec.ok()) {
    slots_.erase(slots_.begin() + static_cast<std::ptrdiff_t>(victim));
    for (std::size_t i = victim; i < slots_.size(); ++i) {
      if (slots_[i].holder != nullptr) slots_[i].holder->slot = i;
    }
    return exec.status();
  }
  ++counters_.instantiations;
  slot.exec = std::move(*exec);
  Give(victim, holder);
  return slot.exec.get();
}

void SiteExecutables::Release(ExecHolder& holder) {
  if (holder.slot != ExecHolder::kNone && slots_[holder.slot].holder == &holder) {
    slots_[holder.slot].holder = nullptr;
  }
  holder.slot = ExecHolder::kNone;
}

}  // namespace graphalloc

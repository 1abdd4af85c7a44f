#include "graphalloc/allocator/core/memory_budget.h"

#include <algorithm>

namespace graphalloc {

void MemoryBudget::SetFraction(double fraction) {
  fraction_ = fraction;
  limit_ = fraction >= 1.0 ? 0 : static_cast<std::size_t>(fraction * static_cast<double>(device_memory_));
  // A zero fraction allows nothing; represent it as a one-byte cap rather than "no cap".
  if (fraction < 1.0 && limit_ == 0) limit_ = 1;
}

void MemoryBudget::SetLimit(std::size_t bytes) {
  limit_ = bytes;
  fraction_ = bytes == 0 ? 1.0 : static_cast<double>(bytes) / static_cast<double>(device_memory_);
}

std::size_t MemoryBudget::capacity() const {
  return limit_ != 0 ? std::min(limit_, device_memory_) : device_memory_;
}

bool MemoryBudget::BeginSegment(std::size_t reserved, std::size_t bytes) {
  if (limit_ != 0 && reserved + segments_in_flight_ + bytes > limit_) return false;
  segments_in_flight_ += bytes;
  return true;
}

bool MemoryBudget::AdmitNewHandles(std::size_t reserved, std::size_t cached, std::size_t bytes) {
  if (limit_ != 0 && bytes != 0 && Committed(reserved, cached, bytes) > limit_) return false;
  growth_in_flight_ += bytes;
  return true;
}

std::size_t MemoryBudget::GarbageCollectionTarget(std::size_t reserved, double threshold) const {
  if (limit_ == 0) return 0;
  const auto held = static_cast<double>(reserved);
  const double wanted = threshold * static_cast<double>(limit_);
  if (held <= wanted) return 0;
  return static_cast<std::size_t>(held - wanted);
}

}  // namespace graphalloc

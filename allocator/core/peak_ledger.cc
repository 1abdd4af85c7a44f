#include "graphalloc/allocator/core/peak_ledger.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/invariant_violation.h"
#include "graphalloc/allocator/stats/stat_names.h"

namespace graphalloc {
namespace {

// Runs f(name, type, member) for every block statistic: the arrays moved by blocks, each pool kind.
template <typename F>
void ForEachBlockStat(F f) {
  for (const StatArrayName& a : kStatArrays) {
    if (a.scope != StatScope::kBlock) continue;
    for (int t = 0; t < kNumStatTypes; ++t) f(a.name, t, a.member);
  }
}

Stat& StatOf(DeviceStats& stats, StatArray DeviceStats::*member, int type) {
  return (stats.*member).by_type[type];
}

}  // namespace

void PeakLedger::Fold(const AllShardsLock& lock) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::int64_t flagged = 0;
  lock.ForEach([&](StreamShard* s) { flagged += s->peak_over.load(std::memory_order_relaxed) ? 1 : 0; });
  ForEachBlockStat([&](absl::string_view, int t, StatArray DeviceStats::*member) {
    std::int64_t sum = 0;     // the device's current value, exact: every shard is locked
    std::int64_t grants = 0;  // Stat::peak of every shard (each at least its current)
    lock.ForEach([&](StreamShard* s) {
      const Stat& st = StatOf(s->stats, member, t);
      sum += st.current;
      grants += st.peak;
    });
    Stat& device = StatOf(peaks_, member, t);
    device.peak = std::max(device.peak, sum);
    if (grants > device.peak) {
      // Take unused room back, from every shard in proportion to its own, rounded up so that the grants
      // fit. The device's peak is at least the sum, so the unused room covers the excess.
      const auto excess = static_cast<unsigned __int128>(grants - device.peak);
      const auto unused = static_cast<unsigned __int128>(grants - sum);
      lock.ForEach([&](StreamShard* s) {
        Stat& st = StatOf(s->stats, member, t);
        const auto room = static_cast<unsigned __int128>(st.peak - st.current);
        const unsigned __int128 cut = std::min(room, (room * excess + unused - 1) / unused);
        st.peak -= static_cast<std::int64_t>(cut);
        grants -= static_cast<std::int64_t>(cut);
      });
    }
    // Room left under the peak goes to the shards that asked for more, which are growing.
    if (flagged > 0 && grants < device.peak) {
      const std::int64_t share = (device.peak - grants) / flagged;
      lock.ForEach([&](StreamShard* s) {
        if (s->peak_over.load(std::memory_order_relaxed)) StatOf(s->stats, member, t).peak += share;
      });
    }
  });
  lock.ForEach([](StreamShard* s) { s->peak_over.store(false, std::memory_order_relaxed); });
}

void PeakLedger::Reset(const AllShardsLock& lock) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  ForEachBlockStat([&](absl::string_view, int t, StatArray DeviceStats::*member) {
    std::int64_t sum = 0;
    lock.ForEach([&](StreamShard* s) {
      Stat& st = StatOf(s->stats, member, t);
      st.ResetPeak();  // no room: any growth is a candidate peak
      sum += st.current;
    });
    StatOf(peaks_, member, t).peak = sum;
  });
  lock.ForEach([](StreamShard* s) { s->peak_over.store(false, std::memory_order_relaxed); });
}

void PeakLedger::CopyPeaks(DeviceStats& out) const {
  ForEachBlockStat([&](absl::string_view, int t, StatArray DeviceStats::*member) {
    StatOf(out, member, t).peak = (peaks_.*member).by_type[t].peak;
  });
}

absl::Status PeakLedger::Check(const AllShardsLock& lock) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  bool flagged = false;
  lock.ForEach([&](StreamShard* s) { flagged = flagged || s->peak_over.load(std::memory_order_relaxed); });
  if (flagged) return absl::OkStatus();  // a fold is on its way
  absl::Status status;
  ForEachBlockStat([&](absl::string_view name, int t, StatArray DeviceStats::*member) {
    std::int64_t sum = 0, grants = 0;
    lock.ForEach([&](StreamShard* s) {
      const Stat& st = StatOf(s->stats, member, t);
      sum += st.current;
      grants += st.peak;
    });
    const std::int64_t peak = (peaks_.*member).by_type[t].peak;
    if (status.ok() && (grants > peak || sum > peak)) {
      status = InvariantViolation(absl::StrFormat(
          "peak ledger: %s.%s: the shards' grants add up to %d and their values to %d, but the device's peak "
          "is %d",
          name, kStatTypeNames[t], grants, sum, peak));
    }
  });
  return status;
}

}  // namespace graphalloc

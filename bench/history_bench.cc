// Cost of recording allocation history: one alloc and one free event per iteration (what an allocate+free
// pair adds to the allocator's hot path), without stacks, on 1 and 8 threads; the same with recording
// disabled (the check the hot path always pays) and with stacks (backtrace()).
#include <benchmark/benchmark.h>

#include <cstdint>

#include "graphalloc/allocator/history/history_ring.h"

namespace graphalloc {
namespace {

HistoryRing& Ring(bool enabled, bool stacks) {
  static HistoryRing* ring = new HistoryRing();
  (void)ring->RecordHistory({enabled, 100000, stacks});
  return *ring;
}

void RecordPair(HistoryRing& ring, std::uint64_t i) {
  ring.Record(HistoryAction::kAlloc, 0x7f0000000000 + (i << 9), 512, 0, 0);
  ring.Record(HistoryAction::kFreeRequested, 0x7f0000000000 + (i << 9), 512, 0, 0);
}

void BM_HistoryAllocFreePair(benchmark::State& state) {
  HistoryRing& ring = Ring(true, false);
  std::uint64_t i = static_cast<std::uint64_t>(state.thread_index()) << 40;
  for (auto _ : state) RecordPair(ring, i++);
  state.SetItemsProcessed(state.iterations());
  state.SetLabel("ns per alloc+free pair");
}
BENCHMARK(BM_HistoryAllocFreePair)->Threads(1)->Threads(8)->UseRealTime();

void BM_HistoryDisabledPair(benchmark::State& state) {
  HistoryRing& ring = Ring(false, false);
  std::uint64_t i = 0;
  for (auto _ : state) RecordPair(ring, i++);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HistoryDisabledPair)->Threads(1);

void BM_HistoryAllocFreePairWithStacks(benchmark::State& state) {
  HistoryRing& ring = Ring(true, true);
  std::uint64_t i = 0;
  for (auto _ : state) RecordPair(ring, i++);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HistoryAllocFreePairWithStacks)->Threads(1);

// Reading (and symbolizing) a full ring of 100,000 events, as a snapshot does.
void BM_HistoryRead100k(benchmark::State& state) {
  HistoryRing ring;
  (void)ring.RecordHistory({true, 100000, state.range(0) != 0});
  for (std::uint64_t i = 0; i < 100000; ++i) ring.Record(HistoryAction::kAlloc, i, 512, 0, 0);
  for (auto _ : state) benchmark::DoNotOptimize(ring.Read());
  state.SetLabel(state.range(0) != 0 ? "with stacks" : "no stacks");
}
BENCHMARK(BM_HistoryRead100k)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace graphalloc

BENCHMARK_MAIN();

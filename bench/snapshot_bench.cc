// Writing and reading snapshot files: a snapshot with 1,000,000 history events (the target: written in
// under 1 s), with and without stacks on 1% of the events, plus the PyTorch pickle export of the same.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "graphalloc/allocator/snapshot/torch_snapshot.h"

namespace graphalloc {
namespace {

MemorySnapshot MakeSnapshot(std::size_t events, bool stacks) {
  MemorySnapshot s;
  s.label = "bench";
  s.history_max_entries = events;
  s.history.reserve(events);
  const std::vector<Frame> frames = {{"graphalloc::CachingAllocator::Allocate", "libgraphalloc.so", 0},
                                     {"train_step(Model&, Batch const&)", "train.cc", 120},
                                     {"main", "main.cc", 7}};
  for (std::size_t i = 0; i < events; ++i) {
    HistoryEvent e;
    e.action = i % 2 == 0 ? HistoryAction::kAlloc : HistoryAction::kFreeRequested;
    e.address = 0x7f0000000000 + (i / 2) * 4096;
    e.size = 4096 * (1 + i % 64);
    e.stream = 0x55d0c0ffee00 + i % 4;
    e.pool_id = i % 3;
    e.time_us = 1'700'000'000'000'000 + static_cast<std::int64_t>(i);
    if (stacks && i % 100 == 0) e.frames = frames;
    s.history.push_back(std::move(e));
  }
  // A few segments with blocks, as a training step has.
  for (std::uint64_t seg = 0; seg < 100; ++seg) {
    SegmentSnapshot sg{
        0x7e0000000000 + seg * (64 << 20), 64 << 20, 0, 0, SegmentKind::kLarge, false, {}, {}, {}};
    for (std::uint64_t b = 0; b < 64; ++b) {
      sg.blocks.push_back({sg.address + b * (1 << 20),
                           1 << 20,
                           b % 2 == 0 ? (1u << 20) - 8 : 0,
                           b % 2 == 0 ? BlockState::kAllocated : BlockState::kFree,
                           0,
                           {},
                           ""});
    }
    s.segments.push_back(std::move(sg));
  }
  return s;
}

void BM_WriteSnapshotJson(benchmark::State& state) {
  const MemorySnapshot s = MakeSnapshot(static_cast<std::size_t>(state.range(0)), state.range(1) != 0);
  const std::string path = "/tmp/graphalloc_snapshot_bench.json";
  std::size_t bytes = 0;
  for (auto _ : state) {
    const std::string json = SnapshotToJson(s);
    bytes = json.size();
    if (!WriteFileBytes(path, json).ok()) state.SkipWithError("write failed");
  }
  std::remove(path.c_str());
  state.counters["MB"] = static_cast<double>(bytes) / 1e6;
  state.SetLabel(state.range(1) != 0 ? "to file, 1% of events with stacks" : "to file, no stacks");
}
BENCHMARK(BM_WriteSnapshotJson)->Args({1000000, 0})->Args({1000000, 1})->Unit(benchmark::kMillisecond);

void BM_ReadSnapshotJson(benchmark::State& state) {
  const std::string json = SnapshotToJson(MakeSnapshot(static_cast<std::size_t>(state.range(0)), false));
  for (auto _ : state) {
    absl::StatusOr<MemorySnapshot> s = SnapshotFromJson(json);
    if (!s.ok()) state.SkipWithError("read failed");
    benchmark::DoNotOptimize(s);
  }
}
BENCHMARK(BM_ReadSnapshotJson)->Arg(1000000)->Unit(benchmark::kMillisecond);

void BM_ExportTorchPickle(benchmark::State& state) {
  const MemorySnapshot s = MakeSnapshot(static_cast<std::size_t>(state.range(0)), false);
  for (auto _ : state) benchmark::DoNotOptimize(SnapshotToTorchPickle(s));
}
BENCHMARK(BM_ExportTorchPickle)->Arg(1000000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace graphalloc

BENCHMARK_MAIN();

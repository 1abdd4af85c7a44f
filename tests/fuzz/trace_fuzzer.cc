// libFuzzer target: the allocation-trace reader and replay (allocator/trace/). The input is a trace file's
// bytes, plain CSV or gzip'd (detected by the magic bytes, as ReadTrace does). Reading must give a Trace
// or an error, never a crash; a Trace must print (FormatTraceCsv) to CSV that parses back to the same
// events; a short trace is then summarized and replayed through a caching allocator on a small simulated
// device with invariant checks after every operation, which must end with an OK result or an error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/strings/string_view.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "graphalloc/allocator/trace/trace_reader.h"
#include "graphalloc/allocator/trace/trace_replay.h"

namespace {

[[noreturn]] void Fail(const char* what, absl::string_view detail) {
  std::fprintf(stderr, "trace_fuzzer: %s: %.*s\n", what, static_cast<int>(detail.size()), detail.data());
  std::abort();
}

// Replays stay short: the fuzzer's time goes into the reader.
constexpr std::size_t kMaxReplayEvents = 256;

// One simulated device (1 GiB) and allocator for the whole run; every replay frees what it allocated.
graphalloc::CachingAllocator& Allocator() {
  static graphalloc::CachingAllocator* allocator = [] {
    graphalloc::SimDriverOptions options;
    options.capacity = std::size_t{1} << 30;
    absl::StatusOr<std::unique_ptr<graphalloc::SimDriver>> driver = graphalloc::SimDriver::Create(options);
    if (!driver.ok()) Fail("SimDriver::Create", driver.status().ToString());
    absl::StatusOr<std::unique_ptr<graphalloc::CachingAllocator>> created =
        graphalloc::CachingAllocator::Create(std::shared_ptr<graphalloc::Driver>(std::move(*driver)));
    if (!created.ok()) Fail("CachingAllocator::Create", created.status().ToString());
    return created->release();
  }();
  return *allocator;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::string csv;
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
      static_cast<unsigned char>(bytes[1]) == 0x8b) {
    absl::StatusOr<std::string> plain = graphalloc::GunzipBytes(bytes, "fuzz.csv.gz");
    if (!plain.ok()) {
      if (plain.status().message().empty()) Fail("gunzip error without a message", "");
      return 0;
    }
    // Bombs: a few KiB of gzip may inflate to gigabytes; the reader must still answer, but keep the
    // parse bounded.
    if (plain->size() > (std::size_t{1} << 20)) return 0;
    csv = std::move(*plain);
    bytes = csv;
  }
  absl::StatusOr<graphalloc::Trace> trace = graphalloc::ParseTrace(bytes, "fuzz.csv");
  if (!trace.ok()) {
    if (!absl::IsInvalidArgument(trace.status()))
      Fail("parse error is not InvalidArgument", trace.status().ToString());
    return 0;
  }
  const std::string printed = graphalloc::FormatTraceCsv(*trace);
  absl::StatusOr<graphalloc::Trace> again = graphalloc::ParseTrace(printed, "printed.csv");
  if (!again.ok()) Fail("FormatTraceCsv output does not parse", again.status().ToString());
  if (again->events.size() != trace->events.size()) Fail("round trip changed the event count", printed);
  for (std::size_t i = 0; i < trace->events.size(); ++i) {
    graphalloc::TraceEvent a = trace->events[i];
    graphalloc::TraceEvent b = again->events[i];
    a.line = b.line = 0;
    if (!(a == b)) Fail("round trip changed an event", trace->Where(i));
  }

  absl::StatusOr<graphalloc::TraceSummary> summary = graphalloc::SummarizeTrace(*trace);
  if (!summary.ok() || trace->events.size() > kMaxReplayEvents) return 0;
  graphalloc::CachingAllocator& allocator = Allocator();
  graphalloc::ReplayOptions options;
  options.check_invariants_every = 1;
  options.touch_memory = true;
  absl::StatusOr<graphalloc::ReplayResult> result = graphalloc::ReplayTrace(*trace, allocator, options);
  if (!result.ok()) Fail("replay of a well-formed trace failed", result.status().ToString());
  if (result->completed != !result->failure.has_value()) Fail("replay result is inconsistent", "");
  if (absl::Status s = allocator.EmptyCache(); !s.ok()) Fail("EmptyCache", s.ToString());
  if (absl::Status s = allocator.CheckInvariants(); !s.ok()) Fail("CheckInvariants", s.ToString());
  const graphalloc::DeviceStats stats = allocator.GetStats();
  if (stats.allocated_bytes.all().current != 0 || stats.reserved_bytes.all().current != 0) {
    Fail("replay left memory behind", stats.ToJson());
  }
  return 0;
}

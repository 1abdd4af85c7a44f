#include "graphalloc/allocator/history/history_ring.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/base/bytes.h"

namespace graphalloc {
namespace {

std::int64_t UnixNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The function, shared object and offset of a return address, each distinct address symbolized once.
class Symbolizer {
 public:
  const Frame& Symbolize(std::uintptr_t pc) {
    auto [it, inserted] = cache_.try_emplace(pc);
    if (!inserted) return it->second;
    Frame& frame = it->second;
    Dl_info info{};
    // A return address points after the call; pc - 1 lies inside the calling instruction.
    if (pc != 0 && dladdr(reinterpret_cast<void*>(pc - 1), &info) != 0) {
      if (info.dli_fname != nullptr) frame.file = info.dli_fname;
      if (info.dli_sname != nullptr) {
        int status = 0;
        char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
        frame.function = (status == 0 && demangled != nullptr) ? demangled : info.dli_sname;
        std::free(demangled);
      } else if (info.dli_fbase != nullptr) {
        frame.function = HexAddress(pc - reinterpret_cast<std::uintptr_t>(info.dli_fbase));
      }
    }
    if (frame.function.empty()) frame.function = HexAddress(pc);
    return frame;
  }

 private:
  absl::flat_hash_map<std::uintptr_t, Frame> cache_;
};

}  // namespace

HistoryRing::Page::Page(std::size_t slot_count, bool stacks)
    : slots(new Slot[slot_count]),
      frames(stacks ? new std::atomic<std::uintptr_t>[slot_count * kMaxHistoryFrames] : nullptr) {}

HistoryRing::Buffer::Buffer(std::size_t capacity_in, bool stacks_in)
    : capacity(capacity_in),
      mask(std::bit_ceil(capacity_in) - 1),
      page_shift(static_cast<std::size_t>(std::countr_zero(std::min(mask + 1, kHistoryPageSlots)))),
      page_mask((std::size_t{1} << page_shift) - 1),
      stacks(stacks_in),
      pages(new std::atomic<Page*>[(mask + 1) >> page_shift]) {
  for (std::size_t i = 0; i < (mask + 1) >> page_shift; ++i)
    pages[i].store(nullptr, std::memory_order_relaxed);
  if (stacks) {
    void* warm[2];
    backtrace(warm, 2);  // the first call loads the unwinder (and allocates): do it here, not in Record
  }
  origin_ticks = Now();
  origin_steady_ns = static_cast<std::int64_t>(SteadyNanos());
  origin_unix_ns = UnixNanos();
}

HistoryRing::Buffer::~Buffer() {
  for (std::size_t i = 0; i < (mask + 1) >> page_shift; ++i) delete pages[i].load(std::memory_order_acquire);
}

HistoryRing::Page* HistoryRing::Buffer::MakePage(std::size_t i) {
  Page* made = new Page(page_mask + 1, stacks);
  Page* expected = nullptr;
  if (!pages[i].compare_exchange_strong(expected, made, std::memory_order_acq_rel)) {
    delete made;  // another recorder made it first
    return expected;
  }
  pages_made.fetch_add(1, std::memory_order_relaxed);
  return made;
}

std::size_t HistoryRing::AllocatedSlots() const {
  MutexLock lock(&mu_);
  if (current_ == nullptr) return 0;
  return current_->pages_made.load(std::memory_order_relaxed) * (current_->page_mask + 1);
}

HistoryRing::~HistoryRing() = default;

std::uint64_t HistoryRing::SteadyNanos() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

void HistoryRing::CaptureStack(Page& page, std::size_t offset) {
  void* pcs[kMaxHistoryFrames + 1];
  const int n = backtrace(pcs, kMaxHistoryFrames + 1);
  // Frame 0 is this function; the caller of Record() (which is inline) comes next.
  const int depth = std::max(0, n - 1);
  std::atomic<std::uintptr_t>* out = &page.frames[offset * kMaxHistoryFrames];
  for (int i = 0; i < depth; ++i) {
    out[i].store(reinterpret_cast<std::uintptr_t>(pcs[i + 1]), std::memory_order_release);
  }
  page.slots[offset].depth.store(static_cast<std::uint8_t>(depth), std::memory_order_release);
}

absl::Status HistoryRing::RecordHistory(const HistoryOptions& options) {
  if (options.enabled && options.max_entries == 0) {
    return absl::InvalidArgumentError("history max_entries must be at least 1 when recording is enabled");
  }
  if (options.enabled && options.max_entries > kMaxHistoryEntries) {
    // Even grown page by page, a full ring that large is more memory than a process should spend on history
    // (and PyTorch's "unbounded" sys.maxsize is a mistake here): refused, saying the limit.
    return absl::InvalidArgumentError(absl::StrCat("history max_entries ", options.max_entries,
                                                   " exceeds the largest ring, ", kMaxHistoryEntries,
                                                   " events"));
  }
  MutexLock lock(&mu_);
  if (!options.enabled) {
    active_.store(nullptr, std::memory_order_release);
    options_.enabled = false;
    return absl::OkStatus();
  }
  if (current_ == nullptr || current_->capacity != options.max_entries ||
      current_->stacks != options.stacks) {
    buffers_.push_back(std::make_unique<Buffer>(options.max_entries, options.stacks));
    current_ = buffers_.back().get();
  }
  options_ = options;
  active_.store(current_, std::memory_order_release);
  return absl::OkStatus();
}

HistoryOptions HistoryRing::options() const {
  MutexLock lock(&mu_);
  return options_;
}

void HistoryRing::Clear() {
  MutexLock lock(&mu_);
  if (current_ != nullptr) current_->floor.store(current_->next.load(std::memory_order_acquire));
}

HistoryContents HistoryRing::Read() const {
  HistoryContents out;
  MutexLock lock(&mu_);
  const Buffer* buffer = current_;
  if (buffer == nullptr) return out;
  out.max_entries = buffer->capacity;
  const std::uint64_t end = buffer->next.load(std::memory_order_acquire);
  const std::uint64_t floor = std::min(end, buffer->floor.load(std::memory_order_acquire));
  out.recorded = end - floor;
  out.overflowed = out.recorded > buffer->capacity;
  const std::uint64_t begin = std::max(floor, end > buffer->capacity ? end - buffer->capacity : 0);

  // Ticks to Unix microseconds: the tick rate measured between the buffer's origin and now, over at least
  // 10 ms of steady time.
  std::uint64_t now_ticks = Now();
  std::int64_t now_steady = static_cast<std::int64_t>(SteadyNanos());
  while (now_steady - buffer->origin_steady_ns < 10'000'000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    now_ticks = Now();
    now_steady = static_cast<std::int64_t>(SteadyNanos());
  }
  const double ns_per_tick =
      static_cast<double>(now_steady - buffer->origin_steady_ns) /
      static_cast<double>(std::max<std::uint64_t>(1, now_ticks - buffer->origin_ticks));
  auto to_unix_us = [&](std::uint64_t ticks) {
    const double delta = static_cast<double>(static_cast<std::int64_t>(ticks - buffer->origin_ticks));
    return (buffer->origin_unix_ns + static_cast<std::int64_t>(delta * ns_per_tick)) / 1000;
  };

  Symbolizer symbolizer;
  out.events.reserve(static_cast<std::size_t>(end - begin));
  std::uintptr_t pcs[kMaxHistoryFrames];
  for (std::uint64_t t = begin; t < end; ++t) {
    const std::size_t index = static_cast<std::size_t>(t & buffer->mask);
    const Page* page = buffer->pages[index >> buffer->page_shift].load(std::memory_order_acquire);
    if (page == nullptr) {  // its first recorder is making it
      ++out.skipped;
      continue;
    }
    const std::size_t offset = index & buffer->page_mask;
    const Slot& slot = page->slots[offset];
    const std::uint64_t seq = slot.seq.load(std::memory_order_acquire);
    if (seq != 2 * t + 2) {
      ++out.skipped;
      continue;
    }
    HistoryEvent e;
    const std::uint8_t action = slot.action.load(std::memory_order_acquire);
    e.address = slot.address.load(std::memory_order_acquire);
    e.size = slot.size.load(std::memory_order_acquire);
    e.stream = slot.stream.load(std::memory_order_acquire);
    e.pool_id = slot.pool_id.load(std::memory_order_acquire);
    const std::uint64_t ticks = slot.ticks.load(std::memory_order_acquire);
    const std::uint32_t annotation = slot.annotation.load(std::memory_order_acquire);
    const int depth = std::min<int>(slot.depth.load(std::memory_order_acquire), kMaxHistoryFrames);
    for (int i = 0; buffer->stacks && i < depth; ++i) {
      pcs[i] = page->frames[offset * kMaxHistoryFrames + i].load(std::memory_order_acquire);
    }
    if (slot.seq.load(std::memory_order_relaxed) != seq || action >= kNumHistoryActions) {
      ++out.skipped;
      continue;
    }
    e.action = static_cast<HistoryAction>(action);
    e.time_us = to_unix_us(ticks);
    if (annotation != 0) e.annotation = AnnotationText(annotation);
    for (int i = 0; buffer->stacks && i < depth; ++i) e.frames.push_back(symbolizer.Symbolize(pcs[i]));
    out.events.push_back(std::move(e));
  }
  return out;
}

void HistoryRing::ExportTo(MemorySnapshot* snapshot) const {
  HistoryContents contents = Read();
  snapshot->history = std::move(contents.events);
  snapshot->history_overflowed = contents.overflowed || contents.skipped != 0;
  snapshot->history_max_entries = contents.max_entries;
}

}  // namespace graphalloc

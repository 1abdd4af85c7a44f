// Allocation history: a bounded ring of allocator events (alloc, free, segment map/unmap, oom, ...) that
// the caching allocator records on its hot path and a snapshot reads out (MemorySnapshot::history).
//
// Recording is lock-free: one atomic fetch_add takes a ticket, the ticket picks a slot of a ring of plain
// records (max_entries rounded up to a power of two, so no division), and a per-slot sequence number (a
// seqlock) lets a reader detect a slot being overwritten while it reads it. The ring grows as it fills: its
// slots come in pages of kHistoryPageSlots, each allocated by the first ticket that reaches it (one
// allocation per 4096 events while the ring fills, none once it has wrapped), so memory follows the events
// recorded, not max_entries (PyTorch users ask for sys.maxsize; 10^8 entries allocated whole took 7.35 GB and
// 28 s before the first allocation could run). No
// strings are formatted and no clock call is made at record time: the time is the CPU's timestamp counter,
// converted to microseconds when the history is read. Optionally each record keeps up to kMaxHistoryFrames
// return addresses (backtrace()), symbolized only when the history is read (dladdr + demangling, each
// distinct address once). A user annotation is an interned id (InternAnnotation / ScopedHistoryAnnotation),
// never a string copy.
//
// Thread-safe: any number of threads may Record() at once, also while another reads or reconfigures. The
// ring keeps the newest `max_entries` events; older ones are dropped and reported as overflow.
#ifndef GRAPHALLOC_ALLOCATOR_HISTORY_HISTORY_RING_H_
#define GRAPHALLOC_ALLOCATOR_HISTORY_HISTORY_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"

namespace graphalloc {

inline constexpr int kMaxHistoryFrames = 16;
// The largest ring RecordHistory accepts: 2^28 events, about 15 GB of slots once full (more with stacks).
// Config (history_max_entries), the CLI (--history-max), the C ABI and Python check it first.
inline constexpr std::size_t kMaxHistoryEntries = std::size_t{1} << 28;
// Slots per page of a ring (fewer in a ring that has fewer).
inline constexpr std::size_t kHistoryPageSlots = std::size_t{1} << 12;

struct HistoryOptions {
  bool enabled = false;
  std::size_t max_entries = 100000;  // events kept (the newest); must be >= 1 when enabled
  bool stacks = false;               // capture the C++ call stack of each event
  friend bool operator==(const HistoryOptions&, const HistoryOptions&) = default;
};

// ---- Annotations: a user string attached to the events a thread records (PyTorch's
// _set_memory_metadata). Process-wide; ids are stable for the life of the process.

// The id of `text` (0 for the empty string, which means "no annotation"), interning it on first use.
std::uint32_t InternAnnotation(absl::string_view text);
// The text of an id from InternAnnotation(); empty for 0 or an unknown id.
std::string AnnotationText(std::uint32_t id);

namespace history_internal {
extern constinit thread_local std::uint32_t current_annotation;
}  // namespace history_internal

// The annotation id the calling thread's events are recorded with (0: none).
inline std::uint32_t CurrentAnnotation() { return history_internal::current_annotation; }

// Sets the calling thread's annotation until it is set again ("" for none): PyTorch's
// _set_memory_metadata, which stays until the thread changes it, rather than a scope's.
inline void SetThreadAnnotation(absl::string_view text) {
  history_internal::current_annotation = InternAnnotation(text);
}

// Sets the calling thread's annotation for its lifetime, restoring the previous one after.
class ScopedHistoryAnnotation {
 public:
  explicit ScopedHistoryAnnotation(absl::string_view text) : previous_(history_internal::current_annotation) {
    history_internal::current_annotation = InternAnnotation(text);
  }
  ~ScopedHistoryAnnotation() { history_internal::current_annotation = previous_; }
  ScopedHistoryAnnotation(const ScopedHistoryAnnotation&) = delete;
  ScopedHistoryAnnotation& operator=(const ScopedHistoryAnnotation&) = delete;

 private:
  std::uint32_t previous_;
};

// What HistoryRing::Read() returns.
struct HistoryContents {
  std::vector<HistoryEvent> events;  // oldest first
  bool overflowed = false;           // events were dropped because the ring was full
  std::size_t max_entries = 0;       // the ring's capacity (0 when history was never enabled)
  std::uint64_t recorded = 0;        // events recorded into this ring since it was (re)made
  std::uint64_t skipped = 0;         // slots being written, or overwritten, while they were read
};

class HistoryRing {
 public:
  HistoryRing() = default;  // disabled until RecordHistory()
  ~HistoryRing();
  HistoryRing(const HistoryRing&) = delete;
  HistoryRing& operator=(const HistoryRing&) = delete;

  // Turns recording on or off. Disabling keeps what was recorded (a later Read() still returns it) and
  // re-enabling with the same max_entries and stacks continues it; a different max_entries or stacks
  // starts an empty history. InvalidArgument for max_entries 0 while enabled. Each buffer replaced by a
  // resize stays allocated until the ring is destroyed (a recorder may still be writing into it), so
  // resizing is meant to be rare.
  absl::Status RecordHistory(const HistoryOptions& options);
  HistoryOptions options() const;
  bool enabled() const { return active_.load(std::memory_order_relaxed) != nullptr; }

  // Records one event when enabled; a no-op (one atomic load) when not. Safe from any thread, with any
  // lock held: it never blocks or calls into the driver, and allocates only the first time a ticket
  // reaches a page of the ring (kHistoryPageSlots events). For kOom pass the device's free
  // bytes as `address` and the failed request as `size`; for kSnapshot address 0.
  void Record(HistoryAction action, std::uint64_t address, std::uint64_t size, std::uint64_t stream,
              std::uint64_t pool_id, std::uint32_t annotation = CurrentAnnotation()) {
    Buffer* buffer = active_.load(std::memory_order_acquire);
    if (buffer == nullptr) return;
    const std::uint64_t ticket = buffer->next.fetch_add(1, std::memory_order_relaxed);
    const std::size_t index = static_cast<std::size_t>(ticket & buffer->mask);
    Page* page = buffer->pages[index >> buffer->page_shift].load(std::memory_order_acquire);
    if (page == nullptr) [[unlikely]]
      page = buffer->MakePage(index >> buffer->page_shift);
    const std::size_t offset = index & buffer->page_mask;
    Slot& slot = page->slots[offset];
    // Writers of one slot are mask + 1 tickets apart, so they meet only when one was delayed that long
    // (preempted while the others lapped the ring). A writer claims the slot by moving its sequence number
    // from even (complete) to its own odd one; a newer ticket wins, and an older writer arriving late drops
    // its event (the ring keeps the newest), so a delayed writer never overwrites a newer event.
    std::uint64_t seen = slot.seq.load(std::memory_order_relaxed);
    for (;;) {
      if (seen >= 2 * ticket + 1) return;  // a newer ticket holds the slot or is writing it
      if (seen % 2 == 1) {                 // an older writer is mid-write: let it finish first
        std::this_thread::yield();
        seen = slot.seq.load(std::memory_order_relaxed);
        continue;
      }
      if (slot.seq.compare_exchange_weak(seen, 2 * ticket + 1, std::memory_order_relaxed)) break;
    }
    // A seqlock without fences (ThreadSanitizer does not model them): the release stores keep the odd
    // sequence number ahead of the data, and a reader's acquire loads of the data keep its second
    // sequence load behind them. On x86 every one of these is a plain move.
    slot.address.store(address, std::memory_order_release);
    slot.size.store(size, std::memory_order_release);
    slot.stream.store(stream, std::memory_order_release);
    slot.pool_id.store(pool_id, std::memory_order_release);
    slot.ticks.store(Now(), std::memory_order_release);
    slot.annotation.store(annotation, std::memory_order_release);
    slot.action.store(static_cast<std::uint8_t>(action), std::memory_order_release);
    if (buffer->stacks) {
      CaptureStack(*page, offset);
    } else {
      slot.depth.store(0, std::memory_order_release);
    }
    slot.seq.store(2 * ticket + 2, std::memory_order_release);
  }

  // The recorded events, oldest first, with times in microseconds since the Unix epoch, annotations as
  // text and stacks symbolized. Safe while others record (slots overwritten meanwhile are skipped).
  HistoryContents Read() const;

  // Read() into snapshot->history, history_overflowed and history_max_entries.
  void ExportTo(MemorySnapshot* snapshot) const;

  // Drops every recorded event (the options and the buffer stay).
  void Clear();

  // Slots allocated for the current ring so far (memory follows the events recorded, not max_entries).
  std::size_t AllocatedSlots() const;

 private:
  // One event. Every field is atomic so that a concurrent reader is well defined (on x86 these accesses
  // compile to plain moves); `seq` is 0 for a never-written slot, 2t+1 while ticket t writes it and 2t+2
  // once ticket t's event is complete.
  struct Slot {
    std::atomic<std::uint64_t> seq{0};
    std::atomic<std::uint64_t> address{0};
    std::atomic<std::uint64_t> size{0};
    std::atomic<std::uint64_t> stream{0};
    std::atomic<std::uint64_t> pool_id{0};
    std::atomic<std::uint64_t> ticks{0};
    std::atomic<std::uint32_t> annotation{0};
    std::atomic<std::uint8_t> action{0};
    std::atomic<std::uint8_t> depth{0};
  };
  // A page of slots, and their frames when stacks are recorded (slots * kMaxHistoryFrames).
  struct Page {
    Page(std::size_t slots, bool stacks);
    std::unique_ptr<Slot[]> slots;
    std::unique_ptr<std::atomic<std::uintptr_t>[]> frames;
  };
  struct Buffer {
    Buffer(std::size_t capacity, bool stacks);
    ~Buffer();
    // Page `i`, made now unless another recorder made it first.
    Page* MakePage(std::size_t i);
    const std::size_t capacity;    // max_entries: the newest `capacity` events are kept
    const std::size_t mask;        // slots - 1; the slot count is capacity rounded up to a power of two
    const std::size_t page_shift;  // log2 of the slots per page
    const std::size_t page_mask;   // slots per page - 1
    const bool stacks;
    std::unique_ptr<std::atomic<Page*>[]> pages;  // (mask + 1) >> page_shift of them, null until reached
    std::atomic<std::size_t> pages_made{0};
    std::uint64_t origin_ticks;                      // Now() when made
    std::int64_t origin_steady_ns;                   // steady clock at the same moment
    std::int64_t origin_unix_ns;                     // wall clock at the same moment
    std::atomic<std::uint64_t> floor{0};             // tickets below it were cleared
    alignas(64) std::atomic<std::uint64_t> next{0};  // the next ticket
  };

  static std::uint64_t Now() {
#if defined(__x86_64__) || defined(__i386__)
    // The compiler's builtin, not <x86intrin.h>'s __rdtsc(): that header brings every x86 intrinsic (60,000
    // lines) into each file that includes the allocator's facade, about a second of parsing per file.
    return __builtin_ia32_rdtsc();
#else
    return SteadyNanos();
#endif
  }
  static std::uint64_t SteadyNanos();
  // Stores the caller's return addresses into the frames of the page's slot `offset` (out of line:
  // backtrace() is slow).
  __attribute__((noinline)) static void CaptureStack(Page& page, std::size_t offset);

  mutable Mutex mu_;                                // serializes configuration changes and reads
  std::atomic<Buffer*> active_{nullptr};            // the buffer being recorded into; null when disabled
  Buffer* current_ ABSL_GUARDED_BY(mu_) = nullptr;  // the newest buffer, also when disabled
  HistoryOptions options_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Buffer>> buffers_ ABSL_GUARDED_BY(mu_);  // current_ and the retired ones
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_HISTORY_HISTORY_RING_H_

// libFuzzer target: the C ABI (graphalloc.h) driven by a byte stream of operations on the simulated device
// (GRAPHALLOC_DEVICE=sim, 4 GiB devices): malloc, free, record_stream, empty_cache, stats_json,
// set_memory_fraction, the stats resets and private pools (create, retain, release, routes by thread and
// stream, pins, stats, cache), with sizes from 0 to SIZE_MAX, devices in and out of range, streams real and
// bogus, and pointers live, freed, interior or random. The harness keeps its own map of live blocks and
// checks every return code against it: a call succeeds exactly when it should, a failure returns a documented
// code with a message, blocks never overlap, their contents survive, and nothing crashes.
//
// The default allocators are process-wide and outlive each input: every input ends by freeing what it
// allocated and restoring the memory fraction, so inputs stay independent. The harness creates no stream,
// so on the simulated device only stream 0 exists: record_stream on any other stream must be refused, and
// every live block must free.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "graphalloc/allocator/c_api/graphalloc.h"

namespace {

[[noreturn]] void Fail(const char* what, long long a = 0, long long b = 0) {
  std::fprintf(stderr, "c_api_fuzzer: %s (%lld, %lld); last error: %s\n", what, a, b,
               graphalloc_last_error());
  std::abort();
}

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool Done() const { return pos_ >= size_; }
  std::uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint64_t U64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | Byte();
    return v;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

struct Block {
  std::size_t size = 0;
  int device = 0;
  std::uintptr_t stream = 0;
  std::uint64_t tag = 0;
};

// Live blocks by address (addresses are unique across devices: each simulated device maps its own ranges).
std::map<std::uintptr_t, Block>& Live() {
  static auto* live = new std::map<std::uintptr_t, Block>();
  return *live;
}
std::uint64_t next_tag = 1;

bool ValidDevice(int device) { return device >= 0 && device < 64; }

int PickDevice(Input& in) {
  static constexpr int kDevices[] = {
      0, 0, 0, 0, 1, 1, 2, -1, 64, 65, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(), 63};
  return kDevices[in.Byte() % std::size(kDevices)];
}

std::size_t PickSize(Input& in) {
  const std::uint8_t kind = in.Byte() % 16;
  const std::uint64_t r = in.Byte() | (std::uint64_t{in.Byte()} << 8) | (std::uint64_t{in.Byte()} << 16);
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  switch (kind) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return 511 + r % 3;
    case 3:
    case 4:
    case 5:
      return 1 + r % (1 << 20);  // small pool and just above
    case 6:
    case 7:
      return (std::size_t{1} << 20) + r * 4;  // large: 1 to 64 MiB
    case 8:
      return (r % 64 + 1) << 20;  // whole MiB
    case 9:
      return std::size_t{1} << 40;  // 1 TiB: more than the device
    case 10:
      return (std::size_t{1} << 60) + (r % 2);  // 1 EiB, the limit, and one past it
    case 11:
      return kMax - r % 1024;  // overflows any rounding
    case 12:
      return (std::size_t{1} << 60) - 1 - r % 4096;  // just under the limit
    default:
      return 1 + r % 4096;
  }
}

graphalloc_stream PickStream(Input& in) {
  const std::uint8_t kind = in.Byte() % 8;
  std::uintptr_t s = 0;
  if (kind == 5) s = 1;  // CUDA's legacy and per-thread default stream handles
  if (kind == 6) s = 2;
  if (kind == 7) s = static_cast<std::uintptr_t>(in.U64());
  return reinterpret_cast<graphalloc_stream>(s);
}

void CheckCode(int code, const char* call) {
  if (code < GRAPHALLOC_OK || code > GRAPHALLOC_INTERNAL) Fail(call, code);
  const bool has_message = graphalloc_last_error()[0] != '\0';
  if (code == GRAPHALLOC_INTERNAL) Fail("internal error", code);
  if ((code != GRAPHALLOC_OK) != has_message) Fail("message does not match the code", code);
}

template <typename Map, typename SizeOf>
bool OverlapsIn(const Map& m, std::uintptr_t p, std::uintptr_t end, SizeOf size_of) {
  auto it = m.upper_bound(p);
  if (it != m.end() && it->first < end) return true;
  if (it == m.begin()) return false;
  --it;
  return it->first + std::max<std::size_t>(size_of(it->second), 1) > p;
}

bool Overlaps(std::uintptr_t p, std::size_t size) {
  const std::uintptr_t end = p + size;
  return OverlapsIn(Live(), p, end, [](const Block& b) { return b.size; });
}

// The first 8 bytes of a block (all of it when smaller) carry its tag, and so do its last 8 bytes when
// the block has 16 or more.
void WriteTag(std::uintptr_t p, const Block& b) {
  std::memcpy(reinterpret_cast<void*>(p), &b.tag, std::min<std::size_t>(b.size, 8));
  if (b.size >= 16) std::memcpy(reinterpret_cast<void*>(p + b.size - 8), &b.tag, 8);
}
void CheckTag(std::uintptr_t p, const Block& b) {
  const bool head = std::memcmp(reinterpret_cast<void*>(p), &b.tag, std::min<std::size_t>(b.size, 8)) == 0;
  const bool tail = b.size < 16 || std::memcmp(reinterpret_cast<void*>(p + b.size - 8), &b.tag, 8) == 0;
  if (!head || !tail)
    Fail("block contents changed", static_cast<long long>(p), static_cast<long long>(b.size));
}

void Malloc(Input& in, bool torch) {
  const std::size_t size = PickSize(in);
  const int device = PickDevice(in);
  const graphalloc_stream stream = PickStream(in);
  void* ptr = reinterpret_cast<void*>(1);
  int code;
  if (torch) {
    ptr = graphalloc_torch_malloc(size, device, stream);
    code = graphalloc_last_error()[0] == '\0' ? GRAPHALLOC_OK : GRAPHALLOC_OUT_OF_MEMORY;
    if (code != GRAPHALLOC_OK) {
      if (ptr != nullptr) Fail("failed torch_malloc returned a pointer");
      return;
    }
  } else {
    code = graphalloc_malloc(&ptr, size, device, stream);
    CheckCode(code, "graphalloc_malloc");
  }
  if (code != GRAPHALLOC_OK) {
    if (ptr != nullptr) Fail("failed malloc left *ptr set", code);
    if (!ValidDevice(device) && code != GRAPHALLOC_INVALID_ARGUMENT) Fail("bad device not refused", device);
    if (ValidDevice(device) && code != GRAPHALLOC_OUT_OF_MEMORY) Fail("malloc failed but not OOM", code);
    return;
  }
  if (!ValidDevice(device)) Fail("malloc on a bad device succeeded", device);
  if (size == 0) {
    if (ptr != nullptr) Fail("zero-byte malloc returned non-NULL");
    return;
  }
  if (size > (std::size_t{1} << 60)) Fail("malloc of more than 1 EiB succeeded");
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  if (p == 0 || p % 512 != 0) Fail("bad address", static_cast<long long>(p));
  if (Overlaps(p, size))
    Fail("new block overlaps a live one", static_cast<long long>(p), static_cast<long long>(size));
  Block b{size, device, reinterpret_cast<std::uintptr_t>(stream), next_tag++};
  WriteTag(p, b);
  Live().emplace(p, b);
}

void FreeLive(std::uintptr_t p, bool torch) {
  auto it = Live().find(p);
  const Block b = it->second;
  CheckTag(p, b);
  if (torch) {
    graphalloc_torch_free(reinterpret_cast<void*>(p), b.size, b.device,
                          reinterpret_cast<graphalloc_stream>(b.stream));
    if (graphalloc_last_error()[0] != '\0') Fail("torch_free of a live block failed");
    Live().erase(it);
    return;
  }
  const int code = graphalloc_free(reinterpret_cast<void*>(p), b.device);
  CheckCode(code, "graphalloc_free");
  if (code != GRAPHALLOC_OK) Fail("free of a live block failed", code);
  Live().erase(it);
}

std::uintptr_t PickLive(Input& in) {
  if (Live().empty()) return 0;
  auto it = Live().begin();
  std::advance(it, in.Byte() % Live().size());
  return it->first;
}

// A pointer the allocator did not hand out on `device`, or a live one (the expectation follows).
std::uintptr_t PickAnyPointer(Input& in) {
  const std::uintptr_t live = PickLive(in);
  switch (in.Byte() % 6) {
    case 0:
      return live;
    case 1:
      return live + 1 + in.Byte();  // interior (or a small bogus value)
    case 2:
      return live == 0 ? 0 : live - 512;  // the block before, maybe
    case 3:
      return static_cast<std::uintptr_t>(in.U64());
    case 4:
      return live == 0 ? 0 : live + 512 * (1 + in.Byte() % 8);  // a neighbour, maybe live
    default:
      return 0;
  }
}

void Free(Input& in) {
  const std::uintptr_t p = PickAnyPointer(in);
  int device = PickDevice(in);
  auto it = Live().find(p);
  if (it != Live().end() && device == it->second.device) return FreeLive(p, in.Byte() % 4 == 0);
  const int code = graphalloc_free(reinterpret_cast<void*>(p), device);
  CheckCode(code, "graphalloc_free");
  if (p == 0) {
    if (code != GRAPHALLOC_OK) Fail("free(NULL) failed", code);
    return;
  }
  // Not live on `device`.
  if (code != GRAPHALLOC_INVALID_ARGUMENT)
    Fail("free of a pointer not live on that device did not fail", code);
}

void RecordStream(Input& in) {
  const std::uintptr_t p = PickAnyPointer(in);
  const int device = PickDevice(in);
  const graphalloc_stream stream = PickStream(in);
  const int code = graphalloc_record_stream(reinterpret_cast<void*>(p), device, stream);
  CheckCode(code, "graphalloc_record_stream");
  auto it = Live().find(p);
  if (it == Live().end() || it->second.device != device) {
    if (code != GRAPHALLOC_INVALID_ARGUMENT)
      Fail("record_stream of a pointer not live there did not fail", code);
    return;
  }
  // Stream 0 exists, and the block's own stream needs no event; any other stream is unknown to the
  // device and must be refused, leaving the block as it was (its next free must succeed).
  const auto s = reinterpret_cast<std::uintptr_t>(stream);
  const bool accept = s == 0 || s == it->second.stream;
  if (accept && code != GRAPHALLOC_OK) Fail("record_stream on a real stream failed", code);
  if (!accept && code != GRAPHALLOC_INVALID_ARGUMENT)
    Fail("record_stream on an unknown stream not refused", code);
}

void EmptyCache(Input& in) {
  const int device = PickDevice(in);
  const int code = graphalloc_empty_cache(device);
  CheckCode(code, "graphalloc_empty_cache");
  if ((code == GRAPHALLOC_OK) != ValidDevice(device)) Fail("empty_cache", code, device);
}

void SetFraction(Input& in) {
  static constexpr double kFractions[] = {1.0,
                                          1.0,
                                          0.5,
                                          0.01,
                                          0.0,
                                          -0.0,
                                          -1.0,
                                          1.0000001,
                                          2.0,
                                          std::numeric_limits<double>::quiet_NaN(),
                                          std::numeric_limits<double>::infinity(),
                                          std::numeric_limits<double>::denorm_min()};
  const double fraction = kFractions[in.Byte() % std::size(kFractions)];
  const int device = PickDevice(in);
  const int code = graphalloc_set_memory_fraction(fraction, device);
  CheckCode(code, "graphalloc_set_memory_fraction");
  const bool valid = ValidDevice(device) && fraction >= 0.0 && fraction <= 1.0;
  if ((code == GRAPHALLOC_OK) != valid) Fail("set_memory_fraction", code, device);
}

void StatsJson(Input& in) {
  const int device = PickDevice(in);
  const std::uint8_t kind = in.Byte() % 5;
  std::size_t required = 0;
  std::vector<char> buffer(kind == 4 ? 1 << 16 : kind == 3 ? 16 : 1, 'Z');
  char* buf = kind == 0 ? nullptr : buffer.data();
  std::size_t size = kind == 0 || kind == 1 ? 0 : buffer.size();
  if (kind == 2) {
    // Ask for the size first, then pass exactly that.
    const int probe = graphalloc_stats_json(device, nullptr, 0, &required);
    CheckCode(probe, "graphalloc_stats_json");
    if (probe == GRAPHALLOC_INVALID_ARGUMENT) {
      if (ValidDevice(device)) Fail("stats_json on a valid device", probe);
      return;
    }
    if (probe != GRAPHALLOC_BUFFER_TOO_SMALL || required < 3) Fail("stats_json probe", probe);
    buffer.assign(required, 'Z');
    buf = buffer.data();
    size = required;
  }
  required = 0;
  const int code = graphalloc_stats_json(device, buf, size, in.Byte() % 4 == 0 ? nullptr : &required);
  CheckCode(code, "graphalloc_stats_json");
  if (!ValidDevice(device)) {
    if (code != GRAPHALLOC_INVALID_ARGUMENT) Fail("stats_json on a bad device", code, device);
    return;
  }
  if (code == GRAPHALLOC_BUFFER_TOO_SMALL) {
    for (char c : buffer) {
      if (c != 'Z') Fail("stats_json wrote into a buffer too small");
    }
    return;
  }
  if (code != GRAPHALLOC_OK) Fail("stats_json", code);
  const std::size_t len = strnlen(buf, size);
  if (len == size || len < 2 || buf[0] != '{' || buf[len - 1] != '}')
    Fail("stats_json output", static_cast<long long>(len));
  if (required != 0 && required != len + 1) Fail("stats_json required", static_cast<long long>(required));
}

void ResetStats(Input& in) {
  const int device = PickDevice(in);
  const int code =
      in.Byte() % 2 ? graphalloc_reset_peak_stats(device) : graphalloc_reset_accumulated_stats(device);
  CheckCode(code, "graphalloc_reset_*_stats");
  if ((code == GRAPHALLOC_OK) != ValidDevice(device)) Fail("reset stats", code, device);
}

// ---- Private pools: the harness's model holds the references, routes and pins it took. ----

struct ModelPool {
  int device = 0;
  std::uint64_t id = 0;
  int references = 0;  // taken through graphalloc_pool_create / graphalloc_pool_retain, not yet released
};
std::vector<ModelPool>& Pools() {
  static auto* pools = new std::vector<ModelPool>();
  return *pools;
}
std::vector<std::uint64_t>& Routes() {  // open routes, innermost last
  static auto* routes = new std::vector<std::uint64_t>();
  return *routes;
}
std::vector<std::uint64_t>& Pins() {
  static auto* pins = new std::vector<std::uint64_t>();
  return *pins;
}

// Ids no pool, route or pin ever gets in a fuzzing run (they count from 1).
std::uint64_t BogusId(Input& in) { return (std::uint64_t{1} << 40) + in.Byte(); }

// A pool the model holds a reference to, or nullptr.
ModelPool* PickPool(Input& in) {
  if (Pools().empty()) return nullptr;
  return &Pools()[in.Byte() % Pools().size()];
}

void PoolCreate(Input& in) {
  const int device = PickDevice(in);
  graphalloc_pool_options options{in.Byte() % 2, in.Byte() % 2, in.Byte() % 2};
  std::uint64_t pool = 7;
  const int code = graphalloc_pool_create(device, in.Byte() % 4 == 0 ? nullptr : &options, &pool);
  CheckCode(code, "graphalloc_pool_create");
  if ((code == GRAPHALLOC_OK) != ValidDevice(device)) Fail("pool_create", code, device);
  if (code != GRAPHALLOC_OK) {
    if (pool != 0) Fail("failed pool_create left *pool set");
    return;
  }
  if (pool == 0) Fail("pool_create returned the default pool");
  Pools().push_back(ModelPool{device, pool, 1});
}

void PoolReference(Input& in) {
  ModelPool* pool = PickPool(in);
  const bool retain = in.Byte() % 2 == 0;
  if (pool == nullptr || in.Byte() % 4 == 0) {  // a pool that does not exist
    const std::uint64_t bogus = BogusId(in);
    const int code = retain ? graphalloc_pool_retain(0, bogus) : graphalloc_pool_release(0, bogus);
    CheckCode(code, "graphalloc_pool_retain/release");
    if (code != GRAPHALLOC_INVALID_ARGUMENT) Fail("retain/release of a bogus pool", code);
    return;
  }
  const int code = retain ? graphalloc_pool_retain(pool->device, pool->id)
                          : graphalloc_pool_release(pool->device, pool->id);
  CheckCode(code, "graphalloc_pool_retain/release");
  if (code != GRAPHALLOC_OK) Fail("retain/release of a held pool", code);
  pool->references += retain ? 1 : -1;
  if (pool->references == 0) Pools().erase(Pools().begin() + (pool - Pools().data()));
}

void PoolRoute(Input& in) {
  if (!Routes().empty() && in.Byte() % 2 == 0) {  // end the innermost route, or a bogus one
    const bool bogus = in.Byte() % 4 == 0;
    const std::uint64_t route = bogus ? BogusId(in) : Routes().back();
    const int code = graphalloc_end_route(route);
    CheckCode(code, "graphalloc_end_route");
    if (code != (bogus ? GRAPHALLOC_INVALID_ARGUMENT : GRAPHALLOC_OK)) Fail("end_route", code);
    if (!bogus) Routes().pop_back();
    return;
  }
  ModelPool* pool = PickPool(in);
  std::uint64_t route = 0;
  int code;
  const graphalloc_stream stream = PickStream(in);
  if (pool == nullptr) {
    code = graphalloc_begin_allocate_to_pool_for_thread(0, BogusId(in), &route);
    CheckCode(code, "graphalloc_begin_allocate_to_pool_for_thread");
    if (code != GRAPHALLOC_INVALID_ARGUMENT) Fail("route to a bogus pool", code);
    return;
  }
  code = in.Byte() % 2 ? graphalloc_begin_allocate_to_pool_for_thread(pool->device, pool->id, &route)
                       : graphalloc_begin_allocate_to_pool_for_stream(pool->device, pool->id, stream, &route);
  CheckCode(code, "graphalloc_begin_allocate_to_pool_*");
  if (code != GRAPHALLOC_OK || route == 0) Fail("route to a held pool", code);
  Routes().push_back(route);
}

void PoolPinStatsCache(Input& in) {
  ModelPool* pool = PickPool(in);
  const std::uint8_t kind = in.Byte() % 4;
  if (kind == 0 && !Pins().empty()) {
    const int code = graphalloc_pool_unpin(Pins().back());
    CheckCode(code, "graphalloc_pool_unpin");
    if (code != GRAPHALLOC_OK) Fail("unpin of a held pin", code);
    Pins().pop_back();
    return;
  }
  if (pool == nullptr) {
    graphalloc_pool_stats stats;
    const int code = graphalloc_pool_get_stats(0, BogusId(in), &stats);
    CheckCode(code, "graphalloc_pool_get_stats");
    if (code != GRAPHALLOC_INVALID_ARGUMENT) Fail("stats of a bogus pool", code);
    return;
  }
  if (kind == 1) {
    std::uint64_t pin = 0;
    const int code = graphalloc_pool_pin_for_graph(pool->device, pool->id, &pin);
    CheckCode(code, "graphalloc_pool_pin_for_graph");
    if (code != GRAPHALLOC_OK || pin == 0) Fail("pin of a held pool", code);
    Pins().push_back(pin);
  } else if (kind == 2) {
    const int code = graphalloc_pool_empty_cache(pool->device, pool->id);
    CheckCode(code, "graphalloc_pool_empty_cache");
    if (code != GRAPHALLOC_OK) Fail("empty_cache of a held pool", code);
  } else {
    graphalloc_pool_stats stats;
    const int code = graphalloc_pool_get_stats(pool->device, pool->id, &stats);
    CheckCode(code, "graphalloc_pool_get_stats");
    if (code != GRAPHALLOC_OK) Fail("stats of a held pool", code);
    if (stats.use_count < pool->references) Fail("use_count below the references held", stats.use_count);
    if (stats.allocated_bytes > stats.reserved_bytes) Fail("pool allocated more than it reserved");
  }
}

// Routes, pins and references go before the input ends (blocks still in their pools go with the frees).
void ReleasePools() {
  while (!Routes().empty()) {
    if (graphalloc_end_route(Routes().back()) != GRAPHALLOC_OK) Fail("ending a route");
    Routes().pop_back();
  }
  for (std::uint64_t pin : Pins()) {
    if (graphalloc_pool_unpin(pin) != GRAPHALLOC_OK) Fail("unpinning");
  }
  Pins().clear();
  for (const ModelPool& pool : Pools()) {
    for (int i = 0; i < pool.references; ++i) {
      if (graphalloc_pool_release(pool.device, pool.id) != GRAPHALLOC_OK) Fail("releasing a pool");
    }
  }
  Pools().clear();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  setenv("GRAPHALLOC_DEVICE", "sim", 1);
  // 4 GiB devices instead of 80: every out-of-memory retry and empty_cache releases an expandable
  // segment's reservation of the device's size, recorded 2 MiB granule by 2 MiB granule (address_owners.h),
  // which took most of each input's time. With 4 GiB the harness ran 93 inputs a second instead of 40 and
  // reached 6,593-6,736 edges in 40 s instead of 6,360 (ASan+UBSan, one core); requests of a few MiB now
  // reach the device's limit too.
  setenv("GRAPHALLOC_SIM_MEMORY_MB", "4096", 1);
  unsetenv("GRAPHALLOC_CONF");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  for (int op = 0; op < 256 && !in.Done(); ++op) {
    switch (in.Byte() % 16) {
      case 0:
      case 1:
      case 2:
        Malloc(in, /*torch=*/false);
        break;
      case 3:
        Malloc(in, /*torch=*/true);
        break;
      case 4:
      case 5: {
        const std::uintptr_t p = PickLive(in);
        if (p != 0) FreeLive(p, in.Byte() % 4 == 0);
        break;
      }
      case 6:
        Free(in);
        break;
      case 7:
        RecordStream(in);
        break;
      case 8:
        EmptyCache(in);
        break;
      case 9:
        SetFraction(in);
        break;
      case 10:
        StatsJson(in);
        break;
      case 11:
        ResetStats(in);
        break;
      case 12:
        PoolCreate(in);
        break;
      case 13:
        PoolReference(in);
        break;
      case 14:
        PoolRoute(in);
        break;
      default:
        PoolPinStatsCache(in);
        break;
    }
  }
  // Leave the process as the next input expects it: no pool held, nothing live, no cap.
  ReleasePools();
  while (!Live().empty()) {
    const std::uintptr_t p = Live().begin()->first;
    FreeLive(p, false);
  }
  for (int device : {0, 1, 2, 63}) {
    if (graphalloc_set_memory_fraction(1.0, device) != GRAPHALLOC_OK) Fail("restoring the fraction", device);
  }
  return 0;
}

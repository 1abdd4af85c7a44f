// The C ABI: translates each call to the default allocator of its device, Status to a code, and keeps
// the message for graphalloc_last_error(). Nothing may escape as an exception.
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/c_api/c_api_internal.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/core/default_allocator.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"

namespace graphalloc {
namespace c_api {
namespace {

thread_local std::string last_error;

int Code(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return GRAPHALLOC_OK;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
      return GRAPHALLOC_INVALID_ARGUMENT;
    case absl::StatusCode::kResourceExhausted:
      return GRAPHALLOC_OUT_OF_MEMORY;
    case absl::StatusCode::kUnavailable:
      return GRAPHALLOC_UNAVAILABLE;
    case absl::StatusCode::kFailedPrecondition:
      return GRAPHALLOC_FAILED_PRECONDITION;
    default:
      return GRAPHALLOC_INTERNAL;
  }
}

}  // namespace

std::string& LastError() { return last_error; }

int Report(const absl::Status& status) {
  last_error = status.ok() ? std::string() : std::string(status.message());
  return Code(status);
}

}  // namespace c_api

namespace {

using c_api::Guarded;

DevicePtr ToDevice(const void* ptr) { return reinterpret_cast<DevicePtr>(ptr); }

// JSON from `produce(allocator)` into a caller's buffer: *required gets the size with the NUL; a buffer that
// is too small gets nothing and GRAPHALLOC_BUFFER_TOO_SMALL.
template <typename Produce>
int WriteJson(const char* name, int device, char* buffer, size_t buffer_size, size_t* required,
              Produce produce) {
  bool too_small = false;
  int code = Guarded([&]() -> absl::Status {
    absl::StatusOr<CachingAllocator*> allocator = DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    const std::string json = produce(**allocator);
    if (required != nullptr) *required = json.size() + 1;
    if (buffer == nullptr || buffer_size < json.size() + 1) {
      too_small = true;
      return absl::OutOfRangeError(absl::StrCat(name, ": buffer of ", buffer_size, " bytes is too small; ",
                                                json.size() + 1, " needed"));
    }
    std::memcpy(buffer, json.c_str(), json.size() + 1);
    return absl::OkStatus();
  });
  return too_small ? GRAPHALLOC_BUFFER_TOO_SMALL : code;
}
Stream ToStream(graphalloc_stream stream) { return StreamFromNative(stream); }

}  // namespace
}  // namespace graphalloc

using graphalloc::DefaultAllocator;
using graphalloc::c_api::Guarded;

extern "C" {

int graphalloc_malloc(void** ptr, size_t size, int device, graphalloc_stream stream) {
  return Guarded([&]() -> absl::Status {
    if (ptr == nullptr) return absl::InvalidArgumentError("graphalloc_malloc: ptr (the output) is NULL");
    *ptr = nullptr;
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    absl::StatusOr<graphalloc::DevicePtr> p = (*allocator)->Allocate(size, graphalloc::ToStream(stream));
    if (!p.ok()) return p.status();
    *ptr = reinterpret_cast<void*>(*p);
    return absl::OkStatus();
  });
}

int graphalloc_free(void* ptr, int device) {
  return Guarded([&]() -> absl::Status {
    if (ptr == nullptr) return absl::OkStatus();
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    return (*allocator)->Free(graphalloc::ToDevice(ptr));
  });
}

void* graphalloc_torch_malloc(size_t size, int device, graphalloc_stream stream) {
  void* ptr = nullptr;
  graphalloc_malloc(&ptr, size, device, stream);
  return ptr;
}

void graphalloc_torch_free(void* ptr, size_t /*size*/, int device, graphalloc_stream /*stream*/) {
  if (graphalloc_free(ptr, device) != GRAPHALLOC_OK) {
    std::fprintf(stderr, "graphalloc: %s\n", graphalloc::c_api::LastError().c_str());
  }
}

int graphalloc_record_stream(void* ptr, int device, graphalloc_stream stream) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    return (*allocator)->RecordStream(graphalloc::ToDevice(ptr), graphalloc::ToStream(stream));
  });
}

int graphalloc_empty_cache(int device) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    return (*allocator)->EmptyCache();
  });
}

int graphalloc_set_memory_fraction(double fraction, int device) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    return (*allocator)->SetMemoryFraction(fraction);
  });
}

int graphalloc_stats_json(int device, char* buffer, size_t buffer_size, size_t* required) {
  return graphalloc::WriteJson("graphalloc_stats_json", device, buffer, buffer_size, required,
                               [](graphalloc::CachingAllocator& a) { return a.GetStats().ToJson(); });
}

int graphalloc_snapshot_json(int device, char* buffer, size_t buffer_size, size_t* required) {
  return graphalloc::WriteJson(
      "graphalloc_snapshot_json", device, buffer, buffer_size, required, [](graphalloc::CachingAllocator& a) {
        return graphalloc::SnapshotToJson(a.TakeSnapshot("graphalloc_snapshot_json"));
      });
}

int graphalloc_record_history(int device, int enabled, size_t max_entries, int stacks) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    return (*allocator)->RecordHistory(graphalloc::HistoryOptions{enabled != 0, max_entries, stacks != 0});
  });
}

void graphalloc_torch_record_stream(void* ptr, graphalloc_stream stream) {
  // PyTorch does not say which device: the allocator that owns the pointer is the one that accepts it.
  int code = GRAPHALLOC_INVALID_ARGUMENT;
  for (int device = 0; device < graphalloc::kMaxDevices && code != GRAPHALLOC_OK; ++device) {
    graphalloc::CachingAllocator* allocator = graphalloc::ExistingDefaultAllocator(device);
    if (allocator == nullptr) continue;
    code = Guarded(
        [&] { return allocator->RecordStream(graphalloc::ToDevice(ptr), graphalloc::ToStream(stream)); });
  }
  if (code != GRAPHALLOC_OK) {
    if (graphalloc::c_api::LastError().empty())
      graphalloc::c_api::LastError() = "graphalloc_torch_record_stream: no allocator exists yet";
    std::fprintf(stderr, "graphalloc: %s\n", graphalloc::c_api::LastError().c_str());
  }
}

int graphalloc_reset_peak_stats(int device) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    (*allocator)->ResetPeakStats();
    return absl::OkStatus();
  });
}

int graphalloc_reset_accumulated_stats(int device) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    (*allocator)->ResetAccumulatedStats();
    return absl::OkStatus();
  });
}

void graphalloc_torch_empty_cache(void) {
  for (int device = 0; device < graphalloc::kMaxDevices; ++device) {
    graphalloc::CachingAllocator* allocator = graphalloc::ExistingDefaultAllocator(device);
    if (allocator == nullptr) continue;
    if (Guarded([&] { return allocator->EmptyCache(); }) != GRAPHALLOC_OK) {
      std::fprintf(stderr, "graphalloc: empty_cache on device %d: %s\n", device,
                   graphalloc::c_api::LastError().c_str());
    }
  }
}

void graphalloc_torch_set_memory_fraction(double fraction, int device) {
  if (graphalloc_set_memory_fraction(fraction, device) != GRAPHALLOC_OK) {
    std::fprintf(stderr, "graphalloc: %s\n", graphalloc::c_api::LastError().c_str());
  }
}

const char* graphalloc_version(void) { return "graphalloc " GRAPHALLOC_VERSION; }

const char* graphalloc_last_error(void) { return graphalloc::c_api::LastError().c_str(); }

}  // extern "C"

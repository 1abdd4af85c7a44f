// The C ABI of sleep and wake (graphalloc.h): pools by tag or id over CachingAllocator::Sleep / Wake of the
// process-wide allocators, and pools created with a tag.
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/c_api/c_api_internal.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/core/default_allocator.h"

namespace graphalloc::c_api {
namespace {

// The scope a C caller names: a tag, or (NULL) the whole allocator. A tag no pool has is NotFound, which
// the C ABI reports as INVALID_ARGUMENT.
SleepScope ScopeOf(const char* tag) {
  return tag == nullptr ? SleepScope::All() : SleepScope::Tag(std::string(tag));
}

absl::Status Sleep(const char* function, int device, SleepScope scope, int backup) {
  absl::StatusOr<CachingAllocator*> allocator = DefaultAllocator(device);
  if (!allocator.ok()) return allocator.status();
  SleepRequest request;
  request.scope = std::move(scope);
  request.mode = backup != 0 ? SleepMode::kBackup : SleepMode::kDiscard;
  absl::StatusOr<SleepResult> result = (*allocator)->Sleep(request);
  if (!result.ok())
    return absl::Status(result.status().code(), absl::StrCat(function, ": ", result.status().message()));
  return absl::OkStatus();
}

absl::Status Wake(const char* function, int device, SleepScope scope) {
  absl::StatusOr<CachingAllocator*> allocator = DefaultAllocator(device);
  if (!allocator.ok()) return allocator.status();
  WakeRequest request;
  request.scope = std::move(scope);
  absl::StatusOr<WakeResult> result = (*allocator)->Wake(request);
  if (!result.ok())
    return absl::Status(result.status().code(), absl::StrCat(function, ": ", result.status().message()));
  return absl::OkStatus();
}

}  // namespace
}  // namespace graphalloc::c_api

using graphalloc::c_api::Guarded;

extern "C" {

int graphalloc_pool_create_with_tag(int device, const graphalloc_pool_options* options, const char* tag,
                                    uint64_t* pool) {
  return Guarded([&] {
    return graphalloc::c_api::CreatePool("graphalloc_pool_create_with_tag", device, options, tag, pool);
  });
}

int graphalloc_sleep(int device, const char* tag, int backup) {
  return Guarded([&] {
    return graphalloc::c_api::Sleep("graphalloc_sleep", device, graphalloc::c_api::ScopeOf(tag), backup);
  });
}

int graphalloc_wake(int device, const char* tag) {
  return Guarded(
      [&] { return graphalloc::c_api::Wake("graphalloc_wake", device, graphalloc::c_api::ScopeOf(tag)); });
}

int graphalloc_pool_sleep(int device, uint64_t pool, int backup) {
  return Guarded([&] {
    return graphalloc::c_api::Sleep("graphalloc_pool_sleep", device, graphalloc::SleepScope::Pool(pool),
                                    backup);
  });
}

int graphalloc_pool_wake(int device, uint64_t pool) {
  return Guarded([&] {
    return graphalloc::c_api::Wake("graphalloc_pool_wake", device, graphalloc::SleepScope::Pool(pool));
  });
}

int graphalloc_pool_sleep_state(int device, uint64_t pool, int* asleep, size_t* sleeping_bytes,
                                size_t* backup_bytes) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    absl::StatusOr<graphalloc::SleepState> state = (*allocator)->GetSleepState(pool);
    if (!state.ok()) return state.status();
    if (asleep != nullptr) *asleep = state->asleep ? 1 : 0;
    if (sleeping_bytes != nullptr) *sleeping_bytes = state->sleeping_bytes;
    if (backup_bytes != nullptr) *backup_bytes = state->backup_bytes;
    return absl::OkStatus();
  });
}

}  // extern "C"

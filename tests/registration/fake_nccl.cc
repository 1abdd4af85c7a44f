// A stand-in for libnccl.so for the registration tests: exports ncclCommRegister, ncclCommDeregister and
// ncclGetErrorString with NCCL's signatures, records the calls, and fails on request, so that
// NcclRegistration is tested without NCCL (GRAPHALLOC_NCCL_LIBRARY points at this library).
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace {

struct State {
  std::mutex mu;
  std::map<void*, std::pair<void*, std::size_t>> live;  // handle -> (buffer, size)
  int register_calls = 0;
  int deregister_calls = 0;
  int fail_next_register = 0;  // an NCCL result to return once, 0: none
  void* last_comm = nullptr;
  std::uintptr_t next_handle = 0x1000;
};

State& TheState() {
  static State* state = new State();
  return *state;
}

}  // namespace

#define FAKE_NCCL_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_NCCL_EXPORT int ncclCommRegister(void* comm, void* buff, std::size_t size, void** handle) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.register_calls;
  s.last_comm = comm;
  if (s.fail_next_register != 0) {
    const int result = s.fail_next_register;
    s.fail_next_register = 0;
    return result;
  }
  *handle = reinterpret_cast<void*>(s.next_handle++);
  s.live.emplace(*handle, std::make_pair(buff, size));
  return 0;
}

FAKE_NCCL_EXPORT int ncclCommDeregister(void* comm, void* handle) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.deregister_calls;
  s.last_comm = comm;
  return s.live.erase(handle) == 1 ? 0 : 4;  // ncclInvalidArgument
}

FAKE_NCCL_EXPORT const char* ncclGetErrorString(int result) {
  switch (result) {
    case 0:
      return "no error (fake)";
    case 4:
      return "invalid argument (fake)";
    case 5:
      return "invalid usage (fake)";
    default:
      return "unknown result (fake)";
  }
}

// The test's controls.
FAKE_NCCL_EXPORT int fake_nccl_register_calls() {
  std::lock_guard<std::mutex> lock(TheState().mu);
  return TheState().register_calls;
}
FAKE_NCCL_EXPORT int fake_nccl_deregister_calls() {
  std::lock_guard<std::mutex> lock(TheState().mu);
  return TheState().deregister_calls;
}
// The registrations live now; *buffer and *size (if not null) receive the lowest one's.
FAKE_NCCL_EXPORT int fake_nccl_live(void** buffer, std::size_t* size) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  void* lowest = nullptr;
  std::size_t lowest_size = 0;
  for (const auto& [handle, reg] : s.live) {
    if (lowest == nullptr || reg.first < lowest) {
      lowest = reg.first;
      lowest_size = reg.second;
    }
  }
  if (buffer != nullptr) *buffer = lowest;
  if (size != nullptr) *size = lowest_size;
  return static_cast<int>(s.live.size());
}
FAKE_NCCL_EXPORT void* fake_nccl_last_comm() {
  std::lock_guard<std::mutex> lock(TheState().mu);
  return TheState().last_comm;
}
FAKE_NCCL_EXPORT void fake_nccl_fail_next_register(int result) {
  std::lock_guard<std::mutex> lock(TheState().mu);
  TheState().fail_next_register = result;
}

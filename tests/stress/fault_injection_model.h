// The fault-injection stress test's vocabulary: which device calls fail and how, the operations a run
// draws from, its scenarios' knobs, and what the test knows of a live block.
#ifndef GRAPHALLOC_TESTS_STRESS_FAULT_INJECTION_MODEL_H_
#define GRAPHALLOC_TESTS_STRESS_FAULT_INJECTION_MODEL_H_

#include <array>
#include <cstdint>
#include <iterator>
#include <ostream>
#include <string>

#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/device/driver_error.h"
#include "graphalloc/allocator/device/sim_driver.h"

namespace graphalloc::testing {

// The calls that fail, and how: creating memory or address space runs out of memory; releasing,
// unmapping and events fail as a sick device does; capture calls fail as CUDA refuses a capture.
struct FaultKind {
  SimCall call;
  const char* name;
  std::array<DriverResult, 2> results;
  bool capture = false;  // planned only in scenarios that capture
};
inline constexpr FaultKind kFaultKinds[] = {
    {SimCall::kAddressReserve, "AddressReserve", {DriverResult::kOutOfMemory, DriverResult::kOutOfMemory}},
    {SimCall::kAddressFree, "AddressFree", {DriverResult::kUnknown, DriverResult::kInvalidValue}},
    {SimCall::kMemCreate, "MemCreate", {DriverResult::kOutOfMemory, DriverResult::kOutOfMemory}},
    {SimCall::kMemRelease, "MemRelease", {DriverResult::kUnknown, DriverResult::kInvalidHandle}},
    {SimCall::kMemMap, "MemMap", {DriverResult::kOutOfMemory, DriverResult::kUnknown}},
    {SimCall::kMemSetAccess, "MemSetAccess", {DriverResult::kOutOfMemory, DriverResult::kUnknown}},
    {SimCall::kMemUnmap, "MemUnmap", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kMemAlloc, "MemAlloc", {DriverResult::kOutOfMemory, DriverResult::kOutOfMemory}},
    {SimCall::kMemFree, "MemFree", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kEventCreate, "EventCreate", {DriverResult::kUnknown, DriverResult::kOutOfMemory}},
    {SimCall::kEventRecord, "EventRecord", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kEventQuery, "EventQuery", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kEventSynchronize, "EventSynchronize", {DriverResult::kUnknown, DriverResult::kIllegalAddress}},
    {SimCall::kBeginCapture,
     "BeginCapture",
     {DriverResult::kStreamCaptureUnsupported, DriverResult::kStreamCaptureImplicit},
     true},
    {SimCall::kEndCapture,
     "EndCapture",
     {DriverResult::kStreamCaptureInvalidated, DriverResult::kStreamCaptureUnjoined},
     true},
};
inline constexpr int kNumFaultKinds = static_cast<int>(std::size(kFaultKinds));
constexpr int KindOf(SimCall call) {
  for (int k = 0; k < kNumFaultKinds; ++k) {
    if (kFaultKinds[k].call == call) return k;
  }
  return -1;
}
static_assert(KindOf(SimCall::kMemUnmap) >= 0 && KindOf(SimCall::kEndCapture) >= 0);
// Device calls after which the mapped ranges are checked: they map, grant access to, unmap or free memory.
inline constexpr SimCall kMappingCalls[] = {SimCall::kMemMap,  SimCall::kMemSetAccess, SimCall::kMemUnmap,
                                            SimCall::kMemFree, SimCall::kMemAlloc,     SimCall::kAddressFree};
// Device calls after which every live block's contents are checked: only they can take memory away (a
// new mapping or allocation cannot touch a live block's memory, and a new block that overlaps one is
// caught when it is handed out).
inline constexpr SimCall kUnmappingCalls[] = {SimCall::kMemUnmap, SimCall::kMemFree, SimCall::kMemRelease,
                                              SimCall::kAddressFree};

enum Op {
  kAllocate,
  kFree,
  kRecordStream,
  kEmptyCache,
  kBadFree,
  // Scenarios with pools only:
  kPoolAllocate,
  kBeginCapture,
  kEndCapture,
  kCheckpoint,
  kRestore,
  kEmptyPoolCache,
  kDropPool,
  kCount
};
inline constexpr const char* kOpNames[] = {"Allocate",   "Free",         "RecordStream",   "EmptyCache",
                                           "BadFree",    "PoolAllocate", "BeginCapture",   "EndCapture",
                                           "Checkpoint", "Restore",      "EmptyPoolCache", "DropPool"};
static_assert(std::size(kOpNames) == kCount);

struct Scenario {
  const char* name;
  std::string config;  // GRAPHALLOC_CONF syntax, without expandable_segments (the test sets it)
  double memory_fraction = 1.0;
  double fault_rate = 0.0;  // per operation: chance of a planned fault per call kind, and of random faults
  std::uint64_t default_seed = 1;
  int operations = 0;
  bool pools = false;  // private pools, captures into them, checkpoint/restore (and capture call faults)
};
inline void PrintTo(const Scenario& s, std::ostream* os) { *os << s.name; }

struct Live {
  std::size_t size = 0;
  Stream stream = kDefaultStream;
  std::uint64_t id = 0;
  PoolId pool = kDefaultPool;   // the private pool it came from, or the default pool
  bool used_elsewhere = false;  // RecordStream'd on another stream: freeing it records (or defers) events
};

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_STRESS_FAULT_INJECTION_MODEL_H_

#include "graphalloc/allocator/device/driver_error.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace graphalloc {
namespace {

constexpr absl::string_view kPayloadUrl = "graphalloc/driver_result";

struct ResultText {
  int code;
  absl::string_view name;
  absl::string_view description;
};

// Names and descriptions as cuGetErrorName / cuGetErrorString give them. Kept here because the
// simulated device and a machine without libcuda must report the same text.
constexpr ResultText kResults[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {35, "CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA driver version is insufficient for CUDA runtime version"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {902, "CUDA_ERROR_STREAM_CAPTURE_MERGE",
     "operation would result in a merge of separate capture sequences"},
    {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
    {904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ResultText* Find(int code) {
  for (const ResultText& r : kResults) {
    if (r.code == code) return &r;
  }
  return nullptr;
}

absl::StatusCode CodeFor(int code) {
  switch (static_cast<DriverResult>(code)) {
    case DriverResult::kOutOfMemory:
      return absl::StatusCode::kResourceExhausted;
    case DriverResult::kInvalidValue:
    case DriverResult::kInvalidHandle:
    case DriverResult::kInvalidDevice:
    case DriverResult::kNotFound:
      return absl::StatusCode::kInvalidArgument;
    case DriverResult::kStreamCaptureUnsupported:
    case DriverResult::kStreamCaptureInvalidated:
    case DriverResult::kStreamCaptureMerge:
    case DriverResult::kStreamCaptureUnmatched:
    case DriverResult::kStreamCaptureUnjoined:
    case DriverResult::kStreamCaptureIsolation:
    case DriverResult::kStreamCaptureImplicit:
    case DriverResult::kStreamCaptureWrongThread:
    case DriverResult::kNotPermitted:
      return absl::StatusCode::kFailedPrecondition;
    case DriverResult::kNotInitialized:
    case DriverResult::kDeinitialized:
    case DriverResult::kNoDevice:
      return absl::StatusCode::kUnavailable;
    case DriverResult::kNotSupported:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::string_view DriverResultName(int code) {
  if (const ResultText* r = Find(code)) return r->name;
  return "CUDA_ERROR_UNRECOGNIZED";
}

absl::string_view DriverResultDescription(int code) {
  if (const ResultText* r = Find(code)) return r->description;
  return "unrecognized error code";
}

absl::Status DriverError(absl::string_view call, int code) {
  if (code == 0) return absl::OkStatus();
  std::string name(DriverResultName(code));
  if (Find(code) == nullptr) absl::StrAppend(&name, "_", code);
  absl::Status status(CodeFor(code),
                      absl::StrCat(call, " failed: ", name, " (", DriverResultDescription(code), ")"));
  status.SetPayload(kPayloadUrl, absl::Cord(absl::StrCat(code)));
  return status;
}

std::optional<int> DriverErrorCode(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kPayloadUrl);
  if (!payload.has_value()) return std::nullopt;
  int code = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &code)) return std::nullopt;
  return code;
}

}  // namespace graphalloc

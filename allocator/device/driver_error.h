// Turns CUDA driver result codes into absl::Status, identically for the real and the simulated device.
//
// The simulated device reports the same codes the real driver would, so callers test one thing:
// absl::IsResourceExhausted() for out-of-memory, DriverErrorCode() for a specific CUresult.
#ifndef GRAPHALLOC_ALLOCATOR_DEVICE_DRIVER_ERROR_H_
#define GRAPHALLOC_ALLOCATOR_DEVICE_DRIVER_ERROR_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace graphalloc {

// The CUresult values the project produces or checks (numerically identical to cuda.h).
enum class DriverResult : int {
  kSuccess = 0,
  kInvalidValue = 1,
  kOutOfMemory = 2,
  kNotInitialized = 3,
  kDeinitialized = 4,
  kNoDevice = 100,
  kInvalidDevice = 101,
  kInvalidContext = 201,
  kInvalidHandle = 400,
  kNotFound = 500,
  kNotReady = 600,
  kIllegalAddress = 700,
  kPeerAccessAlreadyEnabled = 704,
  kNotPermitted = 800,
  kNotSupported = 801,
  kStreamCaptureUnsupported = 900,
  kStreamCaptureInvalidated = 901,
  kStreamCaptureMerge = 902,
  kStreamCaptureUnmatched = 903,
  kStreamCaptureUnjoined = 904,
  kStreamCaptureIsolation = 905,
  kStreamCaptureImplicit = 906,
  kStreamCaptureWrongThread = 908,
  kUnknown = 999,
};

// "CUDA_ERROR_OUT_OF_MEMORY" for a known code, "CUDA_ERROR_<n>" otherwise.
absl::string_view DriverResultName(int code);
// "out of memory" for a known code, "unrecognized error code" otherwise.
absl::string_view DriverResultDescription(int code);

// OkStatus() for kSuccess; otherwise "<call> failed: <NAME> (<description>)" with a status code chosen by
// kind (ResourceExhausted for out-of-memory, InvalidArgument for bad values and handles,
// FailedPrecondition for capture violations, Unavailable for a missing driver or device, Internal else)
// and the numeric code attached as a payload.
absl::Status DriverError(absl::string_view call, int code);
inline absl::Status DriverError(absl::string_view call, DriverResult code) {
  return DriverError(call, static_cast<int>(code));
}

// The CUresult carried by a status DriverError() made; nullopt for other statuses.
std::optional<int> DriverErrorCode(const absl::Status& status);

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_DEVICE_DRIVER_ERROR_H_

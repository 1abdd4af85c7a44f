#include "examples/kernels/tiny_kernels.h"

#include <string_view>

#include "absl/strings/str_format.h"

#if defined(GRAPHALLOC_EXAMPLE_KERNELS_HAVE_CUDA)
#include "examples/kernels/tiny_kernels_cuda.h"
#endif

namespace graphalloc::testing {
namespace {

float* F(DevicePtr p) { return reinterpret_cast<float*>(p); }

#if defined(GRAPHALLOC_EXAMPLE_KERNELS_HAVE_CUDA)
absl::Status FromCuda(std::string_view op, int code, const char* call) {
  if (code == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s: %s failed: %s", op, call, tiny_cuda::ErrorName(code)));
}
#else
absl::Status NoKernel(std::string_view op, const Driver& driver) {
  return absl::UnimplementedError(absl::StrFormat(
      "%s: no kernel for device kind '%s' (the CUDA kernels need a build with nvcc)", op, driver.Kind()));
}
#endif

}  // namespace

absl::Status FillF32(Driver& driver, Stream stream, DevicePtr out, std::size_t n, float value) {
  if (driver.Kind() == "sim") {
    return driver.LaunchHostFunction(stream, [out, n, value] {
      for (std::size_t i = 0; i < n; ++i) F(out)[i] = value;
    });
  }
#if defined(GRAPHALLOC_EXAMPLE_KERNELS_HAVE_CUDA)
  const char* call = "";
  const int code = tiny_cuda::LaunchFill(driver.Ordinal(), NativeFromStream(stream), F(out), n, value, &call);
  return FromCuda("FillF32", code, call);
#else
  return NoKernel("FillF32", driver);
#endif
}

absl::Status ScaleF32(Driver& driver, Stream stream, DevicePtr out, DevicePtr in, std::size_t n,
                      float alpha) {
  if (driver.Kind() == "sim") {
    return driver.LaunchHostFunction(stream, [out, in, n, alpha] {
      for (std::size_t i = 0; i < n; ++i) F(out)[i] = alpha * F(in)[i];
    });
  }
#if defined(GRAPHALLOC_EXAMPLE_KERNELS_HAVE_CUDA)
  const char* call = "";
  const int code =
      tiny_cuda::LaunchScale(driver.Ordinal(), NativeFromStream(stream), F(out), F(in), n, alpha, &call);
  return FromCuda("ScaleF32", code, call);
#else
  return NoKernel("ScaleF32", driver);
#endif
}

absl::Status AddF32(Driver& driver, Stream stream, DevicePtr out, DevicePtr a, DevicePtr b, std::size_t n) {
  if (driver.Kind() == "sim") {
    return driver.LaunchHostFunction(stream, [out, a, b, n] {
      for (std::size_t i = 0; i < n; ++i) F(out)[i] = F(a)[i] + F(b)[i];
    });
  }
#if defined(GRAPHALLOC_EXAMPLE_KERNELS_HAVE_CUDA)
  const char* call = "";
  const int code =
      tiny_cuda::LaunchAdd(driver.Ordinal(), NativeFromStream(stream), F(out), F(a), F(b), n, &call);
  return FromCuda("AddF32", code, call);
#else
  return NoKernel("AddF32", driver);
#endif
}

absl::Status PreloadTinyKernels(Driver& driver) {
  if (driver.Kind() == "sim") return absl::OkStatus();
#if defined(GRAPHALLOC_EXAMPLE_KERNELS_HAVE_CUDA)
  const char* call = "";
  return FromCuda("PreloadTinyKernels", tiny_cuda::Preload(driver.Ordinal(), &call), call);
#else
  return NoKernel("PreloadTinyKernels", driver);
#endif
}

}  // namespace graphalloc::testing

#include "examples/mlp/mlp_kernels.h"

#include <string_view>

#include "absl/strings/str_format.h"

#if defined(GRAPHALLOC_MLP_HAVE_CUDA_KERNELS)
#include "examples/mlp/mlp_kernels_cuda.h"
#endif

namespace graphalloc::mlp {
namespace {

template <class Op>
absl::Status Enqueue(Driver& driver, Stream stream, const Op& op, std::string_view name) {
  if (driver.Kind() == "sim") {
    return driver.LaunchHostFunction(stream, [op] {
      const std::uint64_t n = op.size();
      for (std::uint64_t i = 0; i < n; ++i) op(i);
    });
  }
#if defined(GRAPHALLOC_MLP_HAVE_CUDA_KERNELS)
  if (driver.Kind() == "cuda") {
    const char* call = "";
    const int code = mlp_cuda::Launch(driver.Ordinal(), NativeFromStream(stream), op, &call);
    if (code == 0) return absl::OkStatus();
    return absl::InternalError(absl::StrFormat("%s: %s failed: %s", name, call, mlp_cuda::ErrorName(code)));
  }
#endif
  return absl::UnimplementedError(absl::StrFormat(
      "%s: no kernel for device kind '%s' (the CUDA kernels need a build with nvcc)", name, driver.Kind()));
}

}  // namespace

#define GRAPHALLOC_MLP_RUN(Op)                                              \
  absl::Status Run(Driver& driver, Stream stream, const mlp_body::Op& op) { \
    return Enqueue(driver, stream, op, #Op);                                \
  }
GRAPHALLOC_MLP_OPS(GRAPHALLOC_MLP_RUN)
#undef GRAPHALLOC_MLP_RUN

absl::Status PreloadMlpKernels(Driver& driver) {
  if (driver.Kind() == "sim") return absl::OkStatus();
#if defined(GRAPHALLOC_MLP_HAVE_CUDA_KERNELS)
  const char* call = "";
  const int code = mlp_cuda::Preload(driver.Ordinal(), &call);
  if (code == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrFormat("PreloadMlpKernels: %s failed: %s", call, mlp_cuda::ErrorName(code)));
#else
  return absl::UnimplementedError(absl::StrFormat(
      "PreloadMlpKernels: no kernels for device kind '%s' (the CUDA kernels need a build with nvcc)",
      driver.Kind()));
#endif
}

}  // namespace graphalloc::mlp

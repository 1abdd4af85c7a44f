// The MLP example's kernels (mlp_op_bodies.h) enqueued on a stream through the Driver: on "cuda" a kernel
// (mlp_kernels.cu), on "sim" a LaunchHostFunction closure running the same body on the host. Both give
// identical bits; a graph captures either like any other work on the stream.
#ifndef GRAPHALLOC_EXAMPLES_MLP_MLP_KERNELS_H_
#define GRAPHALLOC_EXAMPLES_MLP_MLP_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "examples/mlp/mlp_op_bodies.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc::mlp {

// A device address as the kernels' float pointer (a host address on the simulated device).
inline float* F(DevicePtr p) { return reinterpret_cast<float*>(static_cast<std::uintptr_t>(p)); }

// Run(driver, stream, op) for every op of mlp_op_bodies.h.
#define GRAPHALLOC_MLP_RUN(Op) absl::Status Run(Driver& driver, Stream stream, const mlp_body::Op& op);
GRAPHALLOC_MLP_OPS(GRAPHALLOC_MLP_RUN)
#undef GRAPHALLOC_MLP_RUN

// Loads the kernels before a capture (a no-op on "sim").
absl::Status PreloadMlpKernels(Driver& driver);

}  // namespace graphalloc::mlp

#endif  // GRAPHALLOC_EXAMPLES_MLP_MLP_KERNELS_H_

// Tiny float32 kernels for the graph tests and benchmarks: fill, scale, add. Each enqueues its work on a
// stream through the Driver: on "cuda" a kernel (tiny_kernels.cu), on "sim" a LaunchHostFunction closure
// that runs the same arithmetic on the host. Every element is one IEEE operation (one multiply or one
// add, never fused), so both devices produce identical bits and tests compare outputs exactly.
#ifndef GRAPHALLOC_EXAMPLES_KERNELS_TINY_KERNELS_H_
#define GRAPHALLOC_EXAMPLES_KERNELS_TINY_KERNELS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc::testing {

// out[i] = value.
absl::Status FillF32(Driver& driver, Stream stream, DevicePtr out, std::size_t n, float value);
// out[i] = alpha * in[i] (`in` may equal `out`).
absl::Status ScaleF32(Driver& driver, Stream stream, DevicePtr out, DevicePtr in, std::size_t n, float alpha);
// out[i] = a[i] + b[i] (any of them may be equal).
absl::Status AddF32(Driver& driver, Stream stream, DevicePtr out, DevicePtr a, DevicePtr b, std::size_t n);

// Loads the kernels before a capture (CUDA loads modules lazily; a no-op on "sim").
absl::Status PreloadTinyKernels(Driver& driver);

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_EXAMPLES_KERNELS_TINY_KERNELS_H_

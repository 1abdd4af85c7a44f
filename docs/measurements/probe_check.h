// CK(call): the driver-API probes of this folder stop with the call's text and the driver's message when
// a call fails (they measure, and a failed call would make the figures meaningless).
#ifndef GRAPHALLOC_DOCS_MEASUREMENTS_PROBE_CHECK_H_
#define GRAPHALLOC_DOCS_MEASUREMENTS_PROBE_CHECK_H_

#include <cuda.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                \
  do {                                       \
    CUresult rc_ = (x);                      \
    if (rc_ != CUDA_SUCCESS) {               \
      const char* s;                         \
      cuGetErrorString(rc_, &s);             \
      std::printf("%s failed: %s\n", #x, s); \
      std::exit(1);                          \
    }                                        \
  } while (0)

#endif  // GRAPHALLOC_DOCS_MEASUREMENTS_PROBE_CHECK_H_

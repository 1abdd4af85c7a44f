// The per-element work of the MLP example's kernels, written once for the GPU kernels (mlp_kernels.cu)
// and the simulated device (mlp_kernels.cc), which run op(i) for i in [0, op.size()). Every sum runs in a
// fixed order with one rounded multiply and one rounded add per term (GA_FMUL / GA_FADD: __fmul_rn /
// __fadd_rn on the device, never contracted into a fused multiply-add), so a kernel's bits depend only on
// its inputs: the same on every launch, graphed or eager, and the same on the host as on the GPU.
// Plain structs of raw pointers, so a device kernel can take them by value.
#ifndef GRAPHALLOC_EXAMPLES_MLP_MLP_OP_BODIES_H_
#define GRAPHALLOC_EXAMPLES_MLP_MLP_OP_BODIES_H_

#include <cstdint>

#include "graphalloc/rng/philox.h"  // GA_HD, GA_INLINE, GA_FMUL, GA_FADD

namespace graphalloc::mlp_body {

// y[b, o] = bias[o] + sum_i x[b, i] * w[o, i]   (w is out x in, row-major)
struct LinearForward {
  float* y;
  const float* x;
  const float* w;
  const float* bias;
  std::uint32_t batch, in, out;
  GA_HD std::uint64_t size() const { return std::uint64_t{batch} * out; }
  GA_HD GA_INLINE void operator()(std::uint64_t e) const {
    const std::uint64_t b = e / out, o = e % out;
    float acc = 0.0f;
    for (std::uint32_t i = 0; i < in; ++i) acc = GA_FADD(acc, GA_FMUL(x[b * in + i], w[o * in + i]));
    y[e] = GA_FADD(acc, bias[o]);
  }
};

// gx[b, i] = sum_o gy[b, o] * w[o, i]
struct LinearGradInput {
  float* gx;
  const float* gy;
  const float* w;
  std::uint32_t batch, in, out;
  GA_HD std::uint64_t size() const { return std::uint64_t{batch} * in; }
  GA_HD GA_INLINE void operator()(std::uint64_t e) const {
    const std::uint64_t b = e / in, i = e % in;
    float acc = 0.0f;
    for (std::uint32_t o = 0; o < out; ++o) acc = GA_FADD(acc, GA_FMUL(gy[b * out + o], w[o * in + i]));
    gx[e] = acc;
  }
};

// gw[o, i] = sum_b gy[b, o] * x[b, i]
struct LinearGradWeight {
  float* gw;
  const float* gy;
  const float* x;
  std::uint32_t batch, in, out;
  GA_HD std::uint64_t size() const { return std::uint64_t{out} * in; }
  GA_HD GA_INLINE void operator()(std::uint64_t e) const {
    const std::uint64_t o = e / in, i = e % in;
    float acc = 0.0f;
    for (std::uint32_t b = 0; b < batch; ++b) acc = GA_FADD(acc, GA_FMUL(gy[b * out + o], x[b * in + i]));
    gw[e] = acc;
  }
};

// gb[o] = sum_b gy[b, o]
struct ColumnSum {
  float* gb;
  const float* gy;
  std::uint32_t batch, out;
  GA_HD std::uint64_t size() const { return out; }
  GA_HD GA_INLINE void operator()(std::uint64_t o) const {
    float acc = 0.0f;
    for (std::uint32_t b = 0; b < batch; ++b) acc = GA_FADD(acc, gy[b * out + o]);
    gb[o] = acc;
  }
};

// y = max(x, 0)
struct Relu {
  float* y;
  const float* x;
  std::uint64_t n;
  GA_HD std::uint64_t size() const { return n; }
  GA_HD GA_INLINE void operator()(std::uint64_t i) const { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
};

// gx = y > 0 ? gy : 0, with y the ReLU's output
struct ReluGrad {
  float* gx;
  const float* gy;
  const float* y;
  std::uint64_t n;
  GA_HD std::uint64_t size() const { return n; }
  GA_HD GA_INLINE void operator()(std::uint64_t i) const { gx[i] = y[i] > 0.0f ? gy[i] : 0.0f; }
};

// loss[0] = inv_n * sum_i (y[i] - t[i])^2, in index order (one thread: a fixed order, no atomics).
struct MseLoss {
  float* loss;
  const float* y;
  const float* t;
  std::uint64_t n;
  float inv_n;
  GA_HD std::uint64_t size() const { return 1; }
  GA_HD GA_INLINE void operator()(std::uint64_t) const {
    float acc = 0.0f;
    for (std::uint64_t i = 0; i < n; ++i) {
      const float d = GA_FADD(y[i], -t[i]);
      acc = GA_FADD(acc, GA_FMUL(d, d));
    }
    loss[0] = GA_FMUL(acc, inv_n);
  }
};

// gy[i] = ((y[i] - t[i]) * two_over_n) * gloss[0]: the gradient of MseLoss times the incoming gradient.
struct MseGrad {
  float* gy;
  const float* y;
  const float* t;
  const float* gloss;
  std::uint64_t n;
  float two_over_n;
  GA_HD std::uint64_t size() const { return n; }
  GA_HD GA_INLINE void operator()(std::uint64_t i) const {
    gy[i] = GA_FMUL(GA_FMUL(GA_FADD(y[i], -t[i]), two_over_n), gloss[0]);
  }
};

// w[i] = w[i] - lr * g[i]
struct Sgd {
  float* w;
  const float* g;
  std::uint64_t n;
  float lr;
  GA_HD std::uint64_t size() const { return n; }
  GA_HD GA_INLINE void operator()(std::uint64_t i) const { w[i] = GA_FADD(w[i], GA_FMUL(-lr, g[i])); }
};

// out[i] = a[i] * b[i]
struct Mul {
  float* out;
  const float* a;
  const float* b;
  std::uint64_t n;
  GA_HD std::uint64_t size() const { return n; }
  GA_HD GA_INLINE void operator()(std::uint64_t i) const { out[i] = GA_FMUL(a[i], b[i]); }
};

}  // namespace graphalloc::mlp_body

// Every op above, for the launchers that exist once per op: X(Op) for each.
#define GRAPHALLOC_MLP_OPS(X) \
  X(LinearForward)            \
  X(LinearGradInput)          \
  X(LinearGradWeight)         \
  X(ColumnSum)                \
  X(Relu)                     \
  X(ReluGrad)                 \
  X(MseLoss)                  \
  X(MseGrad)                  \
  X(Sgd)                      \
  X(Mul)

#endif  // GRAPHALLOC_EXAMPLES_MLP_MLP_OP_BODIES_H_

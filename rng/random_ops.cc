#include "graphalloc/rng/random_ops.h"

#include <cmath>
#include <string>

#include "absl/strings/str_format.h"
#include "graphalloc/rng/launch_policy.h"

#if defined(GRAPHALLOC_RNG_HAVE_CUDA_KERNELS)
#include "graphalloc/rng/random_kernels_cuda.h"
#endif

namespace graphalloc {
namespace {

using rng_body::Distribution;
using rng_body::ElementType;

ElementType ElementTypeOf(DType dtype) {
  return dtype == DType::kBFloat16 ? ElementType::kBFloat16 : ElementType::kFloat32;
}

absl::Status CheckArgs(std::string_view op, const PhiloxArgs& args) {
  if (args.captured && (args.seed_address == 0 || args.offset_address == 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: captured PhiloxArgs has a null seed or offset slot address (seed 0x%x, offset 0x%x); take "
        "PhiloxArgs from Generator::Reserve during the generator's capture",
        op, args.seed_address, args.offset_address));
  }
  return absl::OkStatus();
}

// A draw with a generator's eager values on a stream that is capturing a graph: every replay of the graph
// would draw the same numbers (the values travel as kernel arguments). Refused, naming the generator.
absl::Status CheckNotBakedIn(std::string_view op, Driver& driver, Stream stream, const PhiloxArgs& args) {
  if (args.captured || args.generator == 0) return absl::OkStatus();
  absl::StatusOr<CaptureInfo> info = driver.GetCaptureInfo(stream);
  if (!info.ok() || info->status == CaptureStatus::kNone) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s on stream 0x%x: generator %d's values (seed %d, offset %d) were reserved outside the CUDA graph "
      "capture this stream is in (capture %d), so every replay would draw the same numbers; let the "
      "generator take part (Generator::BeginCapture before the capture begins, or FunctionOptions::"
      "generators in a graph tree) and reserve during the capture",
      op, static_cast<std::uintptr_t>(stream), args.generator, args.seed, args.offset, info->id));
}

absl::Status CheckBuffer(std::string_view op, std::string_view name, DevicePtr ptr, std::size_t n) {
  if (ptr == 0 && n > 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s is a null device pointer for %d elements; pass a device allocation", op, name, n));
  }
  return absl::OkStatus();
}

absl::Status CheckProbability(std::string_view op, float p) {
  if (!(p >= 0.0f && p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: drop probability must be in [0, 1], got %g", op, static_cast<double>(p)));
  }
  return absl::OkStatus();
}

#if defined(GRAPHALLOC_RNG_HAVE_CUDA_KERNELS)
absl::Status FromLaunch(std::string_view op, const rng_cuda::LaunchResult& r) {
  if (r.code == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrFormat("%s: %s failed: %s (%s)", op, r.call, r.error_name, r.error_string));
}
#endif

absl::Status NoKernel(std::string_view op, const Driver& driver) {
  if (driver.Kind() == "cuda") {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: graphalloc was built without a CUDA compiler, so it has no device kernels; rebuild with nvcc "
        "on PATH (or CMAKE_CUDA_COMPILER set), or use the simulated device",
        op));
  }
  return absl::UnimplementedError(
      absl::StrFormat("%s: no kernel for device kind '%s' (expected 'sim' or 'cuda')", op, driver.Kind()));
}

absl::Status EnqueueFill(std::string_view op, Driver& driver, Stream stream, DevicePtr out, std::size_t n,
                         ElementType type, Distribution dist, const PhiloxArgs& args) {
  if (absl::Status s = CheckBuffer(op, "out", out, n); !s.ok()) return s;
  if (absl::Status s = CheckArgs(op, args); !s.ok()) return s;
  if (absl::Status s = CheckNotBakedIn(op, driver, stream, args); !s.ok()) return s;
  if (n == 0) return absl::OkStatus();
  if (driver.Kind() == "sim") {
    return driver.LaunchHostFunction(stream, [out, n, type, dist, args] {
      FillOnHost(reinterpret_cast<void*>(out), n, type, dist, args);
    });
  }
#if defined(GRAPHALLOC_RNG_HAVE_CUDA_KERNELS)
  if (driver.Kind() == "cuda") {
    return FromLaunch(op, rng_cuda::LaunchFill(driver.Ordinal(), NativeFromStream(stream),
                                               reinterpret_cast<void*>(out), n, type, dist, args));
  }
#endif
  return NoKernel(op, driver);
}

absl::Status EnqueueDropout(std::string_view op, Driver& driver, Stream stream, DevicePtr in, DevicePtr out,
                            std::size_t n, DType dtype, float p, const PhiloxArgs& args) {
  if (absl::Status s = CheckBuffer(op, "input", in, n); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(op, "output", out, n); !s.ok()) return s;
  if (absl::Status s = CheckProbability(op, p); !s.ok()) return s;
  if (absl::Status s = CheckArgs(op, args); !s.ok()) return s;
  if (n == 0) return absl::OkStatus();
  const rng_body::DropoutParams params = DropoutParamsFor(p);
  const ElementType type = ElementTypeOf(dtype);
  if (driver.Kind() == "sim") {
    return driver.LaunchHostFunction(stream, [in, out, n, type, params, args] {
      DropoutOnHost(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out), n, type, params, args);
    });
  }
#if defined(GRAPHALLOC_RNG_HAVE_CUDA_KERNELS)
  if (driver.Kind() == "cuda") {
    return FromLaunch(op, rng_cuda::LaunchDropout(driver.Ordinal(), NativeFromStream(stream),
                                                  reinterpret_cast<const void*>(in),
                                                  reinterpret_cast<void*>(out), n, type, params, args));
  }
#endif
  return NoKernel(op, driver);
}

}  // namespace

std::size_t DTypeSize(DType dtype) { return dtype == DType::kBFloat16 ? 2 : 4; }

std::uint64_t PhiloxIncrement(std::size_t n) { return rng_policy::Increment(n); }

rng_body::DropoutParams DropoutParamsFor(float p) {
  rng_body::DropoutParams params;
  params.keep_probability = 1.0f - p;
  params.scale = params.keep_probability > 0.0f ? 1.0f / params.keep_probability : 0.0f;
  return params;
}

void FillOnHost(void* out, std::size_t n, ElementType type, Distribution dist, const PhiloxArgs& args) {
  const std::uint64_t threads = rng_policy::TotalThreads(n);
  for (std::uint64_t t = 0; t < threads; ++t) rng_body::FillThread(t, n, args, out, type, dist);
}

void DropoutOnHost(const void* in, void* out, std::size_t n, ElementType type, rng_body::DropoutParams params,
                   const PhiloxArgs& args) {
  const std::uint64_t threads = rng_policy::TotalThreads(n);
  for (std::uint64_t t = 0; t < threads; ++t) rng_body::DropoutThread(t, n, args, in, out, type, params);
}

absl::Status FillBits(Driver& driver, Stream stream, DevicePtr out, std::size_t n, const PhiloxArgs& args) {
  return EnqueueFill("FillBits", driver, stream, out, n, ElementType::kUint32, Distribution::kBits, args);
}

absl::Status FillUniform(Driver& driver, Stream stream, DevicePtr out, std::size_t n, DType dtype,
                         const PhiloxArgs& args) {
  return EnqueueFill("FillUniform", driver, stream, out, n, ElementTypeOf(dtype), Distribution::kUniform,
                     args);
}

absl::Status FillNormal(Driver& driver, Stream stream, DevicePtr out, std::size_t n, DType dtype,
                        const PhiloxArgs& args) {
  return EnqueueFill("FillNormal", driver, stream, out, n, ElementTypeOf(dtype), Distribution::kNormal, args);
}

absl::Status DropoutForward(Driver& driver, Stream stream, DevicePtr in, DevicePtr out, std::size_t n,
                            DType dtype, float p, const PhiloxArgs& args) {
  // A forward draws its mask; a backward recomputes the forward's, whatever they were.
  if (absl::Status s = CheckNotBakedIn("DropoutForward", driver, stream, args); !s.ok()) return s;
  return EnqueueDropout("DropoutForward", driver, stream, in, out, n, dtype, p, args);
}

absl::Status DropoutBackward(Driver& driver, Stream stream, DevicePtr grad_out, DevicePtr grad_in,
                             std::size_t n, DType dtype, float p, const PhiloxArgs& args) {
  // Same mask, same scale: backward is the forward map applied to the incoming gradient.
  return EnqueueDropout("DropoutBackward", driver, stream, grad_out, grad_in, n, dtype, p, args);
}

absl::Status PrepareKernelsForCapture(Driver& driver) {
  if (driver.Kind() == "sim") return absl::OkStatus();
#if defined(GRAPHALLOC_RNG_HAVE_CUDA_KERNELS)
  if (driver.Kind() == "cuda") {
    return FromLaunch("PrepareKernelsForCapture", rng_cuda::PreloadKernels(driver.Ordinal()));
  }
#endif
  return NoKernel("PrepareKernelsForCapture", driver);
}

absl::Status WritePhiloxSlots(Driver& driver, Stream stream, DevicePtr slots, std::uint64_t seed,
                              std::uint64_t offset) {
  if (slots == 0) {
    return absl::InvalidArgumentError(
        "WritePhiloxSlots: null slot address; allocate the slots with MemAlloc");
  }
  if (driver.Kind() == "sim") {
    return driver.LaunchHostFunction(stream, [slots, seed, offset] {
      auto* p = reinterpret_cast<std::uint64_t*>(slots);
      p[0] = seed;
      p[1] = offset;
    });
  }
#if defined(GRAPHALLOC_RNG_HAVE_CUDA_KERNELS)
  if (driver.Kind() == "cuda") {
    return FromLaunch("WritePhiloxSlots",
                      rng_cuda::LaunchWriteSlots(driver.Ordinal(), NativeFromStream(stream),
                                                 reinterpret_cast<void*>(slots), seed, offset));
  }
#endif
  return NoKernel("WritePhiloxSlots", driver);
}

}  // namespace graphalloc

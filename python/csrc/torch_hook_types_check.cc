// Configure-time check (python/CMakeLists.txt, try_compile): do the pool hooks of the PyTorch being built
// for take the types torch_hook_types.h spells out? If this does not compile, the shim is built without
// pool hooks, and graphalloc.torch refuses CUDA graph capture with the reason instead of calling PyTorch's
// hooks through a wrong function type.
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <functional>
#include <type_traits>

#include "python/csrc/torch_hook_types.h"

namespace {

template <typename Setter>
struct SetterArgument;
template <typename Class, typename Argument>
struct SetterArgument<void (Class::*)(Argument)> {
  using type = std::remove_cvref_t<Argument>;
};

using Pluggable = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
using graphalloc_torch::BeginAllocateToPoolFn;
using graphalloc_torch::EndAllocateToPoolFn;
using graphalloc_torch::ReleasePoolFn;

static_assert(std::is_same_v<c10::cuda::MempoolId_t, graphalloc_torch::MempoolId>);
static_assert(std::is_same_v<cudaStream_t, graphalloc_torch::CudaStream>);
static_assert(std::is_same_v<SetterArgument<decltype(&Pluggable::set_begin_allocate_to_pool)>::type,
                             std::function<BeginAllocateToPoolFn>>);
static_assert(std::is_same_v<SetterArgument<decltype(&Pluggable::set_end_allocate_to_pool_fn)>::type,
                             std::function<EndAllocateToPoolFn>>);
static_assert(std::is_same_v<SetterArgument<decltype(&Pluggable::set_release_pool)>::type,
                             std::function<ReleasePoolFn>>);

}  // namespace

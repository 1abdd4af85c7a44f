// libgraphalloc_torch.so's code (python/csrc/torch_shim.cc) driven the way PyTorch drives it, without
// PyTorch's runtime: its malloc throws c10::OutOfMemoryError, and its pool hooks, called through the function
// types PyTorch's setters use with a filter like CUDAGraph's, route a capture to a graphalloc private pool,
// share and release pools as PyTorch counts them, and clean up after a capture that failed. Built only where
// PyTorch's headers are (label torch); runs on the simulated device, and on the GPU under `gpu`. The shim's
// source (and the pool table it serves the hooks from, torch_pools.cc) is compiled into this test with its
// hooks on, whatever the hook-type check said about the PyTorch at hand: the test calls them through the
// shim's own types.
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gmock/gmock.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/device/driver.h"
#include "gtest/gtest.h"
#include "python/csrc/torch_hook_types.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_device.h"

extern "C" {
void* graphalloc_torch_shim_malloc(size_t size, int device, graphalloc_stream stream);
void graphalloc_torch_shim_free(void* ptr, size_t size, int device, graphalloc_stream stream);
void* graphalloc_torch_shim_hook(const char* name);
int graphalloc_torch_shim_pool_of(int device, unsigned long long first, unsigned long long second,
                                  uint64_t* pool, int* route_open);
int graphalloc_torch_shim_last_begun(int* device, unsigned long long* first, unsigned long long* second);
void graphalloc_torch_shim_abandon(int device, unsigned long long first, unsigned long long second,
                                   int release_reference);
int graphalloc_torch_shim_open_routes(void);
}

namespace graphalloc {
namespace {

using graphalloc_torch::BeginAllocateToPoolFn;
using graphalloc_torch::EndAllocateToPoolFn;
using graphalloc_torch::MallocFn;
using graphalloc_torch::MempoolId;
using graphalloc_torch::ReleasePoolFn;
using graphalloc_torch::StreamFilter;
using ::testing::HasSubstr;

constexpr std::size_t kBytes = std::size_t{1} << 20;

class TorchShimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string skip;
    driver_ = testing::DefaultAllocatorDriver(&skip);
    if (driver_ == nullptr) GTEST_SKIP() << skip;
    // As PyTorch does: the setters take addresses and call them through these function types.
    begin_ = reinterpret_cast<BeginAllocateToPoolFn*>(graphalloc_torch_shim_hook("begin_allocate_to_pool"));
    end_ = reinterpret_cast<EndAllocateToPoolFn*>(graphalloc_torch_shim_hook("end_allocate_to_pool"));
    release_ = reinterpret_cast<ReleasePoolFn*>(graphalloc_torch_shim_hook("release_pool"));
    ASSERT_NE(begin_, nullptr);
    ASSERT_NE(end_, nullptr);
    ASSERT_NE(release_, nullptr);
    absl::StatusOr<Stream> stream = driver_->StreamCreate();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *stream;
  }
  void TearDown() override {
    if (stream_ != Stream{}) {
      EXPECT_OK(driver_->StreamDestroy(stream_));
    }
    testing::ExpectDefaultAllocatorsHoldNothing();
  }

  graphalloc_stream Native() const { return static_cast<graphalloc_stream>(NativeFromStream(stream_)); }

  // CUDAGraph's filter: the stream's capture is the one this graph began (capture_id_ is set after
  // cudaStreamBeginCapture, while the filter was handed over before).
  StreamFilter FilterFor(const std::atomic<std::uint64_t>* capture_id) {
    return [this, capture_id](graphalloc_torch::CudaStream s) {
      absl::StatusOr<CaptureInfo> info = driver_->GetCaptureInfo(StreamFromNative(s));
      return info.ok() && info->status == CaptureStatus::kActive && info->id == capture_id->load();
    };
  }

  std::uint64_t PoolOf(MempoolId id, bool* route_open = nullptr) {
    std::uint64_t pool = 0;
    int open = 0;
    if (!graphalloc_torch_shim_pool_of(0, id.first, id.second, &pool, &open)) return 0;
    if (route_open != nullptr) *route_open = open != 0;
    return pool;
  }
  graphalloc_pool_stats Stats(std::uint64_t pool) {
    graphalloc_pool_stats stats{};
    EXPECT_EQ(graphalloc_pool_get_stats(0, pool, &stats), GRAPHALLOC_OK) << graphalloc_last_error();
    return stats;
  }

  Driver* driver_ = nullptr;
  Stream stream_{};
  BeginAllocateToPoolFn* begin_ = nullptr;
  EndAllocateToPoolFn* end_ = nullptr;
  ReleasePoolFn* release_ = nullptr;
};

TEST_F(TorchShimTest, MallocThrowsOutOfMemoryErrorAndOtherErrors) {
  MallocFn* malloc_fn = &graphalloc_torch_shim_malloc;  // what CUDAPluggableAllocator calls
  void* p = malloc_fn(4096, 0, nullptr);
  ASSERT_NE(p, nullptr);
  graphalloc_torch_shim_free(p, 4096, 0, nullptr);
  try {
    malloc_fn(std::size_t{1} << 50, 0, nullptr);
    FAIL() << "1 PiB was allocated";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_THAT(e.what(), HasSubstr("CUDA out of memory (graphalloc)"));
  }
  try {
    malloc_fn(4096, -1, nullptr);
    FAIL() << "device -1 allocated";
  } catch (const c10::OutOfMemoryError&) {
    FAIL() << "a bad device is not out of memory";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("device -1"));
  }
  EXPECT_EQ(malloc_fn(0, 0, nullptr), nullptr);
}

// CUDAGraph::capture_begin's order: beginAllocateToPool, then cudaStreamBeginCapture; capture_end's:
// cudaStreamEndCapture, then endAllocateToPool; reset(): releasePool.
TEST_F(TorchShimTest, CaptureGoesToAPrivatePoolThatReleasePoolFrees) {
  const MempoolId id{101, 0};
  std::atomic<std::uint64_t> capture_id{0};
  begin_(0, id, FilterFor(&capture_id));
  EXPECT_EQ(graphalloc_torch_shim_open_routes(), 1);
  int device = -1;
  unsigned long long first = 0, second = 0;
  ASSERT_EQ(graphalloc_torch_shim_last_begun(&device, &first, &second), 1);
  EXPECT_EQ(MempoolId(first, second), id);
  EXPECT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_FAILED_PRECONDITION);  // capture mode from the start
  ASSERT_OK(driver_->BeginCapture(stream_, CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(const CaptureInfo info, driver_->GetCaptureInfo(stream_));
  capture_id = info.id;
  void* out = graphalloc_torch_shim_malloc(kBytes, 0, Native());
  void* outside = graphalloc_torch_shim_malloc(kBytes, 0, nullptr);  // not in the capture
  ASSERT_OK(driver_->MemsetAsync(reinterpret_cast<DevicePtr>(out), 0x21, kBytes, stream_));
  ASSERT_OK_AND_ASSIGN(const Graph graph, driver_->EndCapture(stream_));
  end_(0, id);
  EXPECT_EQ(graphalloc_torch_shim_open_routes(), 0);
  bool route_open = true;
  const std::uint64_t pool = PoolOf(id, &route_open);
  ASSERT_NE(pool, 0u);
  EXPECT_FALSE(route_open);
  EXPECT_EQ(Stats(pool).live_blocks, 1u);
  EXPECT_EQ(Stats(pool).use_count, 1);  // the reference beginAllocateToPool took
  EXPECT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_OK);
  ASSERT_OK_AND_ASSIGN(const GraphExec exec, driver_->GraphInstantiate(graph));
  ASSERT_OK(driver_->GraphLaunch(exec, stream_));
  ASSERT_OK(driver_->StreamSynchronize(stream_));
  ASSERT_OK(driver_->GraphExecDestroy(exec));
  ASSERT_OK(driver_->GraphDestroy(graph));
  release_(0, id);
  EXPECT_EQ(PoolOf(id), 0u);               // PyTorch's count is 0: no longer mapped
  EXPECT_EQ(Stats(pool).live_blocks, 1u);  // the pool waits for its last tensor
  graphalloc_torch_shim_free(out, kBytes, 0, Native());
  graphalloc_pool_stats stats{};
  EXPECT_EQ(graphalloc_pool_get_stats(0, pool, &stats), GRAPHALLOC_INVALID_ARGUMENT);  // gone
  graphalloc_torch_shim_free(outside, kBytes, 0, nullptr);
}

TEST_F(TorchShimTest, GraphsSharingAPoolShareOneGraphallocPool) {
  const MempoolId id{0, 202};  // graph_pool_handle()'s kind
  std::atomic<std::uint64_t> no_capture{~std::uint64_t{0}};
  begin_(0, id, FilterFor(&no_capture));
  end_(0, id);
  const std::uint64_t pool = PoolOf(id);
  begin_(0, id, FilterFor(&no_capture));
  end_(0, id);
  EXPECT_EQ(PoolOf(id), pool);
  EXPECT_EQ(Stats(pool).use_count, 1);  // the pool table's handle, whatever PyTorch's count
  release_(0, id);
  EXPECT_EQ(PoolOf(id), pool);  // PyTorch still holds a reference
  release_(0, id);
  EXPECT_EQ(PoolOf(id), 0u);
  release_(0, id);  // one too many: reported on stderr, never thrown (PyTorch calls it from destructors)
}

TEST_F(TorchShimTest, SecondBeginOfTheSameRouteIsAnError) {
  const MempoolId id{303, 0};
  std::atomic<std::uint64_t> no_capture{~std::uint64_t{0}};
  begin_(0, id, FilterFor(&no_capture));
  try {
    begin_(0, id, FilterFor(&no_capture));
    FAIL() << "a second route to the same pool";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("already routing"));
  }
  end_(0, id);
  release_(0, id);
  EXPECT_EQ(PoolOf(id), 0u);
  EXPECT_EQ(graphalloc_torch_shim_open_routes(), 0);
}

TEST_F(TorchShimTest, BeginOnABadDeviceThrowsAndHoldsNothing) {
  const MempoolId id{404, 0};
  std::atomic<std::uint64_t> no_capture{0};
  EXPECT_THROW(begin_(-1, id, FilterFor(&no_capture)), c10::Error);
  EXPECT_EQ(graphalloc_torch_shim_open_routes(), 0);
  EXPECT_EQ(PoolOf(id), 0u);
}

// PyTorch's capture_end raises before endAllocateToPool when cudaStreamEndCapture fails; graphalloc.torch
// then abandons the route and, the capture not having ended, the reference.
TEST_F(TorchShimTest, AbandonEndsARouteLeftOpenAndLeavesCaptureMode) {
  const MempoolId id{505, 0};
  std::atomic<std::uint64_t> no_capture{0};
  begin_(0, id, FilterFor(&no_capture));
  EXPECT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_FAILED_PRECONDITION);
  graphalloc_torch_shim_abandon(0, id.first, id.second, /*release_reference=*/1);
  EXPECT_EQ(graphalloc_torch_shim_open_routes(), 0);
  EXPECT_EQ(PoolOf(id), 0u);
  EXPECT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_OK);
}

TEST_F(TorchShimTest, ThrowingFilterRoutesNothing) {
  const MempoolId id{606, 0};
  begin_(0, id,
         [](graphalloc_torch::CudaStream) -> bool { throw std::runtime_error("cudaStreamGetCaptureInfo"); });
  void* p = graphalloc_torch_shim_malloc(4096, 0, Native());
  EXPECT_EQ(Stats(PoolOf(id)).live_blocks, 0u);
  end_(0, id);
  release_(0, id);
  graphalloc_torch_shim_free(p, 4096, 0, Native());
}

}  // namespace
}  // namespace graphalloc

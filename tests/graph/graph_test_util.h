// Shared pieces of the graph-layer tests: a fixture with an allocator, a caller stream and a log capture,
// host <-> device float helpers, and small tree functions (built from the tiny kernels) with their host
// references. Every function computes each element with one rounded multiply and one rounded add, exactly
// as the reference below does, so outputs are compared for equality on both devices.
#ifndef GRAPHALLOC_TESTS_GRAPH_GRAPH_TEST_UTIL_H_
#define GRAPHALLOC_TESTS_GRAPH_GRAPH_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "examples/kernels/tiny_kernels.h"
#include "graphalloc/allocator/base/status_macros.h"
#include "graphalloc/graph/graph_tree.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/status_macros.h"

namespace graphalloc::testing {

inline constexpr std::size_t kN = 1024;  // floats per test buffer
inline constexpr std::size_t kBytes = kN * sizeof(float);

class GraphFixture : public AllocatorFixture {
 protected:
  void SetUp() override {
    MakeAllocator();
    if (driver_ == nullptr) GTEST_SKIP() << skip_reason_;
    ASSERT_OK(PreloadTinyKernels(*driver_));
    caller_ = NewStream();
  }

  void TearDown() override {
    if (driver_ != nullptr) {
      (void)driver_->DeviceSynchronize();
      for (DevicePtr p : owned_) EXPECT_TRUE(allocator_->Free(p).ok());
    }
    AllocatorFixture::TearDown();
  }

  // Options whose log goes to log_ (and warnings_).
  TreeOptions CapturingOptions() {
    TreeOptions options;
    options.log = [this](TreeLogLevel level, std::string_view message) {
      if (level == TreeLogLevel::kWarning) warnings_.emplace_back(message);
      log_.emplace_back(message);
    };
    return options;
  }

  std::unique_ptr<GraphTree> MakeTree(TreeOptions options) {
    absl::StatusOr<std::unique_ptr<GraphTree>> tree = GraphTree::Create(*allocator_, std::move(options));
    EXPECT_TRUE(tree.ok()) << tree.status();
    return tree.ok() ? std::move(*tree) : nullptr;
  }
  std::unique_ptr<GraphTree> MakeTree() { return MakeTree(CapturingOptions()); }

  // A default-pool buffer holding `values` (freed at teardown).
  BufferView Upload(const std::vector<float>& values) {
    absl::StatusOr<DevicePtr> p = allocator_->Allocate(values.size() * sizeof(float), caller_);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {};
    owned_.push_back(*p);
    Overwrite(*p, values);
    return BufferView{*p, values.size() * sizeof(float)};
  }
  // Writes `values` at `ptr` after the caller stream's work.
  void Overwrite(DevicePtr ptr, const std::vector<float>& values) {
    EXPECT_TRUE(driver_->StreamSynchronize(caller_).ok());
    EXPECT_TRUE(driver_->CopyHostToDevice(ptr, values.data(), values.size() * sizeof(float)).ok());
  }
  std::vector<float> Download(DevicePtr ptr, std::size_t n = kN) {
    std::vector<float> out(n);
    EXPECT_TRUE(driver_->StreamSynchronize(caller_).ok());
    EXPECT_TRUE(driver_->CopyDeviceToHost(out.data(), ptr, n * sizeof(float)).ok());
    return out;
  }
  std::vector<float> Read(const TreeOutput& out) {
    absl::StatusOr<DevicePtr> p = out.ptr();
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? Download(*p, out.bytes() / sizeof(float)) : std::vector<float>{};
  }

  // Runs `f` directly (no tree, default pool) on the caller stream: the eager outputs a tree call must match.
  std::vector<std::vector<float>> RunEagerly(const TreeFunction& f, std::vector<BufferView> inputs) {
    absl::StatusOr<std::vector<BufferView>> outs = f(inputs, caller_);
    EXPECT_TRUE(outs.ok()) << outs.status();
    std::vector<std::vector<float>> values;
    if (!outs.ok()) return values;
    for (const BufferView& b : *outs) values.push_back(Download(b.ptr, b.bytes / sizeof(float)));
    for (const BufferView& b : *outs) EXPECT_TRUE(allocator_->Free(b.ptr).ok());
    return values;
  }

  // ---- Tree functions. Each allocates its outputs (and a temporary it frees) with the allocator. ----

  // (x, w) -> alpha * x + w.
  TreeFunction Affine(float alpha) {
    return
        [this, alpha](std::span<const BufferView> in, Stream s) -> absl::StatusOr<std::vector<BufferView>> {
          const std::size_t n = in[0].bytes / sizeof(float);
          GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr tmp, allocator_->Allocate(in[0].bytes, s));
          GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr y, allocator_->Allocate(in[0].bytes, s));
          GRAPHALLOC_RETURN_IF_ERROR(ScaleF32(*driver_, s, tmp, in[0].ptr, n, alpha));
          GRAPHALLOC_RETURN_IF_ERROR(AddF32(*driver_, s, y, tmp, in[1].ptr, n));
          GRAPHALLOC_RETURN_IF_ERROR(allocator_->Free(tmp));
          return std::vector<BufferView>{{y, in[0].bytes}};
        };
  }
  std::vector<std::string> warnings_;
  std::vector<std::string> log_;
  Stream caller_ = kDefaultStream;
  std::vector<DevicePtr> owned_;
};

// A fixture with one tree (made with CapturingOptions) and helpers to register functions and find sites.
class TreeTest : public GraphFixture {
 protected:
  void SetUp() override {
    GraphFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    tree_ = MakeTree();
    ASSERT_NE(tree_, nullptr);
  }
  void TearDown() override {
    tree_.reset();
    GraphFixture::TearDown();
  }

  FunctionId Register(TreeFunction f, std::string name, std::vector<std::size_t> static_inputs = {},
                      int warmup_calls = 1) {
    return RegisterWith(std::move(f), FunctionOptions{.name = std::move(name),
                                                      .static_inputs = std::move(static_inputs),
                                                      .warmup_calls = warmup_calls});
  }
  FunctionId RegisterWith(TreeFunction f, FunctionOptions options) {
    absl::StatusOr<FunctionId> id = tree_->Register(std::move(f), std::move(options));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }
  const TreeDumpSite* Site(const TreeDump& d, std::uint64_t parent, FunctionId f) {
    const TreeDumpSite* s = d.FindSite(parent, f);
    EXPECT_NE(s, nullptr) << FormatTreeDump(d);
    return s;
  }

  std::unique_ptr<GraphTree> tree_;
};

// Host reference of Affine: alpha * x + w, one rounding per operation.
inline std::vector<float> AffineRef(float alpha, const std::vector<float>& x, const std::vector<float>& w) {
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const volatile float t = alpha * x[i];  // volatile: never contracted into a fused multiply-add
    y[i] = t + w[i];
  }
  return y;
}

// Values that differ per buffer (`seed`) and per element, exact in float.
inline std::vector<float> Values(int seed, std::size_t n = kN) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((seed * 131 + static_cast<int>(i) * 7) % 1000) / 8.0f;
  return v;
}

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_GRAPH_GRAPH_TEST_UTIL_H_

// Tests of CudaDriver, the real CUDA driver backend.
//
// On the simulated entry (no GPU on CI) they check the missing-driver path: a clear Unavailable error and no
// crash. On the GPU entry (GRAPHALLOC_TEST_DEVICE=cuda) they check what only the real driver can show: the
// numbers it reports, a VMM round trip, error text, and who owns host closures captured into graphs.
#include "graphalloc/allocator/device/cuda_driver.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/device/driver_error.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kMissingLibrary[] = "libgraphalloc-no-such-driver.so";
constexpr std::size_t kMiB = std::size_t{1} << 20;

bool OnGpuEntry() { return testing::TestDeviceKind() == "cuda"; }

// True when libcuda.so.1 genuinely cannot be loaded here (then the default path must report Unavailable).
bool SystemDriverMissing() {
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return true;
  dlclose(library);
  return false;
}

// Runs in a forked child (a death test re-executes the binary), where no driver has been loaded yet: the
// library override is only effective before the first successful load.
void CheckMissingLibraryAndExit() {
  CudaDriver::SetLibraryPathForTesting(kMissingLibrary);
  absl::StatusOr<std::unique_ptr<CudaDriver>> driver = CudaDriver::Create(0);
  absl::StatusOr<int> count = CudaDriver::DeviceCount();
  std::cerr << "Create: " << driver.status().message() << "\n";
  const bool ok = absl::IsUnavailable(driver.status()) && absl::IsUnavailable(count.status()) &&
                  driver.status().message() == count.status().message() &&
                  absl::StrContains(driver.status().message(), "CUDA driver not available") &&
                  absl::StrContains(driver.status().message(), kMissingLibrary);
  std::exit(ok ? 0 : 1);
}

TEST(CudaDriverMissingTest, NamedLibraryMissingIsUnavailableInChildProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(CheckMissingLibraryAndExit(), ::testing::ExitedWithCode(0),
              "Create: CUDA driver not available: dlopen\\(libgraphalloc-no-such-driver.so\\) failed");
}

TEST(CudaDriverMissingTest, DefaultLibraryMissingIsUnavailable) {
  if (OnGpuEntry()) GTEST_SKIP() << "the GPU entry has a driver";
  if (!SystemDriverMissing()) GTEST_SKIP() << "libcuda.so.1 can be loaded on this machine";
  // Twice: a failed load is not remembered as success and leaves nothing half-initialised behind.
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<std::unique_ptr<CudaDriver>> driver = CudaDriver::Create(0);
    ASSERT_TRUE(absl::IsUnavailable(driver.status())) << driver.status();
    EXPECT_THAT(std::string(driver.status().message()),
                StartsWith("CUDA driver not available: dlopen(libcuda.so.1) failed: "));
    EXPECT_THAT(std::string(driver.status().message()), HasSubstr("--device sim"));
    absl::StatusOr<int> count = CudaDriver::DeviceCount();
    EXPECT_TRUE(absl::IsUnavailable(count.status())) << count.status();
  }
}

TEST(CudaDriverMissingTest, NamedLibraryMissingIsUnavailableInProcess) {
  if (OnGpuEntry()) GTEST_SKIP() << "the real driver may already be loaded in this process";
  if (!SystemDriverMissing()) GTEST_SKIP() << "libcuda.so.1 can be loaded on this machine";
  CudaDriver::SetLibraryPathForTesting(kMissingLibrary);
  absl::StatusOr<std::unique_ptr<CudaDriver>> driver = CudaDriver::Create(0);
  CudaDriver::SetLibraryPathForTesting(nullptr);
  ASSERT_TRUE(absl::IsUnavailable(driver.status())) << driver.status();
  EXPECT_THAT(std::string(driver.status().message()), HasSubstr(kMissingLibrary));
}

// ---- GPU-only tests. ----

#define GRAPHALLOC_REQUIRE_GPU(driver)                                                   \
  if (!OnGpuEntry()) GTEST_SKIP() << "GPU test (runs with GRAPHALLOC_TEST_DEVICE=cuda)"; \
  absl::StatusOr<std::unique_ptr<CudaDriver>> driver##_or = CudaDriver::Create(0);       \
  if (absl::IsUnavailable(driver##_or.status())) GTEST_SKIP() << driver##_or.status();   \
  ASSERT_TRUE(driver##_or.ok()) << driver##_or.status();                                 \
  CudaDriver& driver = **driver##_or

// Counts live copies of the closures a test hands the driver, to prove who frees them and when.
struct LiveToken {
  static std::atomic<int> live;
  LiveToken() { ++live; }
  LiveToken(const LiveToken&) { ++live; }
  LiveToken(LiveToken&&) noexcept { ++live; }
  ~LiveToken() { --live; }
};
std::atomic<int> LiveToken::live{0};

// A thread-safe record of which closures ran, in order (they run on the driver's callback thread).
class RunLog {
 public:
  void Add(char c) {
    MutexLock lock(&mu_);
    text_.push_back(c);
  }
  std::string Text() {
    MutexLock lock(&mu_);
    return text_;
  }

 private:
  Mutex mu_;
  std::string text_;
};

HostFunction Logging(RunLog& log, char c) {
  return [token = LiveToken{}, &log, c] { log.Add(c); };
}

TEST(CudaDriverGpuTest, InfoReportsTheDriversNumbers) {
  GRAPHALLOC_REQUIRE_GPU(driver);
  const DeviceInfo& info = driver.Info();
  std::cout << "device " << info.ordinal << ": " << info.name << ", total " << info.total_memory
            << " bytes, granularity " << info.granularity << " (recommended " << info.recommended_granularity
            << "), compute capability " << info.compute_capability_major << "."
            << info.compute_capability_minor << "\n";
  ::testing::Test::RecordProperty("device_name", info.name);
  ::testing::Test::RecordProperty("total_memory", std::to_string(info.total_memory));
  ::testing::Test::RecordProperty("granularity", std::to_string(info.granularity));
  EXPECT_EQ(driver.Kind(), "cuda");
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.total_memory, 0u);
  EXPECT_GT(info.granularity, 0u);
  EXPECT_EQ(info.granularity & (info.granularity - 1), 0u) << "granularity is a power of two";
  EXPECT_GE(info.recommended_granularity, info.granularity);
  EXPECT_GE(info.compute_capability_major, 1);
  if (info.name.find("H100") != std::string::npos) {
    EXPECT_EQ(info.granularity, 2 * kMiB);
    EXPECT_EQ(info.compute_capability_major, 9);
  }
  absl::StatusOr<MemoryInfo> memory = driver.GetMemoryInfo();
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_GT(memory->free, 0u);
  EXPECT_LE(memory->free, memory->total);
  absl::StatusOr<int> count = CudaDriver::DeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_GE(*count, 1);
}

TEST(CudaDriverGpuTest, BadOrdinalNamesTheDeviceCount) {
  GRAPHALLOC_REQUIRE_GPU(driver);
  EXPECT_EQ(driver.Ordinal(), 0);
  absl::StatusOr<std::unique_ptr<CudaDriver>> bad = CudaDriver::Create(1000);
  ASSERT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("device(s)"));
}

TEST(CudaDriverGpuTest, VmmRoundTripFromAThreadWithNoContext) {
  GRAPHALLOC_REQUIRE_GPU(driver);
  // A fresh thread has no current context: the driver must make its own current.
  absl::Status result;
  std::thread([&] {
    result = [&]() -> absl::Status {
      const std::size_t size = driver.Info().granularity;
      absl::StatusOr<DevicePtr> va = driver.AddressReserve(2 * size, 0);
      if (!va.ok()) return va.status();
      absl::StatusOr<PhysicalHandle> handle = driver.MemCreate(size);
      if (!handle.ok()) return handle.status();
      // The same handle at two addresses: both see one write.
      for (DevicePtr at : {*va, *va + size}) {
        if (absl::Status s = driver.MemMap(at, size, *handle); !s.ok()) return s;
      }
      if (absl::Status s = driver.MemSetAccess(*va, 2 * size, {}); !s.ok()) return s;
      std::vector<std::uint8_t> pattern(size), back(size, 0);
      for (std::size_t i = 0; i < size; ++i) pattern[i] = static_cast<std::uint8_t>(i * 7 + 3);
      if (absl::Status s = driver.CopyHostToDevice(*va, pattern.data(), size); !s.ok()) return s;
      if (absl::Status s = driver.CopyDeviceToHost(back.data(), *va + size, size); !s.ok()) return s;
      EXPECT_EQ(back, pattern);
      if (absl::Status s = driver.MemsetAsync(*va, 0xAB, size, kDefaultStream); !s.ok()) return s;
      if (absl::Status s = driver.StreamSynchronize(kDefaultStream); !s.ok()) return s;
      if (absl::Status s = driver.CopyDeviceToHost(back.data(), *va, size); !s.ok()) return s;
      EXPECT_EQ(back, std::vector<std::uint8_t>(size, 0xAB));
      if (absl::Status s = driver.MemUnmap(*va, 2 * size); !s.ok()) return s;
      if (absl::Status s = driver.MemRelease(*handle); !s.ok()) return s;
      return driver.AddressFree(*va, 2 * size);
    }();
  }).join();
  EXPECT_TRUE(result.ok()) << result;
}

TEST(CudaDriverGpuTest, PlainAllocationAndAsyncCopy) {
  GRAPHALLOC_REQUIRE_GPU(driver);
  absl::StatusOr<DevicePtr> a = driver.MemAlloc(kMiB);
  absl::StatusOr<DevicePtr> b = driver.MemAlloc(kMiB);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  absl::StatusOr<Stream> stream = driver.StreamCreate();
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE(driver.MemsetAsync(*a, 0x5A, kMiB, *stream).ok());
  ASSERT_TRUE(driver.CopyAsync(*b, *a, kMiB, *stream).ok());
  ASSERT_TRUE(driver.StreamSynchronize(*stream).ok());
  std::vector<std::uint8_t> back(kMiB);
  ASSERT_TRUE(driver.CopyDeviceToHost(back.data(), *b, kMiB).ok());
  EXPECT_EQ(back, std::vector<std::uint8_t>(kMiB, 0x5A));
  EXPECT_TRUE(driver.StreamDestroy(*stream).ok());
  EXPECT_TRUE(driver.MemFree(*a).ok());
  EXPECT_TRUE(driver.MemFree(*b).ok());
}

TEST(CudaDriverGpuTest, BadMapNamesTheCallAndTheCudaError) {
  GRAPHALLOC_REQUIRE_GPU(driver);
  const std::size_t size = driver.Info().granularity;
  absl::StatusOr<DevicePtr> va = driver.AddressReserve(2 * size, 0);
  ASSERT_TRUE(va.ok()) << va.status();
  absl::StatusOr<PhysicalHandle> handle = driver.MemCreate(size);
  ASSERT_TRUE(handle.ok()) << handle.status();
  // An address that is not a multiple of the granularity: the driver refuses it.
  absl::Status status = driver.MemMap(*va + 4096, size, *handle);
  ASSERT_FALSE(status.ok());
  std::cout << "bad map: " << status.message() << "\n";
  std::optional<int> code = DriverErrorCode(status);
  ASSERT_TRUE(code.has_value());
  EXPECT_THAT(std::string(status.message()), StartsWith("cuMemMap failed: CUDA_ERROR_"));
  EXPECT_THAT(std::string(status.message()), HasSubstr(std::string(DriverResultName(*code))));
  EXPECT_EQ(*code, static_cast<int>(DriverResult::kInvalidValue));
  EXPECT_EQ(status.message(), "cuMemMap failed: CUDA_ERROR_INVALID_VALUE (invalid argument)");
  EXPECT_TRUE(driver.MemRelease(*handle).ok());
  EXPECT_TRUE(driver.AddressFree(*va, 2 * size).ok());
}

TEST(CudaDriverGpuTest, UncapturedHostFunctionRunsOnceAndIsFreed) {
  GRAPHALLOC_REQUIRE_GPU(driver);
  RunLog log;
  absl::StatusOr<Stream> stream = driver.StreamCreate();
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE(driver.LaunchHostFunction(*stream, Logging(log, 'a')).ok());
  ASSERT_TRUE(driver.StreamSynchronize(*stream).ok());
  EXPECT_EQ(log.Text(), "a");
  EXPECT_EQ(LiveToken::live.load(), 0);
  EXPECT_TRUE(driver.StreamDestroy(*stream).ok());
}

TEST(CudaDriverGpuTest, EventQueryReportsNotReadyThenReady) {
  GRAPHALLOC_REQUIRE_GPU(driver);
  absl::StatusOr<Stream> stream = driver.StreamCreate();
  absl::StatusOr<Event> event = driver.EventCreate();
  ASSERT_TRUE(stream.ok() && event.ok());
  std::atomic<bool> release{false};
  // Holds the stream until the test lets go, so the event after it stays incomplete.
  ASSERT_TRUE(driver
                  .LaunchHostFunction(*stream,
                                      [&release] {
                                        while (!release.load()) std::this_thread::yield();
                                      })
                  .ok());
  ASSERT_TRUE(driver.EventRecord(*event, *stream).ok());
  absl::StatusOr<bool> done = driver.EventQuery(*event);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(*done);
  release = true;
  ASSERT_TRUE(driver.EventSynchronize(*event).ok());
  done = driver.EventQuery(*event);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);
  EXPECT_TRUE(driver.EventDestroy(*event).ok());
  EXPECT_TRUE(driver.StreamDestroy(*stream).ok());
}

TEST(CudaDriverGpuTest, CapturedClosuresRunOnEachLaunchAndLiveUntilGraphAndExecAreGone) {
  GRAPHALLOC_REQUIRE_GPU(driver);
  RunLog log;
  absl::StatusOr<Stream> stream = driver.StreamCreate();
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE(driver.BeginCapture(*stream, CaptureMode::kGlobal).ok());
  absl::StatusOr<CaptureInfo> capture = driver.GetCaptureInfo(*stream);
  ASSERT_TRUE(capture.ok()) << capture.status();
  EXPECT_EQ(capture->status, CaptureStatus::kActive);
  EXPECT_NE(capture->id, 0u);
  ASSERT_TRUE(driver.LaunchHostFunction(*stream, Logging(log, 'a')).ok());
  ASSERT_TRUE(driver.LaunchHostFunction(*stream, Logging(log, 'b')).ok());
  absl::StatusOr<Graph> graph = driver.EndCapture(*stream);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(log.Text(), "") << "captured work must not run before a launch";
  EXPECT_EQ(LiveToken::live.load(), 2);
  capture = driver.GetCaptureInfo(*stream);
  ASSERT_TRUE(capture.ok());
  EXPECT_EQ(capture->status, CaptureStatus::kNone);

  absl::StatusOr<GraphExec> exec = driver.GraphInstantiate(*graph);
  ASSERT_TRUE(exec.ok()) << exec.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(driver.GraphLaunch(*exec, *stream).ok());
  ASSERT_TRUE(driver.StreamSynchronize(*stream).ok());
  EXPECT_EQ(log.Text(), "ababab");

  // The exec still runs the closures after the graph is gone...
  ASSERT_TRUE(driver.GraphDestroy(*graph).ok());
  EXPECT_EQ(LiveToken::live.load(), 2);
  ASSERT_TRUE(driver.GraphLaunch(*exec, *stream).ok());
  ASSERT_TRUE(driver.StreamSynchronize(*stream).ok());
  EXPECT_EQ(log.Text(), "abababab");
  // ...and they are freed with the last of them.
  ASSERT_TRUE(driver.GraphExecDestroy(*exec).ok());
  EXPECT_EQ(LiveToken::live.load(), 0);
  EXPECT_TRUE(driver.StreamDestroy(*stream).ok());
}

TEST(CudaDriverGpuTest, InvalidatedCaptureReportsItAndFreesItsClosures) {
  GRAPHALLOC_REQUIRE_GPU(driver);
  RunLog log;
  absl::StatusOr<Stream> stream = driver.StreamCreate();
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE(driver.BeginCapture(*stream, CaptureMode::kGlobal).ok());
  ASSERT_TRUE(driver.LaunchHostFunction(*stream, Logging(log, 'a')).ok());
  EXPECT_EQ(LiveToken::live.load(), 1);
  // Synchronizing a capturing stream is refused and invalidates the capture.
  absl::Status sync = driver.StreamSynchronize(*stream);
  EXPECT_FALSE(sync.ok());
  EXPECT_EQ(DriverErrorCode(sync), static_cast<int>(DriverResult::kStreamCaptureUnsupported)) << sync;
  absl::StatusOr<CaptureInfo> capture = driver.GetCaptureInfo(*stream);
  ASSERT_TRUE(capture.ok()) << capture.status();
  EXPECT_EQ(capture->status, CaptureStatus::kInvalidated);
  absl::StatusOr<Graph> graph = driver.EndCapture(*stream);
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(DriverErrorCode(graph.status()), static_cast<int>(DriverResult::kStreamCaptureInvalidated));
  EXPECT_THAT(std::string(graph.status().message()),
              StartsWith("cuStreamEndCapture failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"));
  EXPECT_EQ(LiveToken::live.load(), 0);
  EXPECT_EQ(log.Text(), "");
  EXPECT_TRUE(driver.StreamDestroy(*stream).ok());
}

// Captures `letters.size()` host nodes, one per letter.
absl::StatusOr<Graph> CaptureLetters(CudaDriver& driver, Stream stream, RunLog& log,
                                     const std::string& letters) {
  if (absl::Status s = driver.BeginCapture(stream, CaptureMode::kThreadLocal); !s.ok()) return s;
  for (char c : letters) {
    if (absl::Status s = driver.LaunchHostFunction(stream, Logging(log, c)); !s.ok()) return s;
  }
  return driver.EndCapture(stream);
}

TEST(CudaDriverGpuTest, GraphExecUpdateKeepsTheNewGraphsClosures) {
  GRAPHALLOC_REQUIRE_GPU(driver);
  RunLog log;
  absl::StatusOr<Stream> stream = driver.StreamCreate();
  ASSERT_TRUE(stream.ok()) << stream.status();
  absl::StatusOr<Graph> first = CaptureLetters(driver, *stream, log, "a");
  absl::StatusOr<Graph> second = CaptureLetters(driver, *stream, log, "b");
  absl::StatusOr<Graph> longer = CaptureLetters(driver, *stream, log, "cd");
  ASSERT_TRUE(first.ok() && second.ok() && longer.ok())
      << first.status() << second.status() << longer.status();
  absl::StatusOr<GraphExec> exec = driver.GraphInstantiate(*first);
  ASSERT_TRUE(exec.ok()) << exec.status();

  absl::StatusOr<GraphUpdateResult> update = driver.GraphExecUpdate(*exec, *second);
  ASSERT_TRUE(update.ok()) << update.status();
  EXPECT_EQ(*update, GraphUpdateResult::kSuccess);
  update = driver.GraphExecUpdate(*exec, *longer);
  ASSERT_TRUE(update.ok()) << update.status() << " (a refused update is a result, not an error)";
  EXPECT_EQ(*update, GraphUpdateResult::kTopologyChanged);

  // The exec now runs `second`'s closure, which must outlive `second` itself.
  ASSERT_TRUE(driver.GraphDestroy(*second).ok());
  ASSERT_TRUE(driver.GraphDestroy(*longer).ok());
  ASSERT_TRUE(driver.GraphLaunch(*exec, *stream).ok());
  ASSERT_TRUE(driver.StreamSynchronize(*stream).ok());
  EXPECT_EQ(log.Text(), "b");
  ASSERT_TRUE(driver.GraphDestroy(*first).ok());
  ASSERT_TRUE(driver.GraphExecDestroy(*exec).ok());
  EXPECT_EQ(LiveToken::live.load(), 0);
  EXPECT_TRUE(driver.StreamDestroy(*stream).ok());
}

}  // namespace
}  // namespace graphalloc

// A Generator drawn from inside a raw CUDA graph capture (a capture session or the driver's, not the graph
// tree) that it takes no part in is an error naming the generator and the capture, never a graph with its
// eager (seed, offset) baked in (every replay would draw the same numbers, where PyTorch raises or registers
// the generator). Both ways to draw are checked: Reserve with the launch stream, and the random ops given a
// generator's eager values on a capturing stream. A generator that takes part (BeginCapture) still draws,
// and outside captures nothing changes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "graphalloc/rng/generator.h"
#include "graphalloc/rng/random_ops.h"
#include "tests/rng/rng_test_util.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using rng_test::DeviceBuffer;
using ::testing::HasSubstr;

constexpr std::size_t kN = 1024;

TEST(GeneratorCaptureTest, ReservingForACaptureTheGeneratorIsNotInIsAnErrorNamingIt) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  absl::StatusOr<Stream> stream = driver->StreamCreate();
  ASSERT_TRUE(stream.ok());
  Generator gen(driver, 7);
  ASSERT_TRUE(gen.Reserve(4).ok());
  ASSERT_TRUE(driver->BeginCapture(*stream, CaptureMode::kThreadLocal).ok());
  absl::StatusOr<CaptureInfo> info = driver->GetCaptureInfo(*stream);
  ASSERT_TRUE(info.ok());
  absl::StatusOr<PhiloxArgs> args = gen.Reserve(PhiloxIncrement(kN), *stream);
  ASSERT_EQ(args.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      args.status().message(),
      HasSubstr(absl::StrCat("generator ", gen.id(), " is drawn from during a CUDA graph capture (capture ",
                             info->id, ") it does not take part in")));
  EXPECT_THAT(args.status().message(), HasSubstr("every replay would draw the same numbers"));
  EXPECT_EQ(gen.host_offset(), 4u);  // nothing reserved
  absl::StatusOr<Graph> graph = driver->EndCapture(*stream);
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(driver->GraphDestroy(*graph).ok());
  // Outside the capture the same call draws as before.
  absl::StatusOr<PhiloxArgs> eager = gen.Reserve(PhiloxIncrement(kN), *stream);
  ASSERT_TRUE(eager.ok()) << eager.status();
  EXPECT_FALSE(eager->captured);
  EXPECT_EQ(eager->offset, 4u);
  EXPECT_EQ(eager->generator, gen.id());
  ASSERT_TRUE(driver->StreamDestroy(*stream).ok());
}

TEST(GeneratorCaptureTest, ARandomOpGivenEagerValuesOfAGeneratorOnACapturingStreamIsRefused) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  absl::StatusOr<Stream> stream = driver->StreamCreate();
  ASSERT_TRUE(stream.ok());
  DeviceBuffer out(*driver, kN * 4), in(*driver, kN * 4);
  Generator gen(driver, 8);
  // Reserved before the capture began (or without the stream): the op itself sees the capture.
  absl::StatusOr<PhiloxArgs> args = gen.Reserve(PhiloxIncrement(kN));
  ASSERT_TRUE(args.ok());
  ASSERT_TRUE(driver->BeginCapture(*stream, CaptureMode::kThreadLocal).ok());
  const absl::Status fill = FillUniform(*driver, *stream, out.get(), kN, DType::kFloat32, *args);
  EXPECT_EQ(fill.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fill.message(), HasSubstr(absl::StrCat("FillUniform on stream ")));
  EXPECT_THAT(fill.message(),
              HasSubstr(absl::StrCat("generator ", gen.id(), "'s values (seed 8, offset 0)")));
  EXPECT_EQ(DropoutForward(*driver, *stream, in.get(), out.get(), kN, DType::kFloat32, 0.5f, *args).code(),
            absl::StatusCode::kFailedPrecondition);
  // Values made by hand are the caller's choice (no generator to name), and a backward recomputes its
  // forward's mask, whatever values that had.
  EXPECT_TRUE(FillUniform(*driver, *stream, out.get(), kN, DType::kFloat32, PhiloxArgs::Eager(8, 0)).ok());
  EXPECT_TRUE(DropoutBackward(*driver, *stream, in.get(), out.get(), kN, DType::kFloat32, 0.5f, *args).ok());
  absl::StatusOr<Graph> graph = driver->EndCapture(*stream);
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(driver->GraphDestroy(*graph).ok());
  ASSERT_TRUE(driver->StreamDestroy(*stream).ok());
}

TEST(GeneratorCaptureTest, AGeneratorThatTakesPartDrawsDuringTheCapture) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  absl::StatusOr<Stream> stream = driver->StreamCreate();
  ASSERT_TRUE(stream.ok());
  DeviceBuffer out(*driver, kN * 4);
  Generator gen(driver, 9);
  ASSERT_TRUE(gen.BeginCapture(1).ok());
  ASSERT_TRUE(driver->BeginCapture(*stream, CaptureMode::kThreadLocal).ok());
  absl::StatusOr<PhiloxArgs> args = gen.Reserve(PhiloxIncrement(kN), *stream);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->captured);
  EXPECT_TRUE(FillUniform(*driver, *stream, out.get(), kN, DType::kFloat32, *args).ok());
  absl::StatusOr<Graph> graph = driver->EndCapture(*stream);
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(gen.EndCapture().ok());
  ASSERT_TRUE(driver->GraphDestroy(*graph).ok());
  ASSERT_TRUE(driver->StreamDestroy(*stream).ok());
}

}  // namespace
}  // namespace graphalloc

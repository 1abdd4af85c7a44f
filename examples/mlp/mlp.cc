#include "examples/mlp/mlp.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "examples/kernels/tiny_kernels.h"
#include "examples/mlp/mlp_kernels.h"
#include "graphalloc/rng/random_ops.h"

// Early returns for the kernels' statuses.
#define MLP_TRY(expr)                                 \
  do {                                                \
    if (absl::Status mlp_s_ = (expr); !mlp_s_.ok()) { \
      return mlp_s_;                                  \
    }                                                 \
  } while (false)
#define MLP_CONCAT_(a, b) a##b
#define MLP_CONCAT(a, b) MLP_CONCAT_(a, b)
#define MLP_ASSIGN(lhs, expr) MLP_ASSIGN_(MLP_CONCAT(mlp_r_, __LINE__), lhs, expr)
#define MLP_ASSIGN_(var, lhs, expr)   \
  auto var = (expr);                  \
  if (!var.ok()) return var.status(); \
  lhs = std::move(*var)

namespace graphalloc::mlp {
namespace {

constexpr std::size_t kFloat = sizeof(float);

// The dimensions as the kernels take them.
struct Dims {
  std::uint32_t b, i, h, o;
  explicit Dims(const MlpConfig& c) : b(c.batch), i(c.in), h(c.hidden), o(c.out) {}
};

// Buffers of one call, allocated on its stream; Free() returns the temporaries before the call ends (a
// recording must not keep them), and on an error the destructor frees everything it still holds.
class Buffers {
 public:
  Buffers(CachingAllocator& allocator, Stream stream) : allocator_(allocator), stream_(stream) {}
  ~Buffers() {
    for (DevicePtr p : held_) (void)allocator_.Free(p);
  }
  absl::StatusOr<DevicePtr> Get(std::size_t floats) {
    absl::StatusOr<DevicePtr> p = allocator_.Allocate(floats * kFloat, stream_);
    if (p.ok()) held_.push_back(*p);
    return p;
  }
  // Hands `p` to the caller (an output): no longer freed here.
  BufferView Keep(DevicePtr p, std::size_t floats) {
    std::erase(held_, p);
    return BufferView{p, floats * kFloat};
  }
  absl::Status Free(DevicePtr p) {
    std::erase(held_, p);
    return allocator_.Free(p);
  }

 private:
  CachingAllocator& allocator_;
  const Stream stream_;
  std::vector<DevicePtr> held_;
};

// The hidden layer: a = relu(x W1^T + b1), d = dropout(a) with `args`.
absl::Status HiddenLayer(Driver& driver, Stream s, Buffers& buf, const Dims& d, const MlpConfig& c,
                         std::span<const BufferView> params, DevicePtr x, DevicePtr a, DevicePtr dropped,
                         const PhiloxArgs& args) {
  MLP_ASSIGN(const DevicePtr h, buf.Get(std::size_t{d.b} * d.h));
  MLP_TRY(
      Run(driver, s, mlp_body::LinearForward{F(h), F(x), F(params[0].ptr), F(params[1].ptr), d.b, d.i, d.h}));
  MLP_TRY(Run(driver, s, mlp_body::Relu{F(a), F(h), std::uint64_t{d.b} * d.h}));
  MLP_TRY(buf.Free(h));
  return DropoutForward(driver, s, a, dropped, std::size_t{d.b} * d.h, DType::kFloat32, c.dropout, args);
}

}  // namespace

ForwardFunction MlpForward(CachingAllocator& allocator, const MlpConfig& config) {
  return [&allocator, config](const ForwardArgs& args) -> absl::StatusOr<ForwardResult> {
    Driver& driver = allocator.driver();
    const Dims d(config);
    const Stream s = args.stream;
    Buffers buf(allocator, s);
    const std::size_t nx = std::size_t{d.b} * d.i, nh = std::size_t{d.b} * d.h, ny = std::size_t{d.b} * d.o;
    // The inputs are the graph's own copies, which the next call overwrites: the backward gets copies.
    MLP_ASSIGN(const DevicePtr x, buf.Get(nx));
    MLP_ASSIGN(const DevicePtr t, buf.Get(ny));
    MLP_TRY(driver.CopyAsync(x, args.inputs[0].ptr, nx * kFloat, s));
    MLP_TRY(driver.CopyAsync(t, args.inputs[1].ptr, ny * kFloat, s));
    MLP_ASSIGN(const DevicePtr a, buf.Get(nh));
    MLP_ASSIGN(const DevicePtr dropped, buf.Get(nh));
    MLP_ASSIGN(const PhiloxArgs mask, args.generator(0).Reserve(PhiloxIncrement(nh)));
    MLP_TRY(HiddenLayer(driver, s, buf, d, config, args.params, x, a, dropped, mask));
    MLP_ASSIGN(const DevicePtr y, buf.Get(ny));
    MLP_TRY(Run(driver, s,
                mlp_body::LinearForward{F(y), F(dropped), F(args.params[2].ptr), F(args.params[3].ptr), d.b,
                                        d.h, d.o}));
    MLP_ASSIGN(const DevicePtr loss, buf.Get(1));
    MLP_TRY(Run(driver, s, mlp_body::MseLoss{F(loss), F(y), F(t), ny, 1.0f / static_cast<float>(ny)}));
    ForwardResult result;
    result.outputs = {buf.Keep(loss, 1)};
    if (config.recompute) {  // activation checkpointing: keep only what the recomputation starts from
      MLP_TRY(buf.Free(a));
      MLP_TRY(buf.Free(dropped));
      MLP_TRY(buf.Free(y));
      result.saved = {buf.Keep(x, nx), buf.Keep(t, ny)};
    } else {
      result.saved = {buf.Keep(x, nx), buf.Keep(t, ny), buf.Keep(a, nh), buf.Keep(dropped, nh),
                      buf.Keep(y, ny)};
    }
    return result;
  };
}

BackwardFunction MlpBackward(CachingAllocator& allocator, const MlpConfig& config) {
  return [&allocator, config](const BackwardArgs& args) -> absl::StatusOr<std::vector<BufferView>> {
    Driver& driver = allocator.driver();
    const Dims d(config);
    const Stream s = args.stream;
    Buffers buf(allocator, s);
    const std::size_t nh = std::size_t{d.b} * d.h, ny = std::size_t{d.b} * d.o;
    const DevicePtr x = args.saved[0].ptr, t = args.saved[1].ptr;
    DevicePtr a = 0, dropped = 0, y = 0;
    // The dropout mask: reserved exactly as the forward did, from the backward generator, which the step
    // positioned at this forward's start, so the PhiloxArgs unpack to the forward's (seed, offset).
    MLP_ASSIGN(const PhiloxArgs mask, args.generator(0).Reserve(PhiloxIncrement(nh)));
    if (config.recompute) {
      MLP_ASSIGN(a, buf.Get(nh));
      MLP_ASSIGN(dropped, buf.Get(nh));
      MLP_TRY(HiddenLayer(driver, s, buf, d, config, args.params, x, a, dropped, mask));
      MLP_ASSIGN(y, buf.Get(ny));
      MLP_TRY(Run(driver, s,
                  mlp_body::LinearForward{F(y), F(dropped), F(args.params[2].ptr), F(args.params[3].ptr), d.b,
                                          d.h, d.o}));
    } else {
      a = args.saved[2].ptr;
      dropped = args.saved[3].ptr;
      y = args.saved[4].ptr;
    }
    MLP_ASSIGN(const DevicePtr gy, buf.Get(ny));
    MLP_TRY(Run(driver, s,
                mlp_body::MseGrad{F(gy), F(y), F(t), F(args.grad_outputs[0].ptr), ny,
                                  2.0f / static_cast<float>(ny)}));
    MLP_ASSIGN(const DevicePtr gw2, buf.Get(std::size_t{d.o} * d.h));
    MLP_ASSIGN(const DevicePtr gb2, buf.Get(d.o));
    MLP_TRY(Run(driver, s, mlp_body::LinearGradWeight{F(gw2), F(gy), F(dropped), d.b, d.h, d.o}));
    MLP_TRY(Run(driver, s, mlp_body::ColumnSum{F(gb2), F(gy), d.b, d.o}));
    MLP_ASSIGN(const DevicePtr gd, buf.Get(nh));
    MLP_TRY(Run(driver, s, mlp_body::LinearGradInput{F(gd), F(gy), F(args.params[2].ptr), d.b, d.h, d.o}));
    MLP_TRY(buf.Free(gy));
    MLP_TRY(DropoutBackward(driver, s, gd, gd, nh, DType::kFloat32, config.dropout, mask));
    MLP_ASSIGN(const DevicePtr gh, buf.Get(nh));
    MLP_TRY(Run(driver, s, mlp_body::ReluGrad{F(gh), F(gd), F(a), nh}));
    MLP_TRY(buf.Free(gd));
    MLP_ASSIGN(const DevicePtr gw1, buf.Get(std::size_t{d.h} * d.i));
    MLP_ASSIGN(const DevicePtr gb1, buf.Get(d.h));
    MLP_TRY(Run(driver, s, mlp_body::LinearGradWeight{F(gw1), F(gh), F(x), d.b, d.i, d.h}));
    MLP_TRY(Run(driver, s, mlp_body::ColumnSum{F(gb1), F(gh), d.b, d.h}));
    MLP_TRY(buf.Free(gh));
    if (config.recompute) {
      MLP_TRY(buf.Free(a));
      MLP_TRY(buf.Free(dropped));
      MLP_TRY(buf.Free(y));
    }
    return std::vector<BufferView>{buf.Keep(gw1, std::size_t{d.h} * d.i), buf.Keep(gb1, d.h),
                                   buf.Keep(gw2, std::size_t{d.o} * d.h), buf.Keep(gb2, d.o)};
  };
}

absl::StatusOr<std::unique_ptr<MlpTrainer>> MlpTrainer::Create(CachingAllocator& allocator,
                                                               std::shared_ptr<Driver> driver,
                                                               MlpConfig config, Stream stream) {
  if (config.micro_batches < 1 || config.data_batches < 1 || config.max_steps == 0 || config.batch == 0 ||
      config.in == 0 || config.hidden == 0 || config.out == 0) {
    return absl::InvalidArgumentError(
        "MlpTrainer: batch, in, hidden, out, micro_batches, data_batches and max_steps must all be at least "
        "1");
  }
  std::unique_ptr<MlpTrainer> trainer(new MlpTrainer(allocator, std::move(driver), config, stream));
  MLP_TRY(trainer->Init());
  return trainer;
}

MlpTrainer::~MlpTrainer() {
  step_.reset();
  (void)driver_->StreamSynchronize(stream_);
  for (DevicePtr p : owned_) (void)allocator_.Free(p);
}

absl::StatusOr<DevicePtr> MlpTrainer::Upload(const std::vector<float>& values) {
  MLP_ASSIGN(const DevicePtr p, allocator_.Allocate(values.size() * kFloat, stream_));
  owned_.push_back(p);
  MLP_TRY(driver_->StreamSynchronize(stream_));
  MLP_TRY(driver_->CopyHostToDevice(p, values.data(), values.size() * kFloat));
  return p;
}

absl::Status MlpTrainer::Init() {
  MLP_TRY(PreloadMlpKernels(*driver_));
  MLP_TRY(testing::PreloadTinyKernels(*driver_));
  const Dims d(config_);
  // Host-made values: the raw 32-bit words of mt19937 (fixed by the standard), scaled exactly, so every
  // platform and both devices start from the same bits.
  std::mt19937 words(static_cast<std::uint32_t>(config_.seed));
  auto uniform = [&](std::size_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = (static_cast<float>(words() >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
    return v;
  };
  const std::size_t sizes[4] = {std::size_t{d.h} * d.i, d.h, std::size_t{d.o} * d.h, d.o};
  const float scales[4] = {1.0f / std::sqrt(static_cast<float>(d.i)), 0.0f,
                           1.0f / std::sqrt(static_cast<float>(d.h)), 0.0f};
  for (int k = 0; k < 4; ++k) {
    MLP_ASSIGN(const DevicePtr p, Upload(uniform(sizes[k], scales[k])));
    params_.push_back(BufferView{p, sizes[k] * kFloat});
    if (config_.micro_batches > 1) {
      MLP_ASSIGN(const DevicePtr acc, Upload(std::vector<float>(sizes[k], 0.0f)));
      accum_.push_back(BufferView{acc, sizes[k] * kFloat});
    }
  }
  // The teacher: t = tanh(x T^T) for a fixed random T, computed on the host.
  const std::vector<float> teacher = uniform(std::size_t{d.o} * d.i, 1.0f);
  for (int k = 0; k < config_.data_batches; ++k) {
    const std::vector<float> x = uniform(std::size_t{d.b} * d.i, 1.0f);
    std::vector<float> t(std::size_t{d.b} * d.o);
    for (std::uint32_t b = 0; b < d.b; ++b) {
      for (std::uint32_t o = 0; o < d.o; ++o) {
        float acc = 0.0f;
        for (std::uint32_t i = 0; i < d.i; ++i) acc += x[b * d.i + i] * teacher[o * d.i + i];
        t[b * d.o + o] = std::tanh(acc / std::sqrt(static_cast<float>(d.i)));
      }
    }
    MLP_ASSIGN(const DevicePtr xp, Upload(x));
    MLP_ASSIGN(const DevicePtr tp, Upload(t));
    inputs_.push_back(BufferView{xp, x.size() * kFloat});
    targets_.push_back(BufferView{tp, t.size() * kFloat});
  }
  MLP_ASSIGN(const DevicePtr one, Upload({1.0f}));
  one_ = BufferView{one, kFloat};
  MLP_ASSIGN(losses_,
             Upload(std::vector<float>(config_.max_steps * static_cast<std::size_t>(config_.micro_batches))));

  const std::uint64_t dropout_seed = config_.seed * 0x9E3779B97F4A7C15ull + 1;
  rng_ = std::make_shared<RngStatePairs>(driver_, std::vector<std::uint64_t>{dropout_seed});
  GraphedStepOptions options;
  options.name = config_.graphed ? "mlp (graphed)" : "mlp (eager)";
  options.graphed = config_.graphed;
  options.rng = rng_;
  MLP_ASSIGN(step_, GraphedStep::Create(allocator_, params_, MlpForward(allocator_, config_),
                                        MlpBackward(allocator_, config_), std::move(options)));
  if (config_.alias_gradients) {
    for (std::size_t slot = 0; slot < 4; ++slot) MLP_TRY(step_->SetAliasGradient(slot, true));
  }
  return absl::OkStatus();
}

absl::Status MlpTrainer::Step() {
  Driver& driver = *driver_;
  const int m = config_.micro_batches;
  for (int k = 0; k < m; ++k) {
    const std::size_t data = static_cast<std::size_t>(micro_batches_run_) % inputs_.size();
    MLP_ASSIGN(const StepForward fwd, step_->Forward({inputs_[data], targets_[data]}, stream_));
    // The loss lives in the step's pool until its lane's next forward: keep a copy in the history.
    MLP_ASSIGN(const DevicePtr loss, fwd.outputs()[0].ptr());
    const std::size_t slot =
        static_cast<std::size_t>(micro_batches_run_) % (config_.max_steps * static_cast<std::size_t>(m));
    MLP_TRY(driver.CopyAsync(losses_ + slot * kFloat, loss, kFloat, stream_));
    MLP_ASSIGN(const std::vector<TreeOutput> grads, step_->Backward(fwd, {one_}, stream_));
    for (std::size_t p = 0; p < params_.size(); ++p) {
      MLP_ASSIGN(const DevicePtr g, grads[p].ptr());
      const std::size_t n = params_[p].bytes / kFloat;
      if (m == 1) {
        MLP_TRY(Run(driver, stream_, mlp_body::Sgd{F(params_[p].ptr), F(g), n, config_.lr}));
      } else if (k == 0) {
        MLP_TRY(driver.CopyAsync(accum_[p].ptr, g, params_[p].bytes, stream_));
      } else {
        MLP_TRY(testing::AddF32(driver, stream_, accum_[p].ptr, accum_[p].ptr, g, n));
      }
    }
    ++micro_batches_run_;
  }
  if (m > 1) {
    for (std::size_t p = 0; p < params_.size(); ++p) {
      MLP_TRY(Run(driver, stream_,
                  mlp_body::Sgd{F(params_[p].ptr), F(accum_[p].ptr), params_[p].bytes / kFloat, config_.lr}));
    }
  }
  ++steps_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> MlpTrainer::Losses() {
  std::vector<float> out(std::min(static_cast<std::size_t>(micro_batches_run_),
                                  config_.max_steps * static_cast<std::size_t>(config_.micro_batches)));
  MLP_TRY(driver_->StreamSynchronize(stream_));
  MLP_TRY(driver_->CopyDeviceToHost(out.data(), losses_, out.size() * kFloat));
  return out;
}

absl::StatusOr<std::vector<std::vector<float>>> MlpTrainer::Parameters() {
  MLP_TRY(driver_->StreamSynchronize(stream_));
  std::vector<std::vector<float>> out;
  for (const BufferView& p : params_) {
    std::vector<float> v(p.bytes / kFloat);
    MLP_TRY(driver_->CopyDeviceToHost(v.data(), p.ptr, p.bytes));
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace graphalloc::mlp

// GPU training-step benchmark: images/s of ResNet forward + backward + the device SGD step on the
// CUDA backend (median and spread over repeats), peak device memory, and the device and pinned
// allocations made by the timed steps, which must be none.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/device_backend.h"
#include "cuda/lowp_backend.h"
#include "cuda/memory.h"
#include "nn/clock.h"
#include "nn/loss_scale.h"
#include "nn/resnet.h"
#include "tools/profile_print.h"

namespace {

struct Args {
  std::string model = "resnet50", precision = "fp32", json, algo_cache;
  int64_t batch = 256, size = 224;
  int warmup = 5, steps = 10, repeats = 3, profile = 0;
  bool fuse = true;
};

[[noreturn]] void usage(int rc) {
  std::printf(
      "usage: bench_gpu_step [--model resnet50] [--batch 256] [--size 224] [--precision fp32|tf32|bf16|fp16]\n"
      "                      [--warmup 5] [--steps 10] [--repeats 3] [--json FILE] [--profile N]\n"
      "                      [--no-fuse] [--algo-cache FILE]\n"
      "Times forward + backward + the fused device SGD (momentum 0.9, wd 1e-4) on one synthetic\n"
      "batch kept on the device; convolution algorithms are timed once per shape at set-up. Each\n"
      "repeat is `steps` steps ended by a device sync. Fails when the timed steps allocate.\n"
      "fp16 adds dynamic loss scaling's work: the loss gradient times 2^16, then the gradients\n"
      "unscaled and checked for overflow on the device before the update (as GradScaler).\n"
      "--profile N: after the timed repeats, N more steps with the device synced around each\n"
      "layer, printed per layer and per kind of layer (PROFILE lines; they time each layer's own\n"
      "work plus a sync's latency, so their total exceeds the step's time).\n"
      "--no-fuse: each batch norm and the residual add after it as two layers, as a backend that\n"
      "does not fuse them runs them (the 16-bit backends fuse them by default).\n"
      "--algo-cache FILE: keep the algorithm choices in FILE (cuda.algo_cache): a later run of the\n"
      "same shapes on this GPU and software takes them instead of timing the candidates again.\n");
  std::exit(rc);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_gpu_step: %s needs a value\n", k.c_str());
        usage(2);
      }
      return argv[++i];
    };
    if (k == "--model") a.model = val();
    else if (k == "--batch") a.batch = std::stoll(val());
    else if (k == "--size") a.size = std::stoll(val());
    else if (k == "--precision") a.precision = val();
    else if (k == "--warmup") a.warmup = std::stoi(val());
    else if (k == "--steps") a.steps = std::stoi(val());
    else if (k == "--repeats") a.repeats = std::stoi(val());
    else if (k == "--json") a.json = val();
    else if (k == "--profile") a.profile = std::stoi(val());
    else if (k == "--no-fuse") a.fuse = false;
    else if (k == "--algo-cache") a.algo_cache = val();
    else if (k == "--help" || k == "-h") usage(0);
    else {
      std::fprintf(stderr, "bench_gpu_step: unknown option %s\n", k.c_str());
      usage(2);
    }
  }
  if (a.precision != "fp32" && a.precision != "tf32" && a.precision != "bf16" && a.precision != "fp16")
    usage(2);
  // The first step grows the gradient slots; it must be outside the allocation count.
  if (a.warmup < 1 || a.steps < 1 || a.repeats < 1 || a.batch < 1 || a.size < 1) {
    std::fprintf(stderr, "bench_gpu_step: --warmup, --steps, --repeats, --batch and --size must be >= 1\n");
    std::exit(2);
  }
  return a;
}

// The CUDA backend with one change: importing the batch does nothing. The benchmark writes its
// synthetic batch into the input tensor once (a Net keeps that tensor to itself), as the PyTorch
// peer keeps its batch on the device, so steps time compute and not a host-to-device copy.
// `fuse` false turns the batch norm + add fusion off.
class ResidentInput final : public rt::Backend<float> {
 public:
  ResidentInput(std::unique_ptr<rt::Backend<float>> in, bool fuse) : in_(std::move(in)), fuse_(fuse) {}
  void upload(const float* nchw, const rt::Shape& s, float* dst) const { in_->act_import(nchw, s, dst); }
  const rt::Backend<float>& inner() const { return *in_; }

  std::string name() const override { return in_->name(); }
  size_t act_size(const rt::Shape& s) const override { return in_->act_size(s); }
  void act_import(const float*, const rt::Shape&, float*) const override {}
  void act_export(const float* src, const rt::Shape& s, float* nchw) const override {
    in_->act_export(src, s, nchw);
  }
  void accumulate(float* y, const float* x, size_t n) const override { in_->accumulate(y, x, n); }
  const rt::MemorySpace* act_memory() const override { return in_->act_memory(); }
  const rt::MemorySpace* param_memory() const override { return in_->param_memory(); }
  void sync() const override { in_->sync(); }
  std::unique_ptr<rt::Optimizer<float>> make_sgd(std::vector<rt::ParamInfo> l, rt::SgdConfig c) override {
    return in_->make_sgd(std::move(l), c);
  }
  size_t scale_count_nonfinite(float* v, size_t n, float s, bool count) override {
    return in_->scale_count_nonfinite(v, n, s, count);
  }
  std::unique_ptr<rt::ConvOp<float>> make_conv(const rt::ConvDesc& d) override { return in_->make_conv(d); }
  std::unique_ptr<rt::BatchNormOp<float>> make_batchnorm(const rt::BatchNormDesc& d) override {
    return in_->make_batchnorm(d);
  }
  bool fuses_bn_add() const override { return fuse_ && in_->fuses_bn_add(); }
  std::unique_ptr<rt::ReluOp<float>> make_relu(const rt::ReluDesc& d) override { return in_->make_relu(d); }
  std::unique_ptr<rt::MaxPoolOp<float>> make_maxpool(const rt::MaxPoolDesc& d) override {
    return in_->make_maxpool(d);
  }
  std::unique_ptr<rt::GlobalAvgPoolOp<float>> make_global_avgpool(const rt::GlobalAvgPoolDesc& d) override {
    return in_->make_global_avgpool(d);
  }
  std::unique_ptr<rt::LinearOp<float>> make_linear(const rt::LinearDesc& d) override {
    return in_->make_linear(d);
  }
  std::unique_ptr<rt::AddOp<float>> make_add(const rt::AddDesc& d) override { return in_->make_add(d); }
  std::unique_ptr<rt::PadShortcutOp<float>> make_pad_shortcut(const rt::PadShortcutDesc& d) override {
    return in_->make_pad_shortcut(d);
  }
  std::unique_ptr<rt::SoftmaxXentOp<float>> make_softmax_xent(const rt::SoftmaxXentDesc& d) override {
    return in_->make_softmax_xent(d);
  }

 private:
  std::unique_ptr<rt::Backend<float>> in_;
  bool fuse_;
};

using rt::now_s;

// Device memory in use by anyone (total - free), as nvidia-smi would count it.
double device_used_mib() {
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return double(total - free) / (1 << 20);
}

int64_t allocs(const rt::cuda::AllocStats& s) { return s.device_allocs + s.pinned_allocs; }

}  // namespace

int main(int argc, char** argv) try {
  Args a = parse(argc, argv);
  std::string why;
  if (rt::cuda::device_count(&why) == 0) {
    std::printf("bench_gpu_step: skipped: no CUDA device: %s\n", why.c_str());
    return 0;
  }
  // The baseline is the bare CUDA context (made here by cudaFree(0)): what the model adds
  // (library handles, workspaces, parameters, activations) is measured above it.
  CUDA_CHECK(cudaSetDevice(0));
  CUDA_CHECK(cudaFree(nullptr));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double base_mib = device_used_mib();
  const double t_setup = now_s();

  rt::cuda::ContextConfig ctx;
  ctx.allow_tf32 = a.precision == "tf32";
  ctx.benchmark_algos = true;  // as PyTorch's cudnn.benchmark: the fastest measured algorithms
  ctx.algo_cache = a.algo_cache;
  // bf16, fp16: the cuda-bf16 and cuda-fp16 backends (16-bit NHWC activations, fp32 master
  // weights and optimizer).
  const bool lowp = a.precision == "bf16" || a.precision == "fp16";
  auto owned = std::make_unique<ResidentInput>(
      lowp ? rt::cuda::make_cuda_lowp_backend(a.precision == "bf16" ? rt::DType::bf16 : rt::DType::f16, ctx)
           : rt::cuda::make_cuda_backend(ctx),
      a.fuse);
  const ResidentInput* backend = owned.get();
  const auto* device = dynamic_cast<const rt::cuda::DeviceBackend*>(&owned->inner());
  rt::ResNetConfig cfg;
  cfg.name = a.model;
  cfg.batch = a.batch;
  cfg.image_size = a.size;
  // CIFAR models have 10 classes, ImageNet ones 1000 (as bench_train_step and the PyTorch peer).
  const bool cifar = a.model == "resnet20" || a.model == "resnet32" || a.model == "resnet44" ||
                     a.model == "resnet56" || a.model == "resnet110";
  cfg.num_classes = cifar ? 10 : 1000;
  auto net = rt::build_resnet<float>(cfg, std::move(owned));
  auto opt = net->backend().make_sgd(net->arena().layout(), rt::SgdConfig{});

  std::mt19937_64 rng(0);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(net->shape(0).numel()));
  for (auto& v : x) v = nd(rng);
  std::vector<int32_t> y(size_t(a.batch));
  for (auto& v : y) v = int32_t(rng() % uint64_t(cfg.num_classes));
  backend->upload(x.data(), net->shape(0), net->act(0));

  float* params = net->arena().params().data();
  float* grads = net->arena().grads().data();
  double loss = 0, first_loss = 0;
  // fp16: dynamic loss scaling with GradScaler's defaults (rt::LossScaler, as the trainer's); the
  // skipped steps are reported, as a step without its update is cheaper than a real one.
  rt::LossScaleConfig scaling;
  scaling.mode = "dynamic";
  rt::LossScaler scaler(scaling);
  // As the trainer's step: the loss is read once backward is queued, so the device runs forward
  // into backward without a gap.
  auto step = [&] {
    net->queue_forward(nullptr, y.data(), true);  // the input is resident (see ResidentInput)
    if (a.precision == "fp16") {
      net->backward({}, scaler.scale());
      const size_t bad = net->backend().scale_count_nonfinite(grads, net->arena().size(),
                                                              float(1.0 / scaler.scale()), true);
      if (scaler.update(bad > 0)) opt->step(params, grads, 0.01);
    } else {
      net->backward();
      opt->step(params, grads, 0.01);
    }
    loss = net->last_loss();
  };
  step();
  net->backend().sync();
  first_loss = loss;
  // Nothing is freed in the steady state, so memory in use after the first step is the peak;
  // sampled again at the end in case a library grew something later.
  double peak_mib = device_used_mib() - base_mib;
  for (int i = 1; i < a.warmup; ++i) step();
  net->backend().sync();
  const double setup_s = now_s() - t_setup;

  const rt::cuda::AllocStats before = rt::cuda::alloc_stats();
  const double used_before = device_used_mib();
  const int64_t skipped_before = scaler.skipped_steps();
  std::vector<double> rate;  // images/s of each repeat
  for (int r = 0; r < a.repeats; ++r) {
    double t0 = now_s();
    for (int s = 0; s < a.steps; ++s) step();
    net->backend().sync();
    rate.push_back(double(a.batch) * a.steps / (now_s() - t0));
  }
  const rt::cuda::AllocStats after = rt::cuda::alloc_stats();
  const int64_t steady_allocs = allocs(after) - allocs(before);
  const int64_t timed_skipped = scaler.skipped_steps() - skipped_before;
  // Which libraries ours ran on: PyTorch may bring its own cuDNN.
  int cudart = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&cudart));
  const auto cudnn = (long long)cudnnGetVersion();
  const double used_after = device_used_mib();
  peak_mib = std::max(peak_mib, used_after - base_mib);

  // The steps must have read the batch uploaded once: check it is still there.
  std::vector<float> back(x.size());
  net->export_tensor(0, back.data());
  // (16-bit storage rounds each value once: within 2^-8 relative for bf16, 2^-11 for fp16, plus
  // half of fp16's subnormal step, 2^-25, below 2^-14.)
  const float rel = a.precision == "bf16" ? 0x1p-8f : 0x1p-11f, abs = a.precision == "fp16" ? 0x1p-25f : 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (lowp ? std::abs(back[i] - x[i]) > rel * std::abs(x[i]) + abs : back[i] != x[i])
      throw rt::Error("the resident input batch changed during the steps");
  if (!std::isfinite(loss)) throw rt::Error("non-finite loss " + std::to_string(loss));

  // Convolution algorithms are timed per distinct shape; the other layers reuse those choices.
  const int64_t conv_shapes = device ? device->context().conv_algos().shapes() : -1;
  std::vector<double> sorted = rate;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double med = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  std::printf(
      "RESULT,ringtrain,%s,train,precision=%s,batch=%lld,size=%lld,gpu=%s,warmup=%d,steps=%d,"
      "repeats=%d,img_per_s=%.1f,img_per_s_min=%.1f,img_per_s_max=%.1f,step_ms=%.2f,"
      "peak_used_mib=%.0f,alloc_device_mib=%.0f,steady_allocs=%lld,setup_s=%.1f,loss=%.4f,fused=%d,"
      "conv_shapes=%lld,skipped_steps=%lld,cudnn=%lld,cudart=%d\n",
      a.model.c_str(), a.precision.c_str(), (long long)a.batch, (long long)a.size, prop.name,
      a.warmup, a.steps, a.repeats, med, sorted.front(), sorted.back(), 1e3 * a.batch / med,
      peak_mib, double(after.device_bytes) / (1 << 20), (long long)steady_allocs, setup_s, loss,
      int(backend->fuses_bn_add()), (long long)conv_shapes, (long long)timed_skipped, cudnn, cudart);
  std::printf("# per-repeat img/s:");
  for (double r : rate) std::printf(" %.1f", r);
  std::printf("\n# memory: %.0f MiB in use above the bare context (cudaMemGetInfo); %.0f MiB of it "
              "counted by rt::cuda (the arena's parameters, gradients and momentum, activations, "
              "gradient slots, workspaces); in use changed by %+.0f MiB during the timed steps\n",
              peak_mib, double(after.device_bytes) / (1 << 20), used_after - used_before);
  std::printf("# %s\n", device ? device->setup_note().c_str() : "");
  std::printf("# device+pinned allocations during the timed steps: %lld (must be 0); loss %.4f -> %.4f\n",
              (long long)steady_allocs, first_loss, loss);
  if (a.precision == "fp16")
    std::printf("# fp16 loss scale %.0f at the end; overflowed steps skipped: %lld in all, %lld timed\n",
                scaler.scale(), (long long)scaler.skipped_steps(), (long long)timed_skipped);

  if (!a.json.empty()) {
    FILE* f = std::fopen(a.json.c_str(), "w");
    if (!f) throw rt::Error("cannot write " + a.json);
    std::fprintf(f,
                 "{\"name\": \"ringtrain\", \"model\": \"%s\", \"precision\": \"%s\", \"batch\": %lld, "
                 "\"size\": %lld, \"gpu\": \"%s\", \"warmup\": %d, \"steps\": %d, \"repeats\": %d, "
                 "\"img_per_s\": %.2f, \"img_per_s_min\": %.2f, \"img_per_s_max\": %.2f, "
                 "\"peak_used_mib\": %.1f, \"alloc_device_mib\": %.1f, \"steady_allocs\": %lld, "
                 "\"setup_s\": %.2f, \"loss\": %.6f, \"fused\": %s, \"conv_shapes\": %lld, "
                 "\"skipped_steps\": %lld, \"cudnn\": %lld, \"cudart\": %d}\n",
                 a.model.c_str(), a.precision.c_str(), (long long)a.batch, (long long)a.size, prop.name,
                 a.warmup, a.steps, a.repeats, med, sorted.front(), sorted.back(), peak_mib,
                 double(after.device_bytes) / (1 << 20), (long long)steady_allocs, setup_s, loss,
                 backend->fuses_bn_add() ? "true" : "false", (long long)conv_shapes,
                 (long long)timed_skipped, cudnn, cudart);
    std::fclose(f);
  }
  if (a.profile > 0) {  // after the figures above: profiling slows the steps
    net->set_profiling(true);
    for (int i = 0; i < a.profile; ++i) step();
    net->backend().sync();
    net->set_profiling(false);
    rt::tools::print_profile(*net);
  }
  if (steady_allocs != 0) {
    std::fprintf(stderr, "bench_gpu_step: FAILED: %lld device/pinned allocations in the timed steps\n",
                 (long long)steady_allocs);
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gpu_step: error: %s\n", e.what());
  return 1;
}

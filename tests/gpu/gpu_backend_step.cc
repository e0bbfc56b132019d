// The CUDA backend's step passes the trainer calls on the device arena: make_sgd (the fused
// device SGD, with and without LARS) against Sgd<float> bit for bit, AdamW and LAMB resumed from
// their saved state against the host's uninterrupted run, and
// scale_count_nonfinite against the host default (scaling exact for a power of two, inf and NaN
// counted exactly); sum_squares against the host default bit for bit; accumulate_arena in fp32 on
// every CUDA backend.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/memory.h"
#include "tests/gpu/gpu_test_util.h"

namespace rt::cuda {
namespace {

std::vector<ParamInfo> layout_of(std::initializer_list<size_t> counts) {
  std::vector<ParamInfo> l;
  size_t off = 0;
  for (size_t c : counts) {
    ParamInfo p;
    p.name = "p" + std::to_string(l.size());
    p.kind = l.size() % 2 ? ParamKind::bn_gamma : ParamKind::conv_weight;
    p.offset = off;
    p.count = c;
    l.push_back(p);
    off += (c + 15) / 16 * 16;
  }
  return l;
}

// Device memory, as the backend's param_memory() gives the arena; the host reads it by copies.
struct Device {
  explicit Device(size_t n) : n(n) { CUDA_CHECK(cudaMalloc(&p, n * sizeof(float))); }
  ~Device() { cudaFree(p); }
  void put(const float* h) const {  // done on return: the backend's stream does not wait for it
    CUDA_CHECK(cudaMemcpy(p, h, n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<float> get() const {
    std::vector<float> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
  float* p = nullptr;
  size_t n;
};

void run_optimizer(SgdConfig cfg) {
  auto be = make_cuda_backend();
  const auto layout = layout_of({3000, 64, 9000, 10});
  Sgd<float> cpu(layout, cfg);
  auto dev = be->make_sgd(layout, cfg);
  const size_t n = cpu.size();
  ASSERT_EQ(dev->size(), n);
  std::vector<float> params(n, 0.f), grads(n, 0.f);
  std::mt19937 g(5);
  std::normal_distribution<float> d(0, 1);
  for (auto& v : params) v = d(g);
  Device mp(n), mg(n);
  mp.put(params.data());
  for (int step = 0; step < 3; ++step) {
    for (auto& v : grads) v = d(g);
    mg.put(grads.data());
    cpu.step(params.data(), grads.data(), 0.05);
    dev->step(mp.p, mg.p, 0.05);
    be->sync();
    ASSERT_EQ(mp.get(), params) << "parameters after step " << step;
    auto m = dev->momentum();
    ASSERT_EQ(std::memcmp(m.data(), cpu.momentum().data(), n * 4), 0) << "momentum after step " << step;
  }
  EXPECT_EQ(dev->steps(), 3);
  dev->restore(cpu.momentum(), 7);
  EXPECT_EQ(dev->steps(), 7);
}

TEST(GpuBackendStep, DeviceSgdMatchesHost) {
  RT_REQUIRE_GPU();
  run_optimizer(SgdConfig{});
}

TEST(GpuBackendStep, DeviceLarsMatchesHost) {
  RT_REQUIRE_GPU();
  SgdConfig cfg;
  cfg.lars = true;
  cfg.weight_decay = 5e-4;
  run_optimizer(cfg);  // BN γ excluded (every other tensor), the 9000-element one in 3 segments
  cfg.lars_exclude_bn_and_bias = false;
  cfg.nesterov = true;
  run_optimizer(cfg);
  cfg.freeze = {"p1", "p2"};  // optimizer.freeze: no segments, no LARS tensor, as Sgd's chunks
  run_optimizer(cfg);
}

// A resumed run (trainer_state's path: momentum(), second_moment() and steps() saved, restored
// into a new optimizer) continues AdamW and LAMB bit for bit as the host's uninterrupted one:
// the bias corrections follow the restored step count, the second moment the restored values.
TEST(GpuBackendStep, DeviceAdamWAndLambResumeAsUninterrupted) {
  RT_REQUIRE_GPU();
  auto be = make_cuda_backend();
  const auto layout = layout_of({3000, 64, 9000, 10});
  for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::lamb}) {
    SgdConfig cfg;
    cfg.kind = kind;
    cfg.weight_decay = 0.05;
    auto cpu = make_host_optimizer<float>(layout, cfg);
    const size_t n = cpu->size();
    std::vector<float> params = test::random_vec(n, 11);
    std::vector<std::vector<float>> grads;
    for (uint32_t step = 0; step < 5; ++step) grads.push_back(test::random_vec(n, 12 + step));
    Device mp(n), mg(n);
    mp.put(params.data());
    auto device_steps = [&](Optimizer<float>& opt, size_t from, size_t to) {
      for (size_t step = from; step < to; ++step) {
        mg.put(grads[step].data());
        opt.step(mp.p, mg.p, 1e-3);
        be->sync();  // before the next put overwrites the gradients the step reads
      }
    };
    for (const auto& gr : grads) cpu->step(params.data(), gr.data(), 1e-3);
    auto first = be->make_sgd(layout, cfg);
    device_steps(*first, 0, 3);
    const std::vector<float> m(first->momentum().begin(), first->momentum().end());
    const std::vector<float> v(first->second_moment().begin(), first->second_moment().end());
    ASSERT_EQ(v.size(), n) << optimizer_kind_name(kind);
    auto resumed = be->make_sgd(layout, cfg);
    resumed->restore(m, first->steps());
    resumed->restore_second_moment(v);
    device_steps(*resumed, 3, 5);
    EXPECT_EQ(resumed->steps(), 5);
    ASSERT_EQ(mp.get(), params) << optimizer_kind_name(kind) << ": parameters after the resumed steps";
    EXPECT_EQ(std::memcmp(resumed->second_moment().data(), cpu->second_moment().data(), n * 4), 0)
        << optimizer_kind_name(kind);
  }
}

TEST(GpuBackendStep, ScaleAndCountNonfinite) {
  RT_REQUIRE_GPU();
  auto be = make_cuda_backend();
  const size_t n = (1 << 20) + 3;
  Device v(n);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = float(int(i % 1000) - 500) * 0.37f;
  v.put(want.data());
  EXPECT_EQ(be->scale_count_nonfinite(v.p, n, 0x1p-10f, true), 0u);
  std::vector<float> got = v.get();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i] * 0x1p-10f) << i;
  got[17] = std::numeric_limits<float>::infinity();
  got[n - 1] = std::nanf("");
  got[n / 2] = -std::numeric_limits<float>::infinity();
  v.put(got.data());
  EXPECT_EQ(be->scale_count_nonfinite(v.p, n, 1.0f, true), 3u);
  EXPECT_EQ(be->scale_count_nonfinite(v.p, n, 0.5f, true), 3u);
  EXPECT_EQ(be->scale_count_nonfinite(v.p, n, 0.5f, false), 0u);  // not asked to count
}

// train.clip_grad_norm's Σg²: the device's chunk sums, added on the host, are the host
// default's bit for bit (Backend::sum_squares' order) on every CUDA backend; the chunk buffer is
// allocated at the first call only.
TEST(GpuBackendStep, SumOfSquaresMatchesHostBitwise) {
  RT_REQUIRE_GPU();
  register_backend();
  std::mt19937 g(9);
  std::normal_distribution<float> d(0, 1);
  for (const char* name : {"cuda", "cuda-bf16"}) {
    auto be = make_backend<float>(name);
    for (size_t n : {size_t(1), size_t(33), size_t(4096), size_t(4097), size_t(3) * 4096 * 8 + 5}) {
      std::vector<float> h(n);
      for (float& x : h) x = d(g) * 300.0f;
      Device v(n);
      v.put(h.data());
      const double want = Backend<float>::sum_squares_host(h.data(), n);
      const double got = be->sum_squares(v.p, n);
      EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << name << " n " << n << ": " << got << " vs " << want;
    }
    Device v(4097);
    std::vector<float> ones(4097, 1.0f);
    v.put(ones.data());
    EXPECT_EQ(be->sum_squares(v.p, 4097), 4097.0);
    const AllocStats before = alloc_stats();
    EXPECT_EQ(be->sum_squares(v.p, 4097), 4097.0);
    EXPECT_EQ(be->sum_squares(v.p, 0), 0.0);
    EXPECT_EQ(alloc_stats().device_allocs, before.device_allocs) << name;
  }
}

// Gradient accumulation adds fp32 arena values on every CUDA backend, the 16-bit ones included
// (whose accumulate() adds activations of their 16-bit type): exact for these sums.
TEST(GpuBackendStep, AccumulateArenaAddsFloats) {
  RT_REQUIRE_GPU();
  register_backend();
  const size_t n = (1 << 16) + 5;
  std::vector<float> y(n), x(n);
  for (size_t i = 0; i < n; ++i) {
    y[i] = float(int(i % 977) - 488) * 0.125f + 0x1p-20f;  // not representable in 16 bits
    x[i] = float(int(i % 131) - 65) * 0.5f;
  }
  for (const char* name : {"cuda", "cuda-tf32", "cuda-bf16", "cuda-fp16"}) {
    auto be = make_backend<float>(name);
    Device dy(n), dx(n);
    dy.put(y.data());
    dx.put(x.data());
    be->accumulate_arena(dy.p, dx.p, n);
    be->sync();
    const std::vector<float> got = dy.get();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], y[i] + x[i]) << name << " at " << i;
  }
}

}  // namespace
}  // namespace rt::cuda

// The device SGD step against Sgd<float> (AdamW and LAMB against Adam<float>) over several steps:
// equal bit for bit (both sides round every operation separately), padding untouched, no
// allocation per step; LARS's sums in a warp's order.
#include <cstring>
#include <random>

#include "cuda/check.h"
#include "cuda/sgd.h"
#include "cuda/sgd_plan.h"
#include "nn/adam.h"
#include "tests/gpu/gpu_test_util.h"

namespace rt::cuda {
namespace {

using test::to_device;
using test::to_host;

std::vector<ParamInfo> mixed_layout() {
  const std::pair<ParamKind, size_t> tensors[] = {{ParamKind::linear_weight, 5130},
                                                  {ParamKind::bias, 10},
                                                  {ParamKind::bn_beta, 64},
                                                  {ParamKind::bn_gamma, 64},
                                                  {ParamKind::conv_weight, 36864},
                                                  {ParamKind::conv_weight, 4097}};
  std::vector<ParamInfo> l;
  size_t off = 0;
  for (auto [kind, count] : tensors) {
    ParamInfo p;
    p.name = "p" + std::to_string(l.size());
    p.kind = kind;
    p.offset = off;
    p.count = count;
    l.push_back(p);
    off += (count + 15) / 16 * 16;
  }
  return l;
}

void expect_same_bits(const std::vector<float>& got, const Buffer<float>& want, const char* what,
                      int step) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
        << what << " at " << i << " after step " << step << ": " << got[i] << " vs " << want[i];
}

// counts (AdamW, LAMB): both start from `steps` steps with these per-tensor update counts.
void run_against_cpu(SgdConfig cfg, const std::vector<int64_t>& counts = {}, int64_t steps = 0) {
  const auto layout = mixed_layout();
  auto cpu_opt = make_host_optimizer<float>(layout, cfg);
  Optimizer<float>& cpu = *cpu_opt;
  const size_t n = cpu.size();
  Buffer<float> params(n), grads(n);
  std::mt19937 g(11);
  std::normal_distribution<float> d(0, 1);
  for (size_t i = 0; i < n; ++i) params[i] = 7.0f;  // padding keeps this sentinel
  for (const ParamInfo& p : layout)
    for (size_t i = p.offset; i < p.offset + p.count; ++i) params[i] = d(g);
  std::vector<float> host_params(params.begin(), params.end());
  DeviceBuffer dp = to_device(host_params);
  DeviceBuffer dg(n * sizeof(float));
  DeviceSgd dev(layout, cfg);
  ASSERT_EQ(dev.size(), n);
  if (!counts.empty()) {  // moments as a run that trained some tensors longer than others left them
    std::vector<float> m(n), v(n);
    for (size_t i = 0; i < n; ++i) m[i] = 0.01f * d(g), v[i] = 0.001f + 0.01f * std::abs(d(g));
    cpu.restore(m, steps);
    cpu.restore_second_moment(v);
    cpu.restore_tensor_steps(counts);
    dev.restore(m.data(), n, steps);
    dev.restore_second_moment(v.data(), n);
    dev.restore_tensor_steps(counts);
  }
  const AllocStats before = alloc_stats();
  for (int step = 0; step < 4; ++step) {
    for (const ParamInfo& p : layout)
      for (size_t i = p.offset; i < p.offset + p.count; ++i) grads[i] = d(g);
    dg.upload(grads.data(), n * sizeof(float));
    const double lr = 0.1 / (step + 1);
    cpu.step(params.data(), grads.data(), lr);
    dev.step(dp.as<float>(), dg.as<float>(), lr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    expect_same_bits(to_host<float>(dp, n), params, "params", step);
    std::vector<float> mom(n);
    CUDA_CHECK(cudaMemcpy(mom.data(), dev.momentum(), n * 4, cudaMemcpyDeviceToHost));
    Buffer<float> cpu_mom(n);
    std::memcpy(cpu_mom.data(), cpu.momentum().data(), n * 4);
    expect_same_bits(mom, cpu_mom, "momentum", step);
    ASSERT_EQ(dev.has_second_moment(), !cpu.second_moment().empty());
    if (dev.has_second_moment()) {
      CUDA_CHECK(cudaMemcpy(mom.data(), dev.second_moment(), n * 4, cudaMemcpyDeviceToHost));
      std::memcpy(cpu_mom.data(), cpu.second_moment().data(), n * 4);
      expect_same_bits(mom, cpu_mom, "second moment", step);
    }
  }
  const AllocStats after = alloc_stats();
  EXPECT_EQ(after.device_allocs, before.device_allocs) << "a step allocated device memory";
  EXPECT_EQ(dev.steps(), steps + 4);
  EXPECT_EQ(dev.tensor_steps(), cpu.tensor_steps());
}

TEST(GpuSgd, MomentumWithDecayMatchesCpu) {
  RT_REQUIRE_GPU();
  run_against_cpu(SgdConfig{});
}

TEST(GpuSgd, NesterovWithoutBnAndBiasDecayMatchesCpu) {
  RT_REQUIRE_GPU();
  SgdConfig cfg;
  cfg.lr_mult = {{"p0", 10}, {"p1", 0.7}};  // optimizer.lr_mult: per-segment rates
  cfg.nesterov = true;
  cfg.weight_decay = 5e-4;
  cfg.decay_bn_and_bias = false;
  run_against_cpu(cfg);
}

TEST(GpuSgd, PlainSgdMatchesCpu) {
  RT_REQUIRE_GPU();
  SgdConfig cfg;
  cfg.momentum = 0;
  cfg.weight_decay = 0;
  run_against_cpu(cfg);
}

// AdamW and LAMB (nn/adam.h) as the host computes them, bit for bit: BN and bias without decay
// (and, for LAMB, without a trust ratio), one tensor frozen, a tensor over several segments;
// LAMB with no tensor to take a ratio.
TEST(GpuSgd, AdamWMatchesCpu) {
  RT_REQUIRE_GPU();
  SgdConfig cfg;
  cfg.kind = OptimizerKind::adamw;
  cfg.weight_decay = 0.05;
  cfg.decay_bn_and_bias = false;
  cfg.freeze = {"p3"};
  cfg.lr_mult = {{"p0", 10}, {"p5", 0.3}};  // optimizer.lr_mult: per-segment rates
  run_against_cpu(cfg);
}

// Tensors with update counts of their own (a resume that unfroze some): each group's bias
// corrections from its own count, as the host's.
TEST(GpuSgd, AdamWAndLambWithTensorsOfOtherCountsMatchCpu) {
  RT_REQUIRE_GPU();
  for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::lamb}) {
    SgdConfig cfg;
    cfg.kind = kind;
    cfg.weight_decay = 0.05;
    cfg.freeze = {"p3"};
    run_against_cpu(cfg, {7, 7, 0, 2, 3, 7}, 7);  // p3 frozen: its count is kept, not used
  }
}

TEST(GpuSgd, LambMatchesCpu) {
  RT_REQUIRE_GPU();
  SgdConfig cfg;
  cfg.kind = OptimizerKind::lamb;
  cfg.weight_decay = 0.02;
  cfg.decay_bn_and_bias = false;
  cfg.beta2 = 0.98;
  cfg.eps = 1e-6;
  cfg.freeze = {"p3"};
  cfg.lr_mult = {{"p4", 0.1}};
  run_against_cpu(cfg);
  cfg.lars_exclude_bn_and_bias = false;  // every tensor scaled
  run_against_cpu(cfg);
  // Only BN and bias trained (the weights frozen, as to fine-tune the statistics' affine part):
  // no tensor takes a trust ratio, every segment's stays 1.
  cfg.lars_exclude_bn_and_bias = true;
  cfg.freeze = {"p0", "p4", "p5"};
  run_against_cpu(cfg);
}

// The device's LARS sums are the CPU optimizer's: every segment's Σp² and Σgrad² equal to
// lars_chunk_squares' bit for bit (a warp's order: lanes, then a butterfly). Segments of 4096,
// of 1034 (a partial last round of lanes) and of 1 element; BN and bias segments too.
TEST(GpuSgd, LarsSegmentSumsAreAWarpsOrder) {
  RT_REQUIRE_GPU();
  const auto layout = mixed_layout();
  SgdConfig cfg;
  cfg.lars = true;
  DeviceSgd dev(layout, cfg);
  std::vector<float> p(dev.size(), 0.0f), g(dev.size(), 0.0f);
  std::mt19937 r(5);
  std::normal_distribution<float> d(0, 1);
  for (const ParamInfo& t : layout)
    for (size_t i = t.offset; i < t.offset + t.count; ++i) p[i] = d(r), g[i] = 1e-3f * d(r);
  DeviceBuffer dp = to_device(p), dg = to_device(g);
  dev.step(dp.as<float>(), dg.as<float>(), 0.1, nullptr);
  const std::vector<double> got = dev.lars_segment_sums();
  const std::vector<SgdSegment> segs = sgd_segments(layout, cfg);
  ASSERT_EQ(got.size(), 2 * segs.size());
  for (size_t j = 0; j < segs.size(); ++j) {
    double w2 = 0, g2 = 0;
    lars_chunk_squares(p.data() + segs[j].begin, g.data() + segs[j].begin, segs[j].count, &w2, &g2);
    EXPECT_EQ(std::memcmp(&got[2 * j], &w2, 8), 0) << "segment " << j << ": " << got[2 * j] << " vs " << w2;
    EXPECT_EQ(std::memcmp(&got[2 * j + 1], &g2, 8), 0) << "segment " << j;
  }
  EXPECT_TRUE(DeviceSgd(layout, SgdConfig{}).lars_segment_sums().empty());
}

TEST(GpuSgd, RestoreAndBadLearningRate) {
  RT_REQUIRE_GPU();
  DeviceSgd dev(mixed_layout(), SgdConfig{});
  std::vector<float> mom(dev.size(), 0.5f);
  dev.restore(mom.data(), mom.size(), 3);
  EXPECT_EQ(dev.steps(), 3);
  EXPECT_THROW(dev.restore(mom.data(), mom.size() - 1, 3), Error);
  EXPECT_THROW(dev.step(nullptr, nullptr, -1.0, nullptr), Error);
  EXPECT_THROW(dev.restore_second_moment(mom.data(), mom.size()), Error);  // SGD has none
  SgdConfig adamw;
  adamw.kind = OptimizerKind::adamw;
  DeviceSgd adam(mixed_layout(), adamw);
  EXPECT_NO_THROW(adam.restore_second_moment(mom.data(), mom.size()));
  EXPECT_THROW(adam.restore_second_moment(mom.data(), mom.size() - 1), Error);
}

}  // namespace
}  // namespace rt::cuda

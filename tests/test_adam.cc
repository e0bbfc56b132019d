// AdamW and LAMB on the flat arena: AdamW against torch.optim.AdamW's own figures, LAMB against
// the paper's formulas written out in double, frozen tensors and padding untouched, thread-count
// determinism, restore, and the settings refused.
#include "nn/adam.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nn/arena.h"
#include "nn/error.h"
#include "nn/ops.h"

namespace rt {
namespace {

SgdConfig adam_config(OptimizerKind kind) {
  SgdConfig c;
  c.kind = kind;
  c.weight_decay = 0.1;
  c.decay_bn_and_bias = false;
  c.beta1 = 0.8;
  c.beta2 = 0.95;
  c.eps = 1e-6;
  return c;
}

// torch.optim.AdamW(lr=0.01, betas=(0.8, 0.95), eps=1e-6) in float64, weight decay 0.1 on w and 0
// on b, after three steps of these gradients (the figures it printed, 17 digits).
TEST(Adam, AdamWMatchesTorch) {
  Arena<double> a;
  const int w = a.add_param("conv.weight", {3}, ParamKind::conv_weight);
  const int b = a.add_param("bn.bias", {2}, ParamKind::bn_beta);
  a.finalize();
  const double w0[] = {1.0, -2.0, 0.5}, b0[] = {0.25, -0.75};
  std::copy(w0, w0 + 3, a.param(w));
  std::copy(b0, b0 + 2, a.param(b));
  const double gw[3][3] = {{0.5, -1.0, 2.0}, {0.4, 0.3, -1.0}, {-0.2, 0.6, 0.1}};
  const double gb[3][2] = {{0.1, -0.2}, {0.05, 0.3}, {-0.1, 0.2}};
  Adam<double> opt(a.layout(), adam_config(OptimizerKind::adamw));
  for (int s = 0; s < 3; ++s) {
    std::copy(gw[s], gw[s] + 3, a.grad(w));
    std::copy(gb[s], gb[s] + 2, a.grad(b));
    opt.step(a.params().data(), a.grads().data(), 0.01);
  }
  const double want_w[] = {0.97247617183005342, -1.9814185379943647, 0.48452104210433772};
  const double want_b[] = {0.23060438900728486, -0.74840803717296345};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(a.param(w)[i], want_w[i], 1e-15) << i;
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(a.param(b)[i], want_b[i], 1e-15) << i;
  const size_t wo = a.info(w).offset;
  const double want_m[] = {0.087999999999999981, 0.039999999999999966, 0.11599999999999999};
  const double want_v[] = {0.020881250000000018, 0.067400000000000057, 0.2285000000000002};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(opt.momentum()[wo + size_t(i)], want_m[i], 1e-15);
    EXPECT_NEAR(opt.second_moment()[wo + size_t(i)], want_v[i], 1e-15);
  }
  EXPECT_EQ(opt.steps(), 3);
}

// A small arena with padding after each tensor, one tensor over several chunks, BN, a bias and a
// zero tensor (whose LAMB trust ratio must be 1).
template <class T>
Arena<T> make_arena(uint32_t seed) {
  Arena<T> a;
  a.add_param("conv1.weight", {7, 3, 3, 3}, ParamKind::conv_weight);
  a.add_param("bn1.weight", {7}, ParamKind::bn_gamma);
  a.add_param("conv2.weight", {33, 7, 5, 5}, ParamKind::conv_weight);  // > one chunk
  a.add_param("fc.weight", {10, 33}, ParamKind::linear_weight);
  a.add_param("fc.bias", {10}, ParamKind::bias);
  a.add_param("zero.weight", {5}, ParamKind::conv_weight);
  a.finalize();
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const ParamInfo& p : a.layout())
    for (size_t i = 0; i < p.count; ++i) {
      a.params()[p.offset + i] = p.name == "zero.weight" ? T(0) : T(nd(rng));
      a.grads()[p.offset + i] = T(0.1 * nd(rng));
    }
  return a;
}

// LAMB as You et al. write it: bias-corrected moments m̂, v̂, r = m̂ / (√v̂ + eps), u = r + wd·p,
// p -= lr · ‖p‖ / ‖u‖ · u per tensor (BN and bias unscaled), in double with the moments kept here.
TEST(Adam, LambMatchesThePapersFormulas) {
  auto a = make_arena<double>(4);
  SgdConfig cfg = adam_config(OptimizerKind::lamb);
  cfg.freeze = {"fc.weight"};
  Adam<double> opt(a.layout(), cfg);
  std::vector<double> p(a.params().begin(), a.params().end()), m(p.size()), v(p.size());
  const std::vector<double> p0 = p;
  const double lr = 0.02;
  for (int t = 1; t <= 3; ++t) {
    for (const ParamInfo& pi : a.layout()) {
      if (pi.name == "fc.weight") continue;  // frozen
      const bool plain = param_is_bn_or_bias(pi.kind);
      const double wd = plain ? 0 : 0.1;
      std::vector<double> u(pi.count);
      double pn = 0, un = 0;
      for (size_t i = 0; i < pi.count; ++i) {
        const size_t k = pi.offset + i;
        const double g = a.grads()[k];
        m[k] = 0.8 * m[k] + 0.2 * g;
        v[k] = 0.95 * v[k] + 0.05 * g * g;
        const double mh = m[k] / (1 - std::pow(0.8, t)), vh = v[k] / (1 - std::pow(0.95, t));
        u[i] = mh / (std::sqrt(vh) + 1e-6) + wd * p[k];
        pn += p[k] * p[k];
        un += u[i] * u[i];
      }
      const double ratio = plain || pn == 0 || un == 0 ? 1.0 : std::sqrt(pn) / std::sqrt(un);
      for (size_t i = 0; i < pi.count; ++i) p[pi.offset + i] -= lr * ratio * u[i];
    }
    opt.step(a.params().data(), a.grads().data(), lr);
    for (size_t k = 0; t == 1 && k < a.layout().size(); ++k)  // zero.weight starts at 0: ratio 1
      EXPECT_TRUE(a.layout()[k].name != "zero.weight" || opt.trust_ratios()[k] == 1.0) << opt.trust_ratios()[k];
  }
  for (size_t k = 0; k < p.size(); ++k) ASSERT_NEAR(a.params()[k], p[k], 1e-12) << "element " << k;
  for (size_t t = 0; t < a.layout().size(); ++t) {
    const ParamInfo& pi = a.layout()[t];
    const bool one = param_is_bn_or_bias(pi.kind) || pi.name == "fc.weight";
    EXPECT_EQ(opt.trust_ratios()[t] == 1.0, one) << pi.name << ": " << opt.trust_ratios()[t];
    if (pi.name == "fc.weight") {
      for (size_t i = 0; i < pi.count; ++i) ASSERT_EQ(a.params()[pi.offset + i], p0[pi.offset + i]);
    }
  }
  // Padding between tensors is neither read nor written.
  size_t end = 0;
  for (const ParamInfo& pi : a.layout()) {
    for (size_t k = end; k < pi.offset; ++k) ASSERT_EQ(a.params()[k], 0.0) << "padding at " << k;
    end = pi.offset + pi.count;
  }
}

// LAMB's ratio ‖w‖ / ‖u‖ needs both norms: a tensor that no gradient has reached yet (zero
// moments) with no weight decay has the update direction u = 0, and takes ratio 1 (its weights
// stay as they are), not ‖w‖ / 0 = inf, whose product with the zero direction would make them NaN.
TEST(Adam, LambZeroDirectionLeavesTheWeightsAlone) {
  Arena<float> a;
  const int w = a.add_param("w", {3}, ParamKind::conv_weight);
  a.finalize();
  const float start[3] = {0.5f, -1.0f, 2.0f};
  std::copy(start, start + 3, a.param(w));
  std::fill_n(a.grad(w), 3, 0.0f);
  SgdConfig cfg = adam_config(OptimizerKind::lamb);
  cfg.weight_decay = 0;
  Adam<float> opt(a.layout(), cfg);
  for (int s = 0; s < 2; ++s) opt.step(a.params().data(), a.grads().data(), 0.1);
  EXPECT_EQ(opt.trust_ratios()[0], 1.0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.param(w)[i], start[i]) << "element " << i;
}

TEST(Adam, BitwiseIdenticalForAnyThreadCountAndRestoredExactly) {
  const int saved = omp_get_max_threads();
  for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::lamb}) {
    std::vector<float> ref;
    for (int threads : {1, 2, 5}) {
      omp_set_num_threads(threads);
      auto a = make_arena<float>(7);
      Adam<float> opt(a.layout(), adam_config(kind));
      for (int s = 0; s < 4; ++s) opt.step(a.params().data(), a.grads().data(), 0.05);
      std::vector<float> got(a.params().begin(), a.params().end());
      if (ref.empty()) ref = got;
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0)
          << optimizer_kind_name(kind) << ", " << threads << " thread(s)";
    }
    // Two steps, the state restored into a new optimizer, two more: the uninterrupted run's bits.
    auto a = make_arena<float>(9), b = make_arena<float>(9);
    Adam<float> first(a.layout(), adam_config(kind));
    for (int s = 0; s < 2; ++s) first.step(a.params().data(), a.grads().data(), 0.05);
    std::copy(a.params().begin(), a.params().end(), b.params().begin());
    Adam<float> resumed(b.layout(), adam_config(kind));
    resumed.restore(first.momentum(), first.steps());
    resumed.restore_second_moment(first.second_moment());
    for (int s = 0; s < 2; ++s) {
      first.step(a.params().data(), a.grads().data(), 0.05);
      resumed.step(b.params().data(), b.grads().data(), 0.05);
    }
    EXPECT_EQ(std::memcmp(a.params().data(), b.params().data(), a.size() * sizeof(float)), 0)
        << optimizer_kind_name(kind);
  }
  omp_set_num_threads(saved);
}

// optimizer.lr_mult: a tensor's factor acts as its own learning rate (the longest matching name
// wins), for SGD, AdamW and LAMB: the tensors step exactly as under an optimizer at lr · factor.
TEST(Adam, LearningRateFactorsActAsTheTensorsOwnRate) {
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw, OptimizerKind::lamb}) {
    SgdConfig c = adam_config(kind);
    if (kind == OptimizerKind::sgd) c = SgdConfig{};
    c.lr_mult = {{"conv2", 4}, {"conv2.weight", 0.5}, {"fc", 2}};
    EXPECT_EQ(optimizer_lr_mult(c, "conv2.weight"), 0.5);
    EXPECT_EQ(optimizer_lr_mult(c, "fc.bias"), 2);
    EXPECT_EQ(optimizer_lr_mult(c, "conv1.weight"), 1);
    EXPECT_EQ(optimizer_lr_mult(c, "fcx.weight"), 1);  // not at a '.'
    auto a = make_arena<float>(3);
    auto opt = make_host_optimizer<float>(a.layout(), c);
    SgdConfig plain = c;
    plain.lr_mult.clear();
    for (double f : {1.0, 0.5, 2.0}) {
      auto b = make_arena<float>(3);
      auto ref = make_host_optimizer<float>(b.layout(), plain);
      for (int s = 0; s < 3; ++s) ref->step(b.params().data(), b.grads().data(), 0.04 * f);
      if (f == 1.0)
        for (int s = 0; s < 3; ++s) opt->step(a.params().data(), a.grads().data(), 0.04);
      for (const ParamInfo& p : a.layout()) {
        if (optimizer_lr_mult(c, p.name) != f) continue;
        // LAMB's ratios are per tensor, AdamW's and SGD's per element: each tensor alone agrees.
        EXPECT_EQ(std::memcmp(a.params().data() + p.offset, b.params().data() + p.offset, p.count * sizeof(float)), 0)
            << optimizer_kind_name(kind) << " " << p.name << " at factor " << f;
      }
    }
  }
  SgdConfig bad;
  bad.lr_mult = {{"fc", -1}};
  EXPECT_THROW(sgd_validate(bad), Error);
}

// A tensor frozen for a while, then trained (a resume without it in optimizer.freeze), counts its
// own updates as torch.optim's per-parameter "step" does: its first update is a fresh optimizer's
// first, bit for bit, while the others go on from the steps they had.
TEST(Adam, UnfrozenTensorsCountTheirOwnUpdates) {
  for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::lamb}) {
    const char* name = optimizer_kind_name(kind);
    SgdConfig frozen = adam_config(kind), open = adam_config(kind);
    frozen.freeze = {"conv2"};
    auto a = make_arena<float>(11);
    Adam<float> before(a.layout(), frozen);
    for (int s = 0; s < 3; ++s) before.step(a.params().data(), a.grads().data(), 0.05);
    // Each tensor's count, layout order: `frozen` for conv2's, `others` for the rest.
    const auto expected = [&](int64_t frozen_count, int64_t others) {
      std::vector<int64_t> v;
      for (const ParamInfo& p : a.layout()) v.push_back(p.name == "conv2.weight" ? frozen_count : others);
      return v;
    };
    const std::vector<int64_t> counts = before.tensor_steps();
    EXPECT_EQ(counts, expected(0, 3)) << name;
    auto fresh = make_arena<float>(11), plain = make_arena<float>(11);
    std::copy(a.params().begin(), a.params().end(), fresh.params().begin());
    std::copy(a.params().begin(), a.params().end(), plain.params().begin());
    Adam<float> after(a.layout(), open), first(fresh.layout(), open), on(plain.layout(), open);
    for (Adam<float>* o : {&after, &on}) {
      o->restore(before.momentum(), before.steps());
      o->restore_second_moment(before.second_moment());
    }
    after.restore_tensor_steps(counts);  // `on` takes every tensor as updated 3 times
    after.step(a.params().data(), a.grads().data(), 0.05);
    first.step(fresh.params().data(), fresh.grads().data(), 0.05);
    on.step(plain.params().data(), plain.grads().data(), 0.05);
    for (const ParamInfo& p : a.layout()) {
      const float* want = (p.name == "conv2.weight" ? fresh : plain).params().data() + p.offset;
      EXPECT_EQ(std::memcmp(a.params().data() + p.offset, want, p.count * sizeof(float)), 0) << name << " " << p.name;
    }
    // Without the counts, conv2's first update would be corrected as a fourth (3x larger here).
    size_t c2 = 0;
    for (const ParamInfo& p : a.layout())
      if (p.name == "conv2.weight") c2 = p.offset;
    EXPECT_NE(std::memcmp(plain.params().data() + c2, fresh.params().data() + c2, sizeof(float)), 0) << name;
    EXPECT_EQ(after.tensor_steps(), expected(1, 4)) << name;
    // Counts the steps cannot have made, and more groups of counts than the step computes, are refused.
    EXPECT_THROW(after.restore_tensor_steps(expected(5, 4)), Error);
    EXPECT_THROW(after.restore_tensor_steps(std::vector<int64_t>{4, 4, 1}), Error);
  }
  Arena<float> many;
  for (int t = 0; t < 10; ++t) many.add_param("t" + std::to_string(t) + ".weight", {3}, ParamKind::conv_weight);
  many.finalize();
  Adam<float> opt(many.layout(), adam_config(OptimizerKind::adamw));
  opt.restore(std::vector<float>(many.size()), 20);
  EXPECT_NO_THROW(opt.restore_tensor_steps(std::vector<int64_t>{20, 19, 18, 17, 16, 15, 14, 13, 13, 20}));
  try {
    opt.restore_tensor_steps(std::vector<int64_t>{20, 19, 18, 17, 16, 15, 14, 13, 12, 11});
    ADD_FAILURE() << "nine groups of update counts taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 8 different update counts"), std::string::npos) << e.what();
  }
}

TEST(Adam, BadSettingsAndStateAreRefused) {
  auto a = make_arena<float>(1);
  auto err = [&](SgdConfig c) {
    try {
      Adam<float>(a.layout(), c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SgdConfig c = adam_config(OptimizerKind::adamw);
  c.beta1 = 1;
  EXPECT_NE(err(c).find("adamw: beta1 must be in [0, 1), got 1"), std::string::npos) << err(c);
  c = adam_config(OptimizerKind::lamb);
  c.eps = 0;
  EXPECT_NE(err(c).find("lamb: eps must be finite and > 0"), std::string::npos) << err(c);
  c = adam_config(OptimizerKind::lamb);
  c.lars = true;
  EXPECT_NE(err(c).find("lamb: lars is SGD's"), std::string::npos) << err(c);
  Adam<float> opt(a.layout(), adam_config(OptimizerKind::adamw));
  EXPECT_THROW(opt.restore_second_moment(std::vector<float>(3)), Error);
  EXPECT_THROW(opt.step(a.params().data(), a.grads().data(), std::nan("")), Error);
  // SGD has no second moment to restore, and each kind builds its own optimizer.
  auto sgd = make_host_optimizer<float>(a.layout(), SgdConfig{});
  EXPECT_TRUE(sgd->second_moment().empty());
  EXPECT_THROW(sgd->restore_second_moment(std::vector<float>(a.size())), Error);
  EXPECT_NO_THROW(sgd->restore_second_moment({}));
  auto adamw = make_backend<float>("reference")->make_sgd(a.layout(), adam_config(OptimizerKind::adamw));
  EXPECT_EQ(adamw->second_moment().size(), a.size());
}

}  // namespace
}  // namespace rt

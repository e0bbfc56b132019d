// The Winograd F(2x2, 3x3) convolution of the oneDNN backend against the double-precision
// reference: forward, backward data and backward weights on odd, tiny and channel-changing
// shapes, through the nChw8c layout; and the rule that picks it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "nn/onednn/winograd.h"
#include "nn/onednn/winograd_kernels.h"
#include "nn/ops.h"

namespace rt {
namespace {

using Vec = std::vector<float>;
using VecD = std::vector<double>;

// |got - want| <= tol * max |want|: F(2,3) in float sums a few more terms than direct
// convolution, each within rounding of the same magnitude.
void expect_close(const Vec& got, const VecD& want, const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_abs = 1e-6, worst = 0;
  for (double v : want) max_abs = std::max(max_abs, std::fabs(v));
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= worst)) worst = err, worst_i = i;  // NaN (never written) counts as worst
  }
  EXPECT_LE(worst, tol * max_abs) << what << ": worst at " << worst_i << ": got " << got[worst_i]
                                  << ", want " << want[worst_i] << " (max |want| " << max_abs << ")";
}

struct Case {
  Shape in;
  int64_t out_c;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.in.str() << " -> " << c.out_c; }

class WinogradVsRef : public ::testing::TestWithParam<Case> {};

TEST_P(WinogradVsRef, ForwardBackward) {
  if (!dnn::winograd_cpu_ok()) GTEST_SKIP() << "no AVX2+FMA on this CPU";
  const Case& p = GetParam();
  ConvDesc d{.name = "conv", .in = p.in, .out_c = p.out_c, .kernel_h = 3, .kernel_w = 3,
             .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1};
  ASSERT_TRUE(dnn::winograd_applies(d));
  const Shape out = d.out();
  auto fast_be = make_backend<float>("onednn-winograd");  // its layout: 8-channel blocks
  auto op = dnn::make_winograd_conv_op(std::make_shared<dnn::Context>(8), d);
  auto ref = make_backend<double>("reference")->make_conv(d);

  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto rand = [&](size_t n) {
    Vec v(n);
    for (auto& x : v) x = u(rng);
    return v;
  };
  auto to_fast = [&](const Vec& nchw, const Shape& s) {
    Vec v(nchw.size());
    fast_be->act_import(nchw.data(), s, v.data());
    return v;
  };
  auto from_fast = [&](const Vec& v, const Shape& s) {
    Vec nchw(v.size());
    fast_be->act_export(v.data(), s, nchw.data());
    return nchw;
  };
  auto dbl = [](const Vec& v) { return VecD(v.begin(), v.end()); };
  const float nan = std::numeric_limits<float>::quiet_NaN();

  Vec x = rand(size_t(p.in.numel())), w = rand(size_t(d.weight_count())), dy = rand(size_t(out.numel()));
  VecD y_ref(size_t(out.numel())), dx_ref(x.size()), dw_ref(w.size());
  ref->forward(dbl(x).data(), dbl(w).data(), nullptr, y_ref.data());
  ref->backward(dbl(x).data(), dbl(w).data(), dbl(dy).data(), dx_ref.data(), dw_ref.data(), nullptr);

  // Twice, so that scratch left over from the first call cannot leak into the second.
  const Vec xf = to_fast(x, p.in), dyf = to_fast(dy, out);
  for (int rep = 0; rep < 2; ++rep) {
    Vec yf(size_t(out.numel()), nan), dxf(x.size(), nan), dw(w.size(), nan);
    op->forward(xf.data(), w.data(), nullptr, yf.data());
    expect_close(from_fast(yf, out), y_ref, "y");
    op->backward(xf.data(), w.data(), dyf.data(), dxf.data(), dw.data(), nullptr);
    expect_close(from_fast(dxf, p.in), dx_ref, "dx");
    expect_close(dw, dw_ref, "dw");
    Vec dw2(w.size(), nan);
    op->backward(xf.data(), w.data(), dyf.data(), nullptr, dw2.data(), nullptr);
    EXPECT_EQ(dw2, dw) << "dw without dx";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, WinogradVsRef,
                         ::testing::Values(Case{{1, 8, 5, 7}, 8},      // odd, non-square
                                           Case{{3, 8, 7, 7}, 16},     // C < K, 4x4 tiles, edge
                                           Case{{3, 64, 13, 13}, 32},  // C > K, odd
                                           Case{{1, 16, 2, 2}, 8},     // one tile
                                           Case{{2, 16, 3, 3}, 16},    // partial tiles only
                                           Case{{3, 24, 4, 4}, 8},     // C = 3 blocks
                                           Case{{2, 8, 1, 6}, 8},      // one row
                                           Case{{2, 32, 20, 18}, 64}));  // several blocks

TEST(WinogradRule, AppliesOnlyTo3x3Stride1Pad1) {
  auto conv = [](Shape in, int64_t k, int64_t kernel, int64_t stride, int64_t pad, bool bias) {
    return ConvDesc{.name = "c", .in = in, .out_c = k, .kernel_h = kernel, .kernel_w = kernel,
                    .stride_h = stride, .stride_w = stride, .pad_h = pad, .pad_w = pad, .bias = bias};
  };
  const bool cpu = dnn::winograd_cpu_ok();
  EXPECT_EQ(dnn::winograd_applies(conv({2, 8, 5, 5}, 8, 3, 1, 1, false)), cpu);
  EXPECT_FALSE(dnn::winograd_applies(conv({2, 8, 5, 5}, 8, 3, 1, 1, true)));    // bias
  EXPECT_FALSE(dnn::winograd_applies(conv({2, 8, 5, 5}, 8, 3, 2, 1, false)));   // stride 2
  EXPECT_FALSE(dnn::winograd_applies(conv({2, 8, 5, 5}, 8, 3, 1, 0, false)));   // no pad
  EXPECT_FALSE(dnn::winograd_applies(conv({2, 8, 5, 5}, 8, 1, 1, 0, false)));   // 1x1
  EXPECT_FALSE(dnn::winograd_applies(conv({2, 12, 5, 5}, 8, 3, 1, 1, false)));  // C not 8k
  EXPECT_FALSE(dnn::winograd_applies(conv({2, 8, 5, 5}, 5, 3, 1, 1, false)));   // K not 8k
  EXPECT_FALSE(dnn::winograd_applies(conv({2, 8, 1, 1}, 8, 3, 1, 1, false)));   // 1x1 map

  // resnet18 at 224: every 3x3 stride-1 layer (56, 28, 14 and 7 pixel maps) takes Winograd; the
  // stem, stride-2 and 1x1 layers stay direct.
  if (!cpu) return;
  for (auto [c, hw] : {std::pair<int64_t, int64_t>{64, 56}, {128, 28}, {256, 14}, {512, 7}})
    EXPECT_TRUE(dnn::winograd_pays(conv({64, c, hw, hw}, c, 3, 1, 1, false))) << c << " @" << hw;
  EXPECT_FALSE(dnn::winograd_pays(conv({64, 3, 224, 224}, 64, 7, 2, 3, false)));
  EXPECT_FALSE(dnn::winograd_pays(conv({64, 64, 56, 56}, 128, 3, 2, 1, false)));
  EXPECT_FALSE(dnn::winograd_pays(conv({64, 64, 56, 56}, 128, 1, 2, 0, false)));
}

TEST(WinogradRule, BackendNames) {
  for (const char* name : {"onednn", "cpu", "onednn-direct", "onednn-winograd"})
    EXPECT_EQ(make_backend<float>(name)->name(), name);
  EXPECT_THROW(make_backend<float>("onednn-fft"), Error);
}

}  // namespace
}  // namespace rt

// Central finite-difference gradient checks of every reference layer, in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "nn/ref/ref_backend.h"

namespace rt {
namespace {

using Vec = std::vector<double>;

constexpr double kStep = 1e-6;       // central-difference step
constexpr double kThreshold = 1e-6;  // |a - n| <= kThreshold * max(|a|, |n|, 1)

Vec random_vec(size_t n, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (auto& e : v) e = u(rng);
  return v;
}

// Values at least 0.05 away from 0: central differences never straddle a ReLU kink.
Vec away_from_zero(size_t n, std::mt19937_64& rng) {
  Vec v = random_vec(n, rng, 0.05, 1.0);
  std::bernoulli_distribution sign(0.5);
  for (auto& e : v) e = sign(rng) ? e : -e;
  return v;
}

// A shuffled set of distinct values spaced 0.01 apart: no ties and no max-pool kink within h.
Vec distinct_values(size_t n, std::mt19937_64& rng) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = -0.5 + 0.01 * double(i);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// One evaluation of the scalar loss, plus the output's ReLU pattern when the layer has kinks.
struct Probe {
  double loss = 0;
  std::vector<char> active;  // y > 0 per output; empty for smooth layers
};

struct CheckStats {
  int checked = 0, skipped = 0, failed = 0;
  std::string first_failure;
};

// Compares analytic[i] with (L(v_i + h) - L(v_i - h)) / 2h for every element of v (restored
// afterwards). A point is skipped when the ReLU pattern differs between v - h, v and v + h:
// the loss is not differentiable there.
CheckStats check_gradient(Vec& v, const Vec& analytic, const std::function<Probe()>& eval) {
  CheckStats st;
  const std::vector<char> base = eval().active;
  for (size_t i = 0; i < v.size(); ++i) {
    const double saved = v[i];
    v[i] = saved + kStep;
    const Probe plus = eval();
    v[i] = saved - kStep;
    const Probe minus = eval();
    v[i] = saved;
    if (plus.active != base || minus.active != base) {
      ++st.skipped;
      continue;
    }
    const double numeric = (plus.loss - minus.loss) / (2 * kStep);
    const double a = analytic[i];
    ++st.checked;
    if (std::abs(a - numeric) > kThreshold * std::max({std::abs(a), std::abs(numeric), 1.0})) {
      if (st.failed++ == 0)
        st.first_failure = "element " + std::to_string(i) + ": analytic " + std::to_string(a) +
                           " numeric " + std::to_string(numeric);
    }
  }
  return st;
}

// Runs check_gradient and reports through GoogleTest. At most max_skip_frac of points may be
// skipped, so a check cannot pass vacuously.
void expect_gradient(const std::string& what, Vec& v, const Vec& analytic,
                     const std::function<Probe()>& eval, double max_skip_frac = 0.0) {
  ASSERT_EQ(v.size(), analytic.size()) << what;
  const CheckStats st = check_gradient(v, analytic, eval);
  EXPECT_EQ(st.failed, 0) << what << ": " << st.failed << " of " << st.checked
                          << " elements disagree; first " << st.first_failure;
  EXPECT_LE(st.skipped, int(max_skip_frac * double(v.size()))) << what << ": too many kinks";
  EXPECT_GT(st.checked, 0) << what;
}

std::vector<char> positive(const Vec& y) {
  std::vector<char> m(y.size());
  for (size_t i = 0; i < y.size(); ++i) m[i] = y[i] > 0;
  return m;
}

class RefGradcheck : public ::testing::Test {
 protected:
  std::unique_ptr<Backend<double>> be_ = make_reference_backend<double>();
  std::mt19937_64 rng_{20240611};
};

// ---------------------------------------------------------------- convolution

struct ConvCase {
  const char* label;
  Shape in;
  int64_t out_c, kh, kw, sh, sw, ph, pw;
  bool bias;
  int64_t groups = 1;
};
void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.label; }

class ConvGradcheck : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvGradcheck, InputWeightAndBias) {
  const ConvCase& c = GetParam();
  auto be = make_reference_backend<double>();
  std::mt19937_64 rng(7);
  ConvDesc d{.name = c.label, .in = c.in, .out_c = c.out_c, .kernel_h = c.kh, .kernel_w = c.kw,
             .stride_h = c.sh, .stride_w = c.sw, .pad_h = c.ph, .pad_w = c.pw, .bias = c.bias, .groups = c.groups};
  auto op = be->make_conv(d);
  const Shape out = d.out();
  Vec x = random_vec(size_t(c.in.numel()), rng), w = random_vec(size_t(d.weight_count()), rng);
  Vec b = random_vec(size_t(c.out_c), rng), r = random_vec(size_t(out.numel()), rng);
  Vec y(r.size()), dx(x.size()), dw(w.size()), db(b.size());
  op->forward(x.data(), w.data(), b.data(), y.data());
  op->backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data());
  auto eval = [&] {
    op->forward(x.data(), w.data(), b.data(), y.data());
    return Probe{dot(y, r), {}};
  };
  expect_gradient("dx", x, dx, eval);
  expect_gradient("dw", w, dw, eval);
  if (c.bias) expect_gradient("db", b, db, eval);

  // Null dx must still give the same parameter gradients.
  Vec dw2(w.size()), db2(b.size());
  op->backward(x.data(), w.data(), r.data(), nullptr, dw2.data(), db2.data());
  EXPECT_EQ(dw2, dw);
  if (c.bias) {
    EXPECT_EQ(db2, db);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, ConvGradcheck,
    ::testing::Values(
        ConvCase{"conv1x1", {2, 3, 4, 5}, 4, 1, 1, 1, 1, 0, 0, false},
        ConvCase{"conv1x1_s2_bias", {1, 3, 5, 5}, 2, 1, 1, 2, 2, 0, 0, true},
        ConvCase{"conv3x3_s2_p1", {2, 3, 7, 7}, 4, 3, 3, 2, 2, 1, 1, false},
        ConvCase{"conv3x3_s1_p1_bias", {1, 2, 5, 6}, 3, 3, 3, 1, 1, 1, 1, true},
        ConvCase{"conv7x7_s2_p3", {1, 2, 9, 9}, 3, 7, 7, 2, 2, 3, 3, false},
        ConvCase{"conv7x7_s2_p3_bias_b2", {2, 1, 8, 7}, 2, 7, 7, 2, 2, 3, 3, true},
        ConvCase{"conv_nonsquare", {2, 2, 7, 6}, 3, 3, 2, 2, 1, 1, 0, true},
        ConvCase{"conv_nonsquare_odd", {1, 3, 5, 9}, 2, 1, 5, 1, 3, 0, 2, false},
        ConvCase{"grouped3x3_g2", {2, 4, 5, 5}, 6, 3, 3, 1, 1, 1, 1, false, 2},
        ConvCase{"grouped3x3_s2_g3_bias", {1, 6, 7, 6}, 3, 3, 3, 2, 2, 1, 1, true, 3},
        ConvCase{"depthwise3x3", {2, 4, 5, 6}, 4, 3, 3, 1, 1, 1, 1, false, 4},
        ConvCase{"grouped1x1_g2_x2", {1, 4, 3, 4}, 8, 1, 1, 1, 1, 0, 0, false, 2}),
    [](const auto& info) { return std::string(info.param.label); });

// ---------------------------------------------------------------- batch norm

void check_batchnorm(bool relu) {
  auto be = make_reference_backend<double>();
  std::mt19937_64 rng(relu ? 11 : 12);
  BatchNormDesc d{.name = "bn", .in = {3, 2, 3, 2}, .relu = relu};
  auto op = be->make_batchnorm(d);
  const size_t n = size_t(d.in.numel()), C = size_t(d.in.c);
  Vec x = random_vec(n, rng, -2, 2), gamma = random_vec(C, rng, 0.5, 1.5);
  Vec beta = random_vec(C, rng, -0.3, 0.3), r = random_vec(n, rng);
  Vec rm(C, 0.0), rv(C, 1.0), y(n), dx(n), dg(C), dbt(C);
  op->forward_train(x.data(), gamma.data(), beta.data(), y.data(), rm.data(), rv.data());
  op->backward(x.data(), gamma.data(), y.data(), r.data(), dx.data(), dg.data(), dbt.data());
  if (relu) {
    size_t on = std::count_if(y.begin(), y.end(), [](double v) { return v > 0; });
    ASSERT_GT(on, n / 4);
    ASSERT_LT(on, n - n / 4);
  }
  auto eval = [&] {
    op->forward_train(x.data(), gamma.data(), beta.data(), y.data(), rm.data(), rv.data());
    return Probe{dot(y, r), relu ? positive(y) : std::vector<char>{}};
  };
  // Moving one x shifts the whole channel's statistics, so near-zero outputs may cross: allow a
  // few skips under the fused ReLU.
  const double skip = relu ? 0.25 : 0.0;
  expect_gradient("dx", x, dx, eval, skip);
  expect_gradient("dgamma", gamma, dg, eval, skip);
  expect_gradient("dbeta", beta, dbt, eval, skip);
}

TEST_F(RefGradcheck, BatchNormTraining) { check_batchnorm(false); }
TEST_F(RefGradcheck, BatchNormTrainingFusedRelu) { check_batchnorm(true); }

// ---------------------------------------------------------------- element-wise and pooling

TEST_F(RefGradcheck, Relu) {
  ReluDesc d{.name = "relu", .in = {2, 3, 3, 3}};
  auto op = be_->make_relu(d);
  const size_t n = size_t(d.in.numel());
  Vec x = away_from_zero(n, rng_), r = random_vec(n, rng_), y(n), dx(n);
  op->forward(x.data(), y.data());
  op->backward(y.data(), r.data(), dx.data());
  expect_gradient("dx", x, dx, [&] {
    op->forward(x.data(), y.data());
    return Probe{dot(y, r), positive(y)};
  });
}

void check_maxpool(int64_t kernel, int64_t stride, int64_t pad, Shape in) {
  auto be = make_reference_backend<double>();
  std::mt19937_64 rng(kernel * 100 + stride * 10 + pad);
  MaxPoolDesc d{.name = "pool", .in = in, .kernel = kernel, .stride = stride, .pad = pad};
  auto op = be->make_maxpool(d);
  Vec x = distinct_values(size_t(in.numel()), rng), r = random_vec(size_t(d.out().numel()), rng);
  Vec y(r.size()), dx(x.size());
  op->forward(x.data(), y.data(), true);
  op->backward(x.data(), y.data(), r.data(), dx.data());
  expect_gradient("dx", x, dx, [&] {
    op->forward(x.data(), y.data(), false);
    return Probe{dot(y, r), {}};
  });
}

TEST_F(RefGradcheck, MaxPool3x3Stride2Pad1) { check_maxpool(3, 2, 1, {2, 2, 7, 6}); }
TEST_F(RefGradcheck, MaxPool2x2Stride2) { check_maxpool(2, 2, 0, {2, 2, 6, 5}); }

void check_avgpool(int64_t kernel, int64_t stride, int64_t pad, bool ceil_mode, Shape in) {
  auto be = make_reference_backend<double>();
  std::mt19937_64 rng(kernel * 100 + stride * 10 + pad);
  AvgPoolDesc d{.name = "pool", .in = in, .kernel = kernel, .stride = stride, .pad = pad, .ceil_mode = ceil_mode};
  auto op = be->make_avgpool(d);
  Vec x = random_vec(size_t(in.numel()), rng), r = random_vec(size_t(d.out().numel()), rng);
  Vec y(r.size()), dx(x.size());
  op->backward(r.data(), dx.data());
  expect_gradient("dx", x, dx, [&] {
    op->forward(x.data(), y.data());
    return Probe{dot(y, r), {}};
  });
}

// ResNet-D's shortcut pool on odd sides (clipped last windows), and overlapping padded windows.
TEST_F(RefGradcheck, AvgPool2x2Stride2Ceil) { check_avgpool(2, 2, 0, true, {2, 3, 7, 5}); }
TEST_F(RefGradcheck, AvgPool3x3Stride2Pad1Ceil) { check_avgpool(3, 2, 1, true, {2, 2, 6, 7}); }
TEST_F(RefGradcheck, AvgPool3x3Stride1Pad1) { check_avgpool(3, 1, 1, false, {1, 2, 5, 4}); }

TEST_F(RefGradcheck, GlobalAvgPool) {
  GlobalAvgPoolDesc d{.name = "gap", .in = {2, 3, 3, 5}};
  auto op = be_->make_global_avgpool(d);
  Vec x = random_vec(size_t(d.in.numel()), rng_), r = random_vec(size_t(d.out().numel()), rng_);
  Vec y(r.size()), dx(x.size());
  op->backward(r.data(), dx.data());
  expect_gradient("dx", x, dx, [&] {
    op->forward(x.data(), y.data());
    return Probe{dot(y, r), {}};
  });
}

void check_linear(bool bias) {
  auto be = make_reference_backend<double>();
  std::mt19937_64 rng(bias ? 21 : 22);
  LinearDesc d{.name = "fc", .in = {3, 2, 2, 2}, .out_features = 5, .bias = bias};
  auto op = be->make_linear(d);
  Vec x = random_vec(size_t(d.in.numel()), rng), w = random_vec(size_t(5 * d.in.chw()), rng);
  Vec b = random_vec(5, rng), r = random_vec(size_t(d.out().numel()), rng);
  Vec y(r.size()), dx(x.size()), dw(w.size()), db(b.size());
  op->forward(x.data(), w.data(), b.data(), y.data());
  op->backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data());
  auto eval = [&] {
    op->forward(x.data(), w.data(), b.data(), y.data());
    return Probe{dot(y, r), {}};
  };
  expect_gradient("dx", x, dx, eval);
  expect_gradient("dw", w, dw, eval);
  if (bias) expect_gradient("db", b, db, eval);
}

TEST_F(RefGradcheck, LinearWithBias) { check_linear(true); }
TEST_F(RefGradcheck, LinearWithoutBias) { check_linear(false); }

void check_add(bool relu) {
  auto be = make_reference_backend<double>();
  std::mt19937_64 rng(relu ? 31 : 32);
  AddDesc d{.name = "add", .in = {2, 3, 2, 3}, .relu = relu};
  auto op = be->make_add(d);
  const size_t n = size_t(d.in.numel());
  Vec a = random_vec(n, rng), b = random_vec(n, rng), r = random_vec(n, rng), y(n), dx(n);
  op->forward(a.data(), b.data(), y.data());
  op->backward(y.data(), r.data(), dx.data());
  auto eval = [&] {
    op->forward(a.data(), b.data(), y.data());
    return Probe{dot(y, r), relu ? positive(y) : std::vector<char>{}};
  };
  // Sums of two uniforms rarely land within 2h of zero; the limit only guards the skip rule.
  expect_gradient("da", a, dx, eval, relu ? 0.05 : 0.0);
  expect_gradient("db", b, dx, eval, relu ? 0.05 : 0.0);

  // dx may alias dy.
  Vec g = r;
  op->backward(y.data(), g.data(), g.data());
  EXPECT_EQ(g, dx);
}

TEST_F(RefGradcheck, Add) { check_add(false); }
TEST_F(RefGradcheck, AddFusedRelu) { check_add(true); }

TEST_F(RefGradcheck, PadShortcut) {
  for (auto [in, out_c, stride] : {std::tuple{Shape{2, 3, 5, 5}, int64_t(8), int64_t(2)},
                                   std::tuple{Shape{1, 2, 4, 3}, int64_t(2), int64_t(1)}}) {
    PadShortcutDesc d{.name = "shortcut", .in = in, .out_c = out_c, .stride = stride};
    auto op = be_->make_pad_shortcut(d);
    Vec x = random_vec(size_t(in.numel()), rng_), r = random_vec(size_t(d.out().numel()), rng_);
    Vec y(r.size()), dx(x.size());
    op->backward(r.data(), dx.data());
    expect_gradient("dx " + in.str(), x, dx, [&] {
      op->forward(x.data(), y.data());
      return Probe{dot(y, r), {}};
    });
  }
}

void check_xent(double smoothing) {
  auto be = make_reference_backend<double>();
  std::mt19937_64 rng(smoothing > 0 ? 41 : 42);
  SoftmaxXentDesc d{.name = "xent", .in = {4, 5, 1, 1}, .loss = {.label_smoothing = smoothing}};
  auto op = be->make_softmax_xent(d);
  Vec z = random_vec(20, rng, -3, 3), dz(20);
  const std::vector<int32_t> labels = {3, 0, 4, 3};
  const double scale = 0.75;  // checks the loss-scaling factor as well
  op->forward(z.data(), labels.data());
  op->backward(labels.data(), dz.data(), scale);
  expect_gradient("dlogits", z, dz, [&] { return Probe{scale * forward_loss(*op, z.data(), labels.data()), {}}; });
}

TEST_F(RefGradcheck, SoftmaxXent) { check_xent(0.0); }
TEST_F(RefGradcheck, SoftmaxXentLabelSmoothing) { check_xent(0.1); }

// Mixup's targets: the gradient by finite differences, and the loss the blend of the two labels'
// losses (one row mixes a label with itself).
TEST_F(RefGradcheck, SoftmaxXentMixup) {
  auto be = make_reference_backend<double>();
  std::mt19937_64 rng(43);
  SoftmaxXentDesc d{.name = "xent", .in = {4, 5, 1, 1}, .loss = {.label_smoothing = 0.1}};
  auto op = be->make_softmax_xent(d);
  Vec z = random_vec(20, rng, -3, 3), dz(20);
  const std::vector<int32_t> labels = {3, 0, 4, 3}, mixed = {1, 0, 2, 3};
  const Targets t(labels.data(), mixed.data(), 0.3);
  const double scale = 0.75;
  op->forward(z.data(), t);
  op->backward(t, dz.data(), scale);
  expect_gradient("dlogits", z, dz, [&] { return Probe{scale * forward_loss(*op, z.data(), t), {}}; });
  const double la = forward_loss(*op, z.data(), labels.data()), lb = forward_loss(*op, z.data(), mixed.data());
  EXPECT_NEAR(forward_loss(*op, z.data(), t), 0.3 * la + 0.7 * lb, 1e-14);
}

// BCE: finite differences with soft, blended and thresholded targets (the threshold makes the
// targets constants of the labels, so the gradient is still sigmoid - target).
TEST_F(RefGradcheck, Bce) {
  auto be = make_reference_backend<double>();
  std::mt19937_64 rng(44);
  const std::vector<int32_t> labels = {3, 0, 4, 3}, mixed = {1, 0, 2, 3};
  for (const double threshold : {-1.0, 0.0, 0.2})
    for (const bool blend : {false, true}) {
      SCOPED_TRACE(str_cat("threshold ", threshold, " blend ", blend));
      SoftmaxXentDesc d{.name = "bce", .in = {4, 5, 1, 1}, .loss = {LossKind::bce, 0.1, threshold}};
      auto op = be->make_softmax_xent(d);
      Vec z = random_vec(20, rng, -3, 3), dz(20);
      const Targets t = blend ? Targets(labels.data(), mixed.data(), 0.3) : Targets(labels.data());
      op->forward(z.data(), t);
      op->backward(t, dz.data(), 0.75);
      expect_gradient("dlogits", z, dz, [&] { return Probe{0.75 * forward_loss(*op, z.data(), t), {}}; });
    }
}

// Gates drawn over [-3, 3]: sigmoid's slope varies from 0.05 to 0.25 over them.
TEST_F(RefGradcheck, ChannelGate) {
  for (Shape in : {Shape{2, 3, 3, 4}, Shape{3, 5, 1, 1}}) {
    ChannelGateDesc d{.name = "gate", .in = in};
    auto op = be_->make_channel_gate(d);
    Vec x = random_vec(size_t(in.numel()), rng_), g = random_vec(size_t(d.gate().numel()), rng_, -3, 3);
    Vec r = random_vec(x.size(), rng_), y(x.size()), dx(x.size()), dg(g.size());
    op->forward(x.data(), g.data(), y.data());
    op->backward(x.data(), g.data(), r.data(), dx.data(), dg.data());
    auto eval = [&] {
      op->forward(x.data(), g.data(), y.data());
      return Probe{dot(y, r), {}};
    };
    expect_gradient("dx " + in.str(), x, dx, eval);
    expect_gradient("dg " + in.str(), g, dg, eval);
  }
}

// ECA's convolution across channels: kernels wider than, as wide as and narrower than the
// channels (every tap partly in the zero padding, or none).
TEST_F(RefGradcheck, ChannelConv) {
  for (auto [in, k] : {std::pair{Shape{2, 9, 1, 1}, int64_t(3)}, {Shape{3, 5, 1, 1}, 5}, {Shape{1, 2, 1, 1}, 7},
                       {Shape{2, 40, 1, 1}, 7}}) {
    ChannelConvDesc d{.name = "se.conv", .in = in, .kernel = k};
    auto op = be_->make_channel_conv(d);
    Vec x = random_vec(size_t(in.numel()), rng_), w = random_vec(size_t(k), rng_);
    Vec r = random_vec(x.size(), rng_), y(x.size()), dx(x.size()), dw(w.size());
    op->forward(x.data(), w.data(), nullptr, y.data());
    op->backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), nullptr);
    auto eval = [&] {
      op->forward(x.data(), w.data(), nullptr, y.data());
      return Probe{dot(y, r), {}};
    };
    expect_gradient("dx " + in.str(), x, dx, eval);
    expect_gradient("dw " + in.str(), w, dw, eval);
    // Without dx (no input gradient wanted): dw alone, the same.
    Vec dw2(w.size(), 7.0);
    op->backward(x.data(), w.data(), r.data(), nullptr, dw2.data(), nullptr);
    EXPECT_EQ(dw2, dw) << in.str();
  }
}

// ---------------------------------------------------------------- the checker itself

// The check must be able to fail: a gradient off by 1e-4 in one element is reported.
TEST_F(RefGradcheck, CheckerCatchesAWrongGradient) {
  LinearDesc d{.name = "fc", .in = {2, 3, 1, 1}, .out_features = 2};
  auto op = be_->make_linear(d);
  Vec x = random_vec(6, rng_), w = random_vec(6, rng_), b = random_vec(2, rng_);
  Vec r = random_vec(4, rng_), y(4), dx(6), dw(6), db(2);
  op->forward(x.data(), w.data(), b.data(), y.data());
  op->backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data());
  auto eval = [&] {
    op->forward(x.data(), w.data(), b.data(), y.data());
    return Probe{dot(y, r), {}};
  };
  EXPECT_EQ(check_gradient(w, dw, eval).failed, 0);
  dw[3] += 1e-4;
  const CheckStats st = check_gradient(w, dw, eval);
  EXPECT_EQ(st.failed, 1);
  EXPECT_EQ(st.checked, 6);
}

}  // namespace
}  // namespace rt

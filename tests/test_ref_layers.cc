// Reference layers against hand-computed values (the convolution's: test_ref_conv.cc), the float
// build against the double one, and rejection of bad shapes and labels with messages that name
// the layer.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "nn/ops.h"
#include "nn/ref/ref_backend.h"
#include "ref_layers.h"

namespace rt {
namespace {

using namespace test;

// ---------------------------------------------------------------- backend basics

TEST_F(RefLayers, BackendIsPlainNchw) {
  EXPECT_EQ(be_->name(), "reference");
  const Shape s{2, 3, 4, 5};
  EXPECT_EQ(be_->act_size(s), 120u);
  Vec a(120), b(120), c(120);
  for (size_t i = 0; i < a.size(); ++i) a[i] = double(i) * 0.5;
  be_->act_import(a.data(), s, b.data());
  EXPECT_EQ(b, a);
  be_->act_export(b.data(), s, c.data());
  EXPECT_EQ(c, a);
  be_->accumulate(c.data(), a.data(), c.size());
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i], 2 * a[i]);
  EXPECT_EQ(make_backend<double>("reference")->name(), "reference");
  EXPECT_EQ(make_backend<float>("reference")->name(), "reference");
}

// ---------------------------------------------------------------- batch norm

struct BnFixture {
  // N=2, C=2, H=1, W=2. Channel 0 holds 1,2,3,4 (mean 2.5, biased var 1.25, unbiased 5/3);
  // channel 1 holds -1,1,1,3 (mean 1, biased var 2, unbiased 8/3).
  Vec x = {1, 2, -1, 1, 3, 4, 1, 3};
  Vec gamma = {2, 0.5}, beta = {0.1, -0.2};
  Vec rm = {0.5, -1}, rv = {1, 2};
  static size_t ch(size_t i) { return (i / 2) % 2; }
};

TEST_F(RefLayers, BatchNormTrainingNormalisesAndUpdatesRunningStats) {
  for (bool relu : {false, true}) {
    BnFixture f;
    BatchNormDesc d{.name = "bn1", .in = {2, 2, 1, 2}, .eps = 1e-5, .momentum = 0.1, .relu = relu};
    Vec y(8);
    be_->make_batchnorm(d)->forward_train(f.x.data(), f.gamma.data(), f.beta.data(), y.data(),
                                          f.rm.data(), f.rv.data());
    const double mean[2] = {2.5, 1}, var[2] = {1.25, 2};
    for (size_t i = 0; i < 8; ++i) {
      const size_t c = BnFixture::ch(i);
      double want = f.gamma[c] * (f.x[i] - mean[c]) / std::sqrt(var[c] + 1e-5) + f.beta[c];
      if (relu) want = std::max(want, 0.0);
      EXPECT_NEAR(y[i], want, 1e-12) << "element " << i << " relu " << relu;
    }
    // running = 0.9 running + 0.1 batch, with the unbiased variance.
    expect_near_all(f.rm, {0.9 * 0.5 + 0.1 * 2.5, 0.9 * -1 + 0.1 * 1});
    expect_near_all(f.rv, {0.9 * 1 + 0.1 * 5.0 / 3, 0.9 * 2 + 0.1 * 8.0 / 3});
  }
}

TEST_F(RefLayers, BatchNormEvalUsesRunningStats) {
  for (bool relu : {false, true}) {
    BnFixture f;
    BatchNormDesc d{.name = "bn1", .in = {2, 2, 1, 2}, .relu = relu};
    Vec y(8);
    be_->make_batchnorm(d)->forward_eval(f.x.data(), f.gamma.data(), f.beta.data(), f.rm.data(),
                                         f.rv.data(), y.data());
    for (size_t i = 0; i < 8; ++i) {
      const size_t c = BnFixture::ch(i);
      double want = f.gamma[c] * (f.x[i] - f.rm[c]) / std::sqrt(f.rv[c] + 1e-5) + f.beta[c];
      if (relu) want = std::max(want, 0.0);
      EXPECT_NEAR(y[i], want, 1e-12) << "element " << i << " relu " << relu;
    }
    expect_near_all(f.rm, {0.5, -1});  // eval leaves the running stats alone
    expect_near_all(f.rv, {1, 2});
  }
}

// ---------------------------------------------------------------- pooling and element-wise

TEST_F(RefLayers, MaxPoolTiesGoToTheFirstMaximum) {
  const Vec x = {5, 5, 1, 2,  //
                 5, 1, 3, 3,  //
                 0, 0, -1, -1,  //
                 0, 0, -1, -2};
  auto op = be_->make_maxpool({.name = "pool", .in = {1, 1, 4, 4}, .kernel = 2, .stride = 2, .pad = 0});
  Vec y(4), dy = {1, 2, 3, 4}, dx(16);
  op->forward(x.data(), y.data(), true);
  expect_near_all(y, {5, 3, 0, -1});
  op->backward(x.data(), y.data(), dy.data(), dx.data());
  Vec want(16, 0.0);
  want[0] = 1;   // (0,0), not (0,1) or (1,0)
  want[6] = 2;   // (1,2), not (1,3)
  want[8] = 3;   // (2,0)
  want[10] = 4;  // (2,2)
  expect_near_all(dx, want);
}

TEST_F(RefLayers, MaxPoolPaddingIsMinusInfinityAndOverlapsAccumulate) {
  // All-negative input: zero padding would win; -inf padding must not.
  const Vec x = {-3, -1, -2, -4};
  Vec y(1);
  be_->make_maxpool({.name = "pool", .in = {1, 1, 2, 2}, .kernel = 3, .stride = 2, .pad = 1})
      ->forward(x.data(), y.data(), false);
  expect_near_all(y, {-1});

  // 3x3/2 pad 1 on 3x3: all four windows contain the centre, which is the maximum.
  Vec x3 = {-1, -2, -3, -4, 9, -5, -6, -7, -8}, y3(4), dy = {1, 2, 3, 4}, dx(9);
  auto op = be_->make_maxpool({.name = "pool", .in = {1, 1, 3, 3}, .kernel = 3, .stride = 2, .pad = 1});
  op->forward(x3.data(), y3.data(), true);
  expect_near_all(y3, {9, 9, 9, 9});
  op->backward(x3.data(), y3.data(), dy.data(), dx.data());
  expect_near_all(dx, {0, 0, 0, 0, 10, 0, 0, 0, 0});
}

TEST_F(RefLayers, AvgPoolCeilModeCountsOnlyTheInput) {
  // ResNet-D's shortcut pool (2x2, stride 2, ceil_mode) on 3x3: the last row and column form
  // windows of 2 and 1 elements, each averaged over what it covers (PyTorch's
  // count_include_pad=False): torch.nn.AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False).
  const Vec x = {1, 2, 3,  //
                 4, 5, 6,  //
                 7, 8, 10};
  AvgPoolDesc d{.name = "layer2.0.downsample.0", .in = {1, 1, 3, 3}, .kernel = 2, .stride = 2, .pad = 0};
  EXPECT_EQ(d.out().str(), Shape({1, 1, 2, 2}).str());
  auto op = be_->make_avgpool(d);
  Vec y(4), dy = {4, 6, 8, 5}, dx(9);
  op->forward(x.data(), y.data());
  expect_near_all(y, {3, 4.5, 7.5, 10});
  op->backward(dy.data(), dx.data());
  expect_near_all(dx, {1, 1, 3, 1, 1, 3, 4, 4, 5});
  // Without ceil_mode the last row and column are dropped.
  EXPECT_EQ((AvgPoolDesc{.name = "p", .in = {1, 1, 3, 3}, .ceil_mode = false}.out().str()), Shape({1, 1, 1, 1}).str());
  // 3x3, stride 2, pad 1 on 3x3: every window clipped to the input; overlaps accumulate.
  auto pad = be_->make_avgpool({.name = "p", .in = {1, 1, 3, 3}, .kernel = 3, .stride = 2, .pad = 1, .ceil_mode = false});
  Vec ones(9, 1.0), y2(4), dy2 = {4, 4, 4, 4}, dx2(9);
  pad->forward(x.data(), y2.data());
  expect_near_all(y2, {3, 4, 6, 29.0 / 4});
  pad->backward(dy2.data(), dx2.data());
  expect_near_all(dx2, {1, 2, 1, 2, 4, 2, 1, 2, 1});
  // ceil_mode never starts a window in the right padding (PyTorch's rule): 2x2/2 pad 1 on 5
  // rounds (5 + 2 - 2) / 2 up to 3 steps, 4 windows, but the fourth would start past the input;
  // on 4, the third starts on the last element and stays.
  EXPECT_EQ((AvgPoolDesc{.name = "p", .in = {1, 1, 5, 4}, .kernel = 2, .stride = 2, .pad = 1}.out().str()),
            Shape({1, 1, 3, 3}).str());
}

TEST_F(RefLayers, ChannelConvByHand) {
  // torch.nn.Conv1d(1, 1, 3, padding=1, bias=False), weights 1, 2, 3, on [1, 2, 3, 4] and
  // [0, 1, 0, -1]: a cross-correlation (no flip), zero padded.
  auto op = be_->make_channel_conv({.name = "layer1.0.se.conv", .in = {2, 4, 1, 1}, .kernel = 3});
  const Vec x = {1, 2, 3, 4, 0, 1, 0, -1}, w = {1, 2, 3};
  Vec y(8), dy = {1, 0, 0, 0, 0, 0, 0, 1}, dx(8), dw(3);
  op->forward(x.data(), w.data(), nullptr, y.data());
  expect_near_all(y, {8, 14, 20, 11, 3, 2, -2, -2});
  op->backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr);
  // dy picks y[0][0] (= 2 x0 + 3 x1) and y[1][3] (= 1 x2 + 2 x3): dx and dw by hand.
  expect_near_all(dx, {2, 3, 0, 0, 0, 0, 1, 2});
  expect_near_all(dw, {0 + 0, 1 + -1, 2 + 0});
}

TEST_F(RefLayers, GlobalAvgPoolByHand) {
  auto op = be_->make_global_avgpool({.name = "gap", .in = {1, 2, 2, 2}});
  Vec x = {1, 2, 3, 6, -1, -1, -1, 7}, y(2), dy = {4, -8}, dx(8);
  op->forward(x.data(), y.data());
  expect_near_all(y, {3, 1});
  op->backward(dy.data(), dx.data());
  expect_near_all(dx, {1, 1, 1, 1, -2, -2, -2, -2});
}

TEST_F(RefLayers, LinearByHand) {
  // in = C*H*W = 3; w is [out][in].
  auto op = be_->make_linear({.name = "fc", .in = {1, 3, 1, 1}, .out_features = 2});
  Vec x = {1, 2, 3}, w = {1, 0, -1, 2, 1, 0}, b = {0.5, -1}, y(2);
  op->forward(x.data(), w.data(), b.data(), y.data());
  expect_near_all(y, {-1.5, 3});
  Vec dy = {1, -1}, dx(3), dw(6), db(2);
  op->backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
  expect_near_all(dx, {-1, -1, -1});
  expect_near_all(dw, {1, 2, 3, -1, -2, -3});
  expect_near_all(db, {1, -1});
}

TEST_F(RefLayers, ReluAndAddByHand) {
  Vec x = {1, -2, 0, 0.5}, y(4), dy = {1, 1, 1, 1}, dx(4);
  auto relu = be_->make_relu({.name = "relu", .in = {1, 4, 1, 1}});
  relu->forward(x.data(), y.data());
  expect_near_all(y, {1, 0, 0, 0.5});
  relu->backward(y.data(), dy.data(), dx.data());
  expect_near_all(dx, {1, 0, 0, 1});

  Vec a = {1, -2, 0.5}, b = {-3, 1, 0.5}, s(3), g = {5, 6, 7};
  auto add = be_->make_add({.name = "add", .in = {1, 3, 1, 1}});
  add->forward(a.data(), b.data(), s.data());
  expect_near_all(s, {-2, -1, 1});
  auto add_relu = be_->make_add({.name = "add", .in = {1, 3, 1, 1}, .relu = true});
  add_relu->forward(a.data(), b.data(), s.data());
  expect_near_all(s, {0, 0, 1});
  add_relu->backward(s.data(), g.data(), g.data());  // in place
  expect_near_all(g, {0, 0, 7});
}

TEST_F(RefLayers, PadShortcutPlacesChannelsAndSubsamples) {
  // 3 -> 6 channels: (6 - 3) / 2 = 1 zero channel before, 2 after; stride 2 on 5x5 keeps rows
  // and columns 0, 2, 4.
  PadShortcutDesc d{.name = "layer2.0.shortcut", .in = {2, 3, 5, 5}, .out_c = 6, .stride = 2};
  ASSERT_EQ(d.out(), (Shape{2, 6, 3, 3}));
  Vec x(150), y(108);
  for (size_t i = 0; i < x.size(); ++i) x[i] = double(i) + 1;
  auto op = be_->make_pad_shortcut(d);
  op->forward(x.data(), y.data());
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 6; ++c)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 3; ++j) {
          const double got = y[size_t(((n * 6 + c) * 3 + i) * 3 + j)];
          const double want =
              (c >= 1 && c < 4) ? x[size_t(((n * 3 + c - 1) * 5 + 2 * i) * 5 + 2 * j)] : 0.0;
          EXPECT_EQ(got, want) << n << "," << c << "," << i << "," << j;
        }
  // Backward routes each gradient to its source pixel; skipped pixels get zero.
  Vec dx(150);
  op->backward(y.data(), dx.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t h = (i / 5) % 5, w = i % 5;
    EXPECT_EQ(dx[i], (h % 2 == 0 && w % 2 == 0) ? x[i] : 0.0) << i;
  }
}

// ---------------------------------------------------------------- softmax cross-entropy

TEST_F(RefLayers, SoftmaxXentWithSmoothingMatchesClosedForm) {
  // Row 0: logits 0, ln 2, ln 3 give p = 1/6, 2/6, 3/6; label 1.
  // Row 1: equal logits give p = 1/3 and loss ln 3 whatever the smoothing; label 0.
  const double eps = 0.1;
  Vec z = {0, std::log(2.0), std::log(3.0), 0.7, 0.7, 0.7}, dz(6);
  const std::vector<int32_t> labels = {1, 0};
  auto op = be_->make_softmax_xent({.name = "loss", .in = {2, 3, 1, 1}, .loss = {.label_smoothing = eps}});
  const double row0 = -(1 - eps) * std::log(2.0 / 6) -
                      eps / 3 * (std::log(1.0 / 6) + std::log(2.0 / 6) + std::log(3.0 / 6));
  EXPECT_NEAR(forward_loss(*op, z.data(), labels.data()), (row0 + std::log(3.0)) / 2, 1e-14);

  // (p - target) / N * scale, target = (1 - eps) onehot + eps / K.
  op->backward(labels.data(), dz.data(), 4.0);
  const double t1 = 1 - eps + eps / 3, t0 = eps / 3;
  expect_near_all(dz, {(1.0 / 6 - t0) * 2, (2.0 / 6 - t1) * 2, (3.0 / 6 - t0) * 2,
                       (1.0 / 3 - t1) * 2, (1.0 / 3 - t0) * 2, (1.0 / 3 - t0) * 2},
                  1e-14);
}

TEST_F(RefLayers, SoftmaxXentIsStableForHugeLogits) {
  Vec z = {1000, 0, -1000}, dz(3);
  auto op = be_->make_softmax_xent({.name = "loss", .in = {1, 3, 1, 1}});
  const int32_t right = 0, wrong = 2;
  EXPECT_NEAR(forward_loss(*op, z.data(), &right), 0.0, 1e-12);
  EXPECT_NEAR(forward_loss(*op, z.data(), &wrong), 2000.0, 1e-9);
  op->backward(&wrong, dz.data());
  expect_near_all(dz, {1, 0, -1});

  auto opf = make_reference_backend<float>()->make_softmax_xent({.name = "loss", .in = {1, 3, 1, 1}});
  std::vector<float> zf = {1000, 0, -1000};
  EXPECT_NEAR(forward_loss(*opf, zf.data(), &wrong), 2000.0, 1e-3);
}

// ---------------------------------------------------------------- binary cross-entropy

// torch.nn.functional.binary_cross_entropy_with_logits (float64, mean reduction) on targets built
// as timm builds them: (1 - eps) (mix onehot(a) + (1 - mix) onehot(b)) + eps / K, then (timm's
// target_threshold) > 0.2. Logits include 30 and -40, where a naive log(1 + exp(z)) loses it.
TEST_F(RefLayers, BceMatchesTorch) {
  const Vec z = {2.0, -1.0, 0.5, 30.0, -40.0, 0.0, 1.5, -0.25, 0.75, -2.0, 3.0, 1.0};
  const std::vector<int32_t> labels = {3, 0, 2}, mixed = {1, 0, 3};
  struct Case {
    const char* what;
    Targets t;
    double threshold, loss;
    Vec grad;
  };
  const Targets blend(labels.data(), mixed.data(), 0.7);
  const Case cases[] = {
      {"smoothed", Targets(labels.data()), -1, 4.035242884784398,
       {0.07131642316482352, 0.020328451780832927, 0.04978827760015455, 0.006249999999992206,
        -0.07708333333333334, 0.03958333333333333, 0.06604787301613697, 0.03440195825951683,
        0.054514891597949415, 0.00785024350184313, 0.002297843901869443, 0.05883821488583374}},
      {"blended", blend, -1, 4.777742884784399,
       {0.07131642316482352, -0.0021715482191670826, 0.04978827760015455, 0.02874999999999221,
        -0.07708333333333334, 0.03958333333333333, 0.06604787301613697, 0.03440195825951683,
        0.054514891597949415, 0.00785024350184313, 0.024797843901869444, 0.03633821488583373}},
      {"thresholded", blend, 0.2, 4.084201218117731,
       {0.07339975649815686, -0.06092154821916707, 0.05187161093348788, -7.790064889453182e-15,
        -0.08333333333333333, 0.041666666666666664, 0.0681312063494703, 0.03648529159285016,
        0.05659822493128275, 0.009933576835176462, -0.003952156098130553, -0.02241178511416626}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto op = be_->make_softmax_xent(
        {.name = "loss", .in = {3, 4, 1, 1}, .loss = {LossKind::bce, 0.1, c.threshold}});
    EXPECT_NEAR(forward_loss(*op, z.data(), c.t), c.loss, 1e-14);
    Vec dz(z.size());
    op->backward(c.t, dz.data(), 2.0);
    for (double& g : dz) g /= 2.0;  // the loss scale divides out
    expect_near_all(dz, c.grad, 1e-15);
  }
}

// bce_threshold as timm's target_threshold (target.gt(threshold)): a target exactly at the
// threshold is not present. With threshold 0 and no smoothing that is every class neither label
// names: counted present (>=), every image would be of all classes.
TEST(BceTargets, ThresholdIsStrict) {
  for (double threshold : {0.0, 0.3}) {
    SCOPED_TRACE(threshold);
    const SoftmaxXentDesc d{.name = "loss", .in = {2, 4, 1, 1}, .loss = {LossKind::bce, 0.0, threshold}};
    EXPECT_EQ(d.target_of(threshold), 0.0);  // at the threshold: absent
    EXPECT_EQ(d.target_of(threshold + 1e-9), 1.0);
    EXPECT_EQ(d.target_of(1.0), 1.0);
    const std::vector<int32_t> labels = {3, 0};
    const Targets t(labels.data());
    EXPECT_EQ(d.target(t, 0, 2), 0.0);  // a class the label does not name
    EXPECT_EQ(d.target(t, 0, 3), 1.0);
  }
}

// ---------------------------------------------------------------- float against double

// Runs one op in float and double on the same data and compares; the float build is what the
// oneDNN tests use as their oracle.
TEST_F(RefLayers, FloatMatchesDouble) {
  auto bf = make_reference_backend<float>();
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  auto rnd = [&](size_t n) {
    Vec v(n);
    for (auto& e : v) e = u(rng);
    return v;
  };
  auto to_f = [](const Vec& v) { return std::vector<float>(v.begin(), v.end()); };
  auto near = [](const std::vector<float>& f, const Vec& d, const char* what) {
    ASSERT_EQ(f.size(), d.size());
    for (size_t i = 0; i < d.size(); ++i)
      EXPECT_NEAR(f[i], d[i], 1e-5 + 1e-5 * std::abs(d[i])) << what << " element " << i;
  };

  ConvDesc cd{.name = "conv", .in = {2, 4, 9, 9}, .out_c = 8, .kernel_h = 3, .kernel_w = 3,
              .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1, .bias = true};
  Vec x = rnd(size_t(cd.in.numel())), w = rnd(size_t(cd.weight_count())), b = rnd(8);
  Vec dy = rnd(size_t(cd.out().numel())), y(dy.size()), dx(x.size()), dw(w.size()), db(8);
  auto xf = to_f(x), wf = to_f(w), bfv = to_f(b), dyf = to_f(dy);
  std::vector<float> yf(y.size()), dxf(dx.size()), dwf(dw.size()), dbf(8);
  auto c64 = be_->make_conv(cd);
  auto c32 = bf->make_conv(cd);
  c64->forward(x.data(), w.data(), b.data(), y.data());
  c64->backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
  c32->forward(xf.data(), wf.data(), bfv.data(), yf.data());
  c32->backward(xf.data(), wf.data(), dyf.data(), dxf.data(), dwf.data(), dbf.data());
  near(yf, y, "conv y");
  near(dxf, dx, "conv dx");
  near(dwf, dw, "conv dw");
  near(dbf, db, "conv db");

  BatchNormDesc bd{.name = "bn", .in = {2, 3, 4, 4}, .relu = true};
  Vec bx = rnd(96), g = rnd(3), be = rnd(3), bdy = rnd(96), by(96), bdx(96), dg(3), dbe(3);
  Vec rm(3, 0.0), rv(3, 1.0);
  auto bxf = to_f(bx), gf = to_f(g), bef = to_f(be), bdyf = to_f(bdy);
  std::vector<float> byf(96), bdxf(96), dgf(3), dbef(3), rmf(3, 0.f), rvf(3, 1.f);
  auto n64 = be_->make_batchnorm(bd);
  auto n32 = bf->make_batchnorm(bd);
  n64->forward_train(bx.data(), g.data(), be.data(), by.data(), rm.data(), rv.data());
  n64->backward(bx.data(), g.data(), by.data(), bdy.data(), bdx.data(), dg.data(), dbe.data());
  n32->forward_train(bxf.data(), gf.data(), bef.data(), byf.data(), rmf.data(), rvf.data());
  n32->backward(bxf.data(), gf.data(), byf.data(), bdyf.data(), bdxf.data(), dgf.data(), dbef.data());
  near(byf, by, "bn y");
  near(bdxf, bdx, "bn dx");
  near(dgf, dg, "bn dgamma");
  near(dbef, dbe, "bn dbeta");
  near(rmf, rm, "bn running_mean");
  near(rvf, rv, "bn running_var");
}

// ---------------------------------------------------------------- bad input

// Runs f, expecting an exception of type E whose message contains every needle.
template <class E, class F>
void expect_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

TEST_F(RefLayers, RejectsKernelLargerThanPaddedInput) {
  expect_error<ShapeError>(
      [&] {
        be_->make_conv({.name = "layer1.0.conv1", .in = {1, 3, 2, 2}, .out_c = 4, .kernel_h = 5,
                        .kernel_w = 5, .pad_h = 1, .pad_w = 1});
      },
      {"layer1.0.conv1", "5x5", "4x4", "[1,3,2,2]"});
  expect_error<ShapeError>(
      [&] { be_->make_maxpool({.name = "maxpool", .in = {1, 1, 2, 2}, .kernel = 5, .stride = 1, .pad = 1}); },
      {"maxpool", "[1,1,2,2]"});
  expect_error<ShapeError>(
      [&] { be_->make_avgpool({.name = "layer2.0.downsample.0", .in = {1, 1, 1, 1}, .kernel = 2, .stride = 2}); },
      {"layer2.0.downsample.0", "[1,1,1,1]"});
  expect_error<ShapeError>(  // PyTorch's rule: pad at most half the kernel
      [&] { be_->make_avgpool({.name = "pool", .in = {1, 1, 8, 8}, .kernel = 3, .stride = 1, .pad = 2}); },
      {"pool", "pad 2"});
}

TEST_F(RefLayers, ChannelConvRejectsEvenKernelsAndSpatialInputs) {
  expect_error<ShapeError>([&] { be_->make_channel_conv({.name = "se.conv", .in = {2, 4, 1, 1}, .kernel = 4}); },
                           {"se.conv", "4", "odd"});
  expect_error<ShapeError>([&] { be_->make_channel_conv({.name = "se.conv", .in = {2, 4, 2, 1}, .kernel = 3}); },
                           {"se.conv", "[2,4,2,1]"});
}

TEST_F(RefLayers, RejectsEmptyOutputs) {
  expect_error<ShapeError>([&] { be_->make_conv({.name = "conv1", .in = {2, 3, 8, 8}, .out_c = 0}); },
                           {"conv1", "[2,3,8,8]", "out_c"});
  expect_error<ShapeError>([&] { be_->make_linear({.name = "fc", .in = {2, 64, 1, 1}, .out_features = 0}); },
                           {"fc", "[2,64,1,1]"});
  expect_error<ShapeError>(
      [&] { be_->make_pad_shortcut({.name = "layer2.0.shortcut", .in = {1, 32, 4, 4}, .out_c = 16, .stride = 2}); },
      {"layer2.0.shortcut", "[1,32,4,4]", "16"});
  expect_error<ShapeError>(
      [&] { be_->make_softmax_xent({.name = "loss", .in = {4, 10, 2, 1}}); }, {"loss", "[4,10,2,1]"});
}

TEST_F(RefLayers, RejectsGroupsThatDoNotDivideTheChannels) {
  expect_error<ShapeError>(
      [&] { be_->make_conv({.name = "layer1.0.conv2", .in = {1, 6, 4, 4}, .out_c = 8, .groups = 4}); },
      {"layer1.0.conv2", "4 groups", "6", "8"});
  expect_error<ShapeError>(
      [&] { be_->make_conv({.name = "c", .in = {1, 4, 4, 4}, .out_c = 6, .groups = 4}); },
      {"4 groups", "6"});
  expect_error<ShapeError>(
      [&] { be_->make_conv({.name = "c0", .in = {1, 4, 4, 4}, .out_c = 4, .groups = 0}); },
      {"c0", "0 groups"});
}

TEST_F(RefLayers, BatchNormTrainingRejectsASingleValuePerChannel) {
  BatchNormDesc d{.name = "bn_head", .in = {1, 4, 1, 1}};
  auto op = be_->make_batchnorm(d);
  Vec x(4), g(4, 1.0), b(4), y(4), rm(4), rv(4, 1.0);
  expect_error<ShapeError>(
      [&] { op->forward_train(x.data(), g.data(), b.data(), y.data(), rm.data(), rv.data()); },
      {"bn_head", "[1,4,1,1]"});
  op->forward_eval(x.data(), g.data(), b.data(), rm.data(), rv.data(), y.data());  // fine in eval
}

TEST_F(RefLayers, BadLabelNamesLayerLabelAndIndex) {
  auto op = be_->make_softmax_xent({.name = "fc_loss", .in = {3, 5, 1, 1}});
  Vec z(15, 0.0), dz(15);
  const std::vector<int32_t> too_big = {1, 2, 5}, negative = {-1, 0, 0};
  expect_error<Error>([&] { op->forward(z.data(), too_big.data()); },
                      {"fc_loss", "label 5", "index 2", "[0, 5)", "[3,5,1,1]"});
  expect_error<Error>([&] { op->forward(z.data(), negative.data()); }, {"fc_loss", "label -1", "index 0"});
  expect_error<Error>([&] { op->backward(too_big.data(), dz.data()); }, {"fc_loss", "label 5"});
}

// Mixup's targets: a bad partner label or weight is named, and the weights 1 and 0 are each label
// alone, bit for bit.
TEST_F(RefLayers, MixupTargets) {
  auto op = be_->make_softmax_xent({.name = "fc_loss", .in = {3, 5, 1, 1}, .loss = {.label_smoothing = 0.1}});
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-2, 2);
  Vec z(15);
  for (auto& e : z) e = u(rng);
  Vec dz(15), dref(15);
  const std::vector<int32_t> a = {1, 2, 4}, b = {0, 2, 3}, bad = {0, 7, 3};
  expect_error<Error>([&] { op->forward(z.data(), Targets(a.data(), bad.data(), 0.5)); },
                      {"fc_loss", "mixed-in label 7", "index 1"});
  expect_error<Error>([&] { op->forward(z.data(), Targets(a.data(), b.data(), 1.5)); }, {"fc_loss", "1.5"});
  for (const auto& [mix, alone] : {std::pair{1.0, &a}, std::pair{0.0, &b}}) {
    const Targets t(a.data(), b.data(), mix);
    const double lm = forward_loss(*op, z.data(), t);
    op->backward(t, dz.data());
    const double l = forward_loss(*op, z.data(), alone->data());
    op->backward(alone->data(), dref.data());
    EXPECT_EQ(lm, l) << "mix " << mix;
    EXPECT_EQ(dz, dref) << "mix " << mix;
  }
}

}  // namespace
}  // namespace rt

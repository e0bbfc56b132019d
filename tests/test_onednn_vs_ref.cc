// The oneDNN backend against the reference backend: every op but the convolution
// (test_onednn_conv_vs_ref.cc), forward and backward, every output and gradient (and batch-norm
// running statistics), through act_import/act_export so that the blocked layouts are exercised;
// then whole ResNets. |fast - ref| <= atol + rtol |ref|, atol scaled to the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "nn/onednn/onednn_common.h"
#include "nn/resnet.h"
#include "onednn_vs_ref.h"

namespace rt {
namespace {

using namespace test;

TEST_F(OnednnVsRef, LayoutRoundTripAndAccumulate) {
  EXPECT_EQ(fast_->name(), "onednn");
  for (Shape s : {Shape{2, 16, 5, 3}, Shape{2, 3, 4, 4}, Shape{3, 5, 2, 7}, Shape{4, 24, 1, 1},
                  Shape{2, 24, 3, 3}, Shape{1, 48, 2, 3}}) {
    Vec x = rand(size_t(s.numel()));
    EXPECT_EQ(from_fast(to_fast(x, s), s), x) << s.str();
  }
  Vec a = rand(100000), b = rand(100000), want(a.size());
  for (size_t i = 0; i < a.size(); ++i) want[i] = a[i] + b[i];
  fast_->accumulate(a.data(), b.data(), a.size());
  EXPECT_EQ(a, want);
}

// The block is the option's, else the processor's (16 where oneDNN runs AVX-512); the set-up
// line names the layout; Winograd keeps 8-channel blocks; other blocks are refused.
TEST_F(OnednnVsRef, ActivationBlockFollowsTheOptionOrTheProcessor) {
  for (int b : {8, 16}) {
    BackendOptions o;
    o.onednn_block = b;
    EXPECT_NE(make_backend<float>("onednn", o)->setup_note().find(str_cat("nChw", b, "c")), std::string::npos) << b;
  }
  EXPECT_NE(make_backend<float>("onednn")->setup_note().find(str_cat("nChw", dnn::native_block(), "c")),
            std::string::npos);
  EXPECT_NE(make_backend<float>("onednn-winograd")->setup_note().find("nChw8c"), std::string::npos);
  BackendOptions bad;
  bad.onednn_block = 16;
  EXPECT_THROW(make_backend<float>("onednn-winograd", bad), Error);
  bad.onednn_block = 12;
  EXPECT_THROW(make_backend<float>("onednn", bad), Error);
}

// ---------------------------------------------------------------- batch norm

struct BnCase {
  Shape in;
  bool relu;
};
void PrintTo(const BnCase& c, std::ostream* os) { *os << c.in.str() << (c.relu ? " relu" : ""); }

class BatchNormVsRef : public OnednnVsRef, public ::testing::WithParamInterface<BnCase> {};

TEST_P(BatchNormVsRef, TrainEvalBackward) {
  const BnCase& p = GetParam();
  BatchNormDesc d{.name = "bn", .in = p.in, .relu = p.relu};
  auto fast = fast_->make_batchnorm(d);
  auto ref = ref_->make_batchnorm(d);
  const size_t C = size_t(p.in.c), n = size_t(p.in.numel());
  Vec gamma = rand(C, 0.5f, 1.5f), beta = rand(C, -0.5f, 0.5f);
  Vec rm_ref = rand(C), rv_ref = rand(C, 0.5f, 2.f), rm = rm_ref, rv = rv_ref;
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    Vec x = rand(n, -2.f + float(step), 3.f), dy = rand(n);
    Vec y_ref(n);
    ref->forward_train(x.data(), gamma.data(), beta.data(), y_ref.data(), rm_ref.data(), rv_ref.data());
    Vec xf = to_fast(x, p.in), yf = fast_buf(p.in);
    fast->forward_train(xf.data(), gamma.data(), beta.data(), yf.data(), rm.data(), rv.data());
    expect_close(from_fast(yf, p.in), y_ref, "y");
    expect_close(rm, rm_ref, "running_mean");
    expect_close(rv, rv_ref, "running_var");

    Vec dx_ref(n), dg_ref(C), db_ref(C);
    ref->backward(x.data(), gamma.data(), y_ref.data(), dy.data(), dx_ref.data(), dg_ref.data(),
                  db_ref.data());
    Vec dyf = to_fast(dy, p.in), dxf = fast_buf(p.in), dg(C, kNaN), db(C, kNaN);
    fast->backward(xf.data(), gamma.data(), yf.data(), dyf.data(), dxf.data(), dg.data(), db.data());
    expect_close(from_fast(dxf, p.in), dx_ref, "dx");
    expect_close(dg, dg_ref, "dgamma");
    expect_close(db, db_ref, "dbeta");

    Vec ye_ref(n), yef = fast_buf(p.in);
    ref->forward_eval(x.data(), gamma.data(), beta.data(), rm_ref.data(), rv_ref.data(), ye_ref.data());
    fast->forward_eval(xf.data(), gamma.data(), beta.data(), rm.data(), rv.data(), yef.data());
    expect_close(from_fast(yef, p.in), ye_ref, "eval y");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BatchNormVsRef,
                         ::testing::Values(BnCase{{2, 16, 5, 5}, false}, BnCase{{2, 16, 5, 5}, true},
                                           BnCase{{4, 5, 3, 3}, true}, BnCase{{1, 8, 7, 7}, true},
                                           BnCase{{3, 24, 1, 2}, false}, BnCase{{8, 16, 1, 1}, true},
                                           BnCase{{2, 64, 9, 7}, true}, BnCase{{5, 3, 4, 4}, false}));

// Channels whose mean dwarfs their spread: the variance must not come from a cancelling
// difference of large sums.
TEST_F(OnednnVsRef, BatchNormLargeMean) {
  for (Shape s : {Shape{4, 16, 9, 9}, Shape{3, 5, 6, 6}}) {
    SCOPED_TRACE(s.str());
    BatchNormDesc d{.name = "bn", .in = s, .relu = true};
    auto fast = fast_->make_batchnorm(d);
    auto ref = ref_->make_batchnorm(d);
    const size_t C = size_t(s.c), n = size_t(s.numel());
    Vec x = rand(n, 999.f, 1001.f), dy = rand(n), g = rand(C, 0.5f, 1.5f), b = rand(C, -0.5f, 0.5f);
    Vec rm(C), rv(C, 1.f), rm_ref = rm, rv_ref = rv, y_ref(n), dx_ref(n), dg_ref(C), db_ref(C);
    ref->forward_train(x.data(), g.data(), b.data(), y_ref.data(), rm_ref.data(), rv_ref.data());
    ref->backward(x.data(), g.data(), y_ref.data(), dy.data(), dx_ref.data(), dg_ref.data(), db_ref.data());
    Vec xf = to_fast(x, s), yf = fast_buf(s), dyf = to_fast(dy, s), dxf = fast_buf(s), dg(C), db(C);
    fast->forward_train(xf.data(), g.data(), b.data(), yf.data(), rm.data(), rv.data());
    fast->backward(xf.data(), g.data(), yf.data(), dyf.data(), dxf.data(), dg.data(), db.data());
    expect_close(from_fast(yf, s), y_ref, "y");
    expect_close(rm, rm_ref, "running_mean");
    expect_close(rv, rv_ref, "running_var");
    expect_close(from_fast(dxf, s), dx_ref, "dx");
    expect_close(dg, dg_ref, "dgamma");
    expect_close(db, db_ref, "dbeta");
  }
}

TEST_F(OnednnVsRef, BatchNormRefusesOneValuePerChannel) {
  auto fast = fast_->make_batchnorm({.name = "bn1", .in = {1, 8, 1, 1}});
  Vec x(8, 1.f), g(8, 1.f), b(8), y(8), rm(8), rv(8, 1.f);
  EXPECT_THROW(fast->forward_train(x.data(), g.data(), b.data(), y.data(), rm.data(), rv.data()),
               ShapeError);
}

// ---------------------------------------------------------------- pooling

struct PoolCase {
  Shape in;
  int64_t kernel, stride, pad;
  bool ties;  // values from a small set so that windows hold equal maxima
};
void PrintTo(const PoolCase& c, std::ostream* os) {
  *os << c.in.str() << " k" << c.kernel << " s" << c.stride << " p" << c.pad << (c.ties ? " ties" : "");
}

class MaxPoolVsRef : public OnednnVsRef, public ::testing::WithParamInterface<PoolCase> {};

TEST_P(MaxPoolVsRef, ForwardBackward) {
  const PoolCase& p = GetParam();
  MaxPoolDesc d{.name = "pool", .in = p.in, .kernel = p.kernel, .stride = p.stride, .pad = p.pad};
  const Shape out = d.out();
  auto fast = fast_->make_maxpool(d);
  auto ref = ref_->make_maxpool(d);
  Vec x = rand(size_t(p.in.numel()), -1.f, 1.f), dy = rand(size_t(out.numel()));
  if (p.ties)
    for (auto& v : x) v = std::round(v * 1.5f);
  Vec y_ref(size_t(out.numel())), dx_ref(x.size());
  ref->forward(x.data(), y_ref.data(), true);
  ref->backward(x.data(), y_ref.data(), dy.data(), dx_ref.data());
  Vec xf = to_fast(x, p.in), yf = fast_buf(out), dyf = to_fast(dy, out), dxf = fast_buf(p.in);
  fast->forward(xf.data(), yf.data(), true);
  expect_close(from_fast(yf, out), y_ref, "y");
  fast->backward(xf.data(), yf.data(), dyf.data(), dxf.data());
  expect_close(from_fast(dxf, p.in), dx_ref, "dx");
  Vec ye = fast_buf(out);
  fast->forward(xf.data(), ye.data(), false);
  expect_close(from_fast(ye, out), y_ref, "eval y");
}

INSTANTIATE_TEST_SUITE_P(Shapes, MaxPoolVsRef,
                         ::testing::Values(PoolCase{{2, 16, 9, 9}, 3, 2, 1, false},
                                           PoolCase{{2, 16, 8, 8}, 3, 2, 1, true},
                                           PoolCase{{2, 5, 8, 7}, 3, 2, 1, true},
                                           PoolCase{{2, 8, 10, 10}, 2, 2, 0, true},
                                           PoolCase{{1, 64, 12, 12}, 3, 2, 1, false},
                                           PoolCase{{2, 16, 2, 2}, 3, 2, 1, false}));

// Windowed average pooling: ResNet-D's 2x2/2 ceil_mode on even and odd sides (oneDNN's right
// padding completes the last window), padded and overlapping windows, unblocked channel counts.
TEST_F(OnednnVsRef, AvgPool) {
  const AvgPoolDesc cases[] = {
      {.name = "p", .in = {2, 16, 8, 8}, .kernel = 2, .stride = 2},
      {.name = "p", .in = {2, 16, 7, 9}, .kernel = 2, .stride = 2},
      {.name = "p", .in = {2, 5, 7, 7}, .kernel = 2, .stride = 2},
      {.name = "p", .in = {1, 24, 1, 3}, .kernel = 1, .stride = 2},
      {.name = "p", .in = {2, 8, 9, 8}, .kernel = 3, .stride = 2, .pad = 1},
      {.name = "p", .in = {2, 8, 9, 8}, .kernel = 3, .stride = 2, .pad = 1, .ceil_mode = false},
      {.name = "p", .in = {1, 16, 5, 6}, .kernel = 3, .stride = 1, .pad = 1, .ceil_mode = false}};
  for (const AvgPoolDesc& d : cases) {
    SCOPED_TRACE(str_cat(d.in.str(), " k", d.kernel, " s", d.stride, " p", d.pad, d.ceil_mode ? " ceil" : ""));
    const Shape out = d.out();
    auto fast = fast_->make_avgpool(d);
    auto ref = ref_->make_avgpool(d);
    Vec x = rand(size_t(d.in.numel())), dy = rand(size_t(out.numel()));
    Vec y_ref(dy.size()), dx_ref(x.size());
    ref->forward(x.data(), y_ref.data());
    ref->backward(dy.data(), dx_ref.data());
    Vec xf = to_fast(x, d.in), yf = fast_buf(out), dyf = to_fast(dy, out), dxf = fast_buf(d.in);
    fast->forward(xf.data(), yf.data());
    fast->backward(dyf.data(), dxf.data());
    expect_close(from_fast(yf, out), y_ref, "y");
    expect_close(from_fast(dxf, d.in), dx_ref, "dx");
  }
}

TEST_F(OnednnVsRef, GlobalAvgPool) {
  for (Shape s : {Shape{2, 16, 7, 7}, Shape{3, 5, 3, 4}, Shape{2, 8, 1, 1}, Shape{1, 64, 2, 2}}) {
    SCOPED_TRACE(s.str());
    GlobalAvgPoolDesc d{.name = "gap", .in = s};
    const Shape out = d.out();
    auto fast = fast_->make_global_avgpool(d);
    auto ref = ref_->make_global_avgpool(d);
    Vec x = rand(size_t(s.numel())), dy = rand(size_t(out.numel()));
    Vec y_ref(dy.size()), dx_ref(x.size());
    ref->forward(x.data(), y_ref.data());
    ref->backward(dy.data(), dx_ref.data());
    Vec xf = to_fast(x, s), yf = fast_buf(out), dyf = to_fast(dy, out), dxf = fast_buf(s);
    fast->forward(xf.data(), yf.data());
    fast->backward(dyf.data(), dxf.data());
    expect_close(from_fast(yf, out), y_ref, "y");
    expect_close(from_fast(dxf, s), dx_ref, "dx");
  }
}

// Blocked inputs at 8 and 16 channels a block, plain ones (odd channel counts, no spatial
// extent), and gates large enough to saturate the sigmoid.
TEST_F(OnednnVsRef, ChannelGate) {
  for (Shape s : {Shape{2, 16, 5, 5}, Shape{2, 8, 3, 3}, Shape{1, 48, 7, 3}, Shape{3, 5, 4, 4}, Shape{2, 32, 1, 1}}) {
    SCOPED_TRACE(s.str());
    ChannelGateDesc d{.name = "gate", .in = s};
    const Shape gs = d.gate();
    auto fast = fast_->make_channel_gate(d);
    auto ref = ref_->make_channel_gate(d);
    Vec x = rand(size_t(s.numel())), g = rand(size_t(gs.numel()), -20.f, 20.f), dy = rand(x.size());
    Vec y_ref(x.size()), dx_ref(x.size()), dg_ref(g.size());
    ref->forward(x.data(), g.data(), y_ref.data());
    ref->backward(x.data(), g.data(), dy.data(), dx_ref.data(), dg_ref.data());
    Vec xf = to_fast(x, s), gf = to_fast(g, gs), dyf = to_fast(dy, s);
    Vec yf = fast_buf(s), dxf = fast_buf(s), dgf = fast_buf(gs);
    fast->forward(xf.data(), gf.data(), yf.data());
    fast->backward(xf.data(), gf.data(), dyf.data(), dxf.data(), dgf.data());
    expect_close(from_fast(yf, s), y_ref, "y");
    expect_close(from_fast(dxf, s), dx_ref, "dx");
    expect_close(from_fast(dgf, gs), dg_ref, "dg");
  }
}

// ---------------------------------------------------------------- linear

TEST_F(OnednnVsRef, Linear) {
  struct Case {
    Shape in;
    int64_t out;
    bool bias;
  };
  for (const Case& p : {Case{{4, 32, 1, 1}, 10, true}, Case{{2, 16, 3, 3}, 7, true},
                        Case{{3, 5, 2, 2}, 4, false}, Case{{1, 64, 1, 1}, 1000, true}}) {
    SCOPED_TRACE(p.in.str());
    LinearDesc d{.name = "fc", .in = p.in, .out_features = p.out, .bias = p.bias};
    const Shape out = d.out();
    auto fast = fast_->make_linear(d);
    auto ref = ref_->make_linear(d);
    const float ws = 1.f / std::sqrt(float(p.in.chw()));
    Vec x = rand(size_t(p.in.numel())), w = rand(size_t(p.out * p.in.chw()), -ws, ws);
    Vec b = rand(size_t(p.out)), dy = rand(size_t(out.numel()));
    const float* bp = p.bias ? b.data() : nullptr;
    Vec y_ref(dy.size()), dx_ref(x.size()), dw_ref(w.size()), db_ref(b.size());
    ref->forward(x.data(), w.data(), bp, y_ref.data());
    ref->backward(x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(),
                  p.bias ? db_ref.data() : nullptr);
    Vec xf = to_fast(x, p.in), yf = fast_buf(out), dyf = to_fast(dy, out), dxf = fast_buf(p.in);
    Vec dw(w.size(), kNaN), db(b.size(), kNaN);
    fast->forward(xf.data(), w.data(), bp, yf.data());
    fast->backward(xf.data(), w.data(), dyf.data(), dxf.data(), dw.data(), p.bias ? db.data() : nullptr);
    expect_close(from_fast(yf, out), y_ref, "y");
    expect_close(from_fast(dxf, p.in), dx_ref, "dx");
    expect_close(dw, dw_ref, "dw");
    if (p.bias) expect_close(db, db_ref, "db");
  }
}

// ---------------------------------------------------------------- element-wise and shortcut

TEST_F(OnednnVsRef, ReluAndAdd) {
  for (Shape s : {Shape{2, 16, 5, 5}, Shape{2, 3, 5, 5}, Shape{4, 8, 1, 1}}) {
    SCOPED_TRACE(s.str());
    const size_t n = size_t(s.numel());
    Vec a = rand(n), b = rand(n), dy = rand(n);
    Vec af = to_fast(a, s), bf = to_fast(b, s), dyf = to_fast(dy, s);
    {
      auto fast = fast_->make_relu({.name = "relu", .in = s});
      auto ref = ref_->make_relu({.name = "relu", .in = s});
      Vec y_ref(n), dx_ref(n), yf = fast_buf(s), dxf = fast_buf(s);
      ref->forward(a.data(), y_ref.data());
      ref->backward(y_ref.data(), dy.data(), dx_ref.data());
      fast->forward(af.data(), yf.data());
      fast->backward(yf.data(), dyf.data(), dxf.data());
      expect_close(from_fast(yf, s), y_ref, "relu y", 0, 0);
      expect_close(from_fast(dxf, s), dx_ref, "relu dx", 0, 0);
    }
    for (bool relu : {false, true}) {
      SCOPED_TRACE(relu ? "add relu" : "add");
      auto fast = fast_->make_add({.name = "add", .in = s, .relu = relu});
      auto ref = ref_->make_add({.name = "add", .in = s, .relu = relu});
      Vec y_ref(n), dx_ref(n), yf = fast_buf(s), dxf = fast_buf(s);
      ref->forward(a.data(), b.data(), y_ref.data());
      ref->backward(y_ref.data(), dy.data(), dx_ref.data());
      fast->forward(af.data(), bf.data(), yf.data());
      fast->backward(yf.data(), dyf.data(), dxf.data());
      expect_close(from_fast(yf, s), y_ref, "y", 0, 0);
      expect_close(from_fast(dxf, s), dx_ref, "dx", 0, 0);
      Vec inplace = dyf;  // dx may alias dy
      fast->backward(yf.data(), inplace.data(), inplace.data());
      expect_close(from_fast(inplace, s), dx_ref, "dx in place", 0, 0);
    }
  }
}

// NaN (a diverging run) passes through ReLU, fused or not, as in the reference (and on the GPU,
// and in PyTorch): x86's max and a plain `v > 0 ? v : 0` would turn it into 0.
TEST_F(OnednnVsRef, NanPassesThroughRelu) {
  const Shape s{2, 16, 3, 3};
  const size_t n = size_t(s.numel());
  Vec a = rand(n), b = rand(n, -1.f, 1.f);
  for (size_t i : {size_t(0), size_t(37), n - 1}) a[i] = kNaN;
  a[5] = -std::numeric_limits<float>::infinity();
  // NaN where the reference has NaN, the same values elsewhere (within `rtol`).
  auto expect_nan_alike = [&](const Vec& got, const Vec& want, const std::string& what, double rtol) {
    Vec g = got, w = want;
    int nans = 0;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(std::isnan(g[i]), std::isnan(w[i])) << what << " at " << i << ": " << g[i] << " vs " << w[i];
      nans += std::isnan(w[i]);
      if (std::isnan(g[i]) || std::isnan(w[i])) g[i] = w[i] = 0;
    }
    EXPECT_GT(nans, 0) << what;
    expect_close(g, w, what, rtol, rtol);
  };
  Vec af = to_fast(a, s), bf = to_fast(b, s);
  {
    Vec y_ref(n), yf = fast_buf(s);
    ref_->make_relu({.name = "relu", .in = s})->forward(a.data(), y_ref.data());
    fast_->make_relu({.name = "relu", .in = s})->forward(af.data(), yf.data());
    expect_nan_alike(from_fast(yf, s), y_ref, "relu", 0);
  }
  {
    Vec y_ref(n), yf = fast_buf(s);
    ref_->make_add({.name = "add", .in = s, .relu = true})->forward(a.data(), b.data(), y_ref.data());
    fast_->make_add({.name = "add", .in = s, .relu = true})->forward(af.data(), bf.data(), yf.data());
    expect_nan_alike(from_fast(yf, s), y_ref, "add relu", 0);
  }
  const BatchNormDesc d{.name = "bn", .in = s, .relu = true};
  Vec gamma = rand(16, 0.5f, 1.5f), beta = rand(16, -0.5f, 0.5f), rm = rand(16), rv = rand(16, 0.5f, 2.f);
  Vec y_ref(n), yf = fast_buf(s);
  ref_->make_batchnorm(d)->forward_eval(a.data(), gamma.data(), beta.data(), rm.data(), rv.data(), y_ref.data());
  fast_->make_batchnorm(d)->forward_eval(af.data(), gamma.data(), beta.data(), rm.data(), rv.data(), yf.data());
  expect_nan_alike(from_fast(yf, s), y_ref, "batch norm + relu, eval", 1e-5);
  Vec rm2 = rm, rv2 = rv;  // training: a NaN makes its channel's statistics NaN
  ref_->make_batchnorm(d)->forward_train(a.data(), gamma.data(), beta.data(), y_ref.data(), rm.data(), rv.data());
  fast_->make_batchnorm(d)->forward_train(af.data(), gamma.data(), beta.data(), yf.data(), rm2.data(), rv2.data());
  expect_nan_alike(from_fast(yf, s), y_ref, "batch norm + relu, training", 1e-3);
}

TEST_F(OnednnVsRef, PadShortcut) {
  struct Case {
    Shape in;
    int64_t out_c, stride;
  };
  for (const Case& p : {Case{{2, 16, 8, 8}, 32, 2}, Case{{2, 16, 7, 7}, 32, 2}, Case{{2, 5, 6, 6}, 8, 2},
                        Case{{2, 8, 5, 5}, 16, 1}, Case{{2, 16, 4, 4}, 24, 1}, Case{{1, 16, 3, 2}, 48, 2},
                        Case{{2, 16, 2, 2}, 32, 2},
                        // 16-channel blocks: padding of whole blocks, of half blocks
                        Case{{2, 32, 8, 8}, 64, 2}, Case{{2, 32, 6, 6}, 48, 1}, Case{{1, 48, 4, 4}, 64, 2}}) {
    SCOPED_TRACE(p.in.str() + " -> " + std::to_string(p.out_c));
    PadShortcutDesc d{.name = "short", .in = p.in, .out_c = p.out_c, .stride = p.stride};
    const Shape out = d.out();
    auto fast = fast_->make_pad_shortcut(d);
    auto ref = ref_->make_pad_shortcut(d);
    Vec x = rand(size_t(p.in.numel())), dy = rand(size_t(out.numel()));
    Vec y_ref(dy.size()), dx_ref(x.size());
    ref->forward(x.data(), y_ref.data());
    ref->backward(dy.data(), dx_ref.data());
    Vec xf = to_fast(x, p.in), yf = fast_buf(out), dyf = to_fast(dy, out), dxf = fast_buf(p.in);
    fast->forward(xf.data(), yf.data());
    fast->backward(dyf.data(), dxf.data());
    expect_close(from_fast(yf, out), y_ref, "y", 0, 0);
    expect_close(from_fast(dxf, p.in), dx_ref, "dx", 0, 0);
  }
}

// ---------------------------------------------------------------- loss

TEST_F(OnednnVsRef, SoftmaxXent) {
  struct Case {
    Shape in;
    double eps;
    double mix = -1;  // >= 0: mixup targets of this weight
    LossKind kind = LossKind::softmax;
    double threshold = -1;
  };
  const LossKind bce = LossKind::bce;
  for (const Case& p : {Case{{8, 10, 1, 1}, 0.0}, Case{{8, 10, 1, 1}, 0.1}, Case{{3, 1000, 1, 1}, 0.1},
                        Case{{1, 1, 1, 1}, 0.0}, Case{{8, 10, 1, 1}, 0.1, 0.3}, Case{{7, 5, 1, 1}, 0.0, 0.9},
                        Case{{8, 10, 1, 1}, 0.0, -1, bce}, Case{{3, 1000, 1, 1}, 0.1, -1, bce},
                        Case{{8, 10, 1, 1}, 0.1, 0.3, bce}, Case{{8, 10, 1, 1}, 0.1, 0.3, bce, 0.2},
                        Case{{7, 5, 1, 1}, 0.0, 0.9, bce, 0.05}, Case{{1, 1, 1, 1}, 0.0, -1, bce}}) {
    SCOPED_TRACE(p.in.str() + " eps " + std::to_string(p.eps) + " mix " + std::to_string(p.mix) + " " +
                 loss_kind_name(p.kind) + " threshold " + std::to_string(p.threshold));
    SoftmaxXentDesc d{.name = "xent", .in = p.in, .loss = {p.kind, p.eps, p.threshold}};
    auto fast = fast_->make_softmax_xent(d);
    auto ref = ref_->make_softmax_xent(d);
    Vec z = rand(size_t(p.in.numel()), -4.f, 4.f);
    std::vector<int32_t> labels(size_t(p.in.n));
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t((i * 7 + 3) % size_t(p.in.c));
    const std::vector<int32_t> mixed(labels.rbegin(), labels.rend());  // as data::mixup pairs them
    const Targets t = p.mix >= 0 ? Targets(labels.data(), mixed.data(), p.mix) : Targets(labels.data());
    const double loss_ref = forward_loss(*ref, z.data(), t);
    Vec zf = to_fast(z, p.in);
    const double loss = forward_loss(*fast, zf.data(), t);
    EXPECT_NEAR(loss, loss_ref, 1e-5 * std::max(1.0, std::fabs(loss_ref)));
    Vec g_ref(z.size()), gf = fast_buf(p.in);
    ref->backward(t, g_ref.data(), 2.0);
    fast->backward(t, gf.data(), 2.0);
    expect_close(from_fast(gf, p.in), g_ref, "dlogits", 1e-4, 1e-5);
  }
  auto fast = fast_->make_softmax_xent({.name = "xent", .in = {2, 3, 1, 1}});
  Vec z(6, 0.f);
  std::vector<int32_t> bad = {1, 3};
  EXPECT_THROW(fast->forward(z.data(), bad.data()), Error);
}

// ---------------------------------------------------------------- whole networks

// Normalised squared error sum (a-b)^2 / sum b^2 (ggml's test-backend-ops metric).
double nmse(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? num / den : num;
}

// Narrow ResNets (every stage and layer kind: stem, max pool, basic and bottleneck blocks,
// zero-padded shortcuts, projections, average pool, classifier) built on both backends with the
// same initialisation, for two training steps and an evaluation. Every op agrees elementwise
// above; across a whole network float rounding differences can flip a ReLU whose input is within
// rounding of zero, which changes single gradient elements by O(1) and everything below them a
// little, so gradients are compared per parameter tensor by normalised squared error instead.
TEST_F(OnednnVsRef, WholeResNets) {
  struct Case {
    std::string name;
    double width;
    int64_t size;
    double median_nmse, max_nmse;
    std::string backend = "onednn";
    double drop_path = 0;  // stochastic depth (the same masks on both: the same key)
  };
  // The bottleneck net has enough ReLUs that a flip somewhere near the top is likely, and it
  // disturbs everything below it, so it only gets a coarse bound (layout or plumbing errors give
  // O(1)).
  // The basic-block nets also run with Winograd in every 3x3 stride-1 layer.
  for (const Case& c : {Case{"resnet20", 0.5, 12, 1e-6, 1e-3}, Case{"resnet18", 0.125, 32, 1e-6, 1e-3},
                        Case{"resnet50", 0.125, 64, 5e-2, 5e-2},
                        Case{"resnet20", 0.5, 12, 1e-6, 1e-3, "onednn-winograd"},
                        Case{"resnet18", 0.125, 32, 1e-6, 1e-3, "onednn-winograd"},
                        Case{"resnet20", 0.5, 12, 1e-6, 1e-3, "onednn", 0.5},  // blocked layouts
                        Case{"resnext50_32x4d", 0.125, 64, 5e-2, 5e-2},
                        Case{"wide_resnet50_2", 0.0625, 64, 5e-2, 5e-2},
                        Case{"seresnet18", 0.125, 32, 1e-6, 1e-3},  // squeeze-and-excitation
                        Case{"seresnext50_32x4d", 0.125, 64, 5e-2, 5e-2},
                        // ResNet-D: deep stem, pooled shortcuts on odd sides (40: 5 and 3)
                        Case{"resnet18d", 0.125, 40, 1e-6, 1e-3},
                        Case{"resnet26d", 0.125, 72, 5e-2, 5e-2},
                        // ECA (tiered stem, pooled shortcuts, the channel convolution's gate)
                        Case{"ecaresnet26t", 0.125, 72, 5e-2, 5e-2}}) {
    SCOPED_TRACE(c.name + " on " + c.backend + " drop path " + std::to_string(c.drop_path));
    ResNetConfig cfg{.name = c.name, .num_classes = 10, .image_size = c.size, .batch = 3, .width = c.width,
                     .loss = {.label_smoothing = 0.1}, .drop_path = c.drop_path, .seed = 5};
    // Winograd reads 8-channel blocks: that backend keeps them whatever the test forces.
    auto fast = build_resnet<float>(
        cfg, make_backend<float>(c.backend, c.backend == "onednn-winograd" ? BackendOptions{} : onednn_options()));
    auto ref = build_resnet<float>(cfg, make_backend<float>("reference"));
    ASSERT_EQ(fast->arena().params().size(), ref->arena().params().size());
    Vec x = rand(size_t(fast->shape(0).numel()));
    std::vector<int32_t> labels = {1, 7, 3};
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      fast->set_noise_key(uint64_t(step));
      ref->set_noise_key(uint64_t(step));
      const double lf = fast->forward(x.data(), labels.data(), true);
      const double lr = ref->forward(x.data(), labels.data(), true);
      EXPECT_NEAR(lf, lr, 1e-4 * std::max(1.0, std::fabs(lr)));
      auto sf = fast->arena().state(), sr = ref->arena().state();
      expect_close(Vec(sf.begin(), sf.end()), Vec(sr.begin(), sr.end()), "running statistics");
      fast->backward();
      ref->backward();
      auto gf = fast->arena().grads(), gr = ref->arena().grads();
      std::vector<std::pair<double, std::string>> err;
      for (size_t id = 0; id < fast->arena().layout().size(); ++id) {
        const ParamInfo& p = fast->arena().info(int(id));
        err.emplace_back(nmse(gf.data() + p.offset, gr.data() + p.offset, p.count), p.name);
      }
      std::sort(err.begin(), err.end());
      EXPECT_LT(err[err.size() / 2].first, c.median_nmse) << "median gradient, " << err[err.size() / 2].second;
      EXPECT_LT(err.back().first, c.max_nmse) << "gradient of " << err.back().second;
      // The same small update on both, so the second step runs on changed weights.
      auto pf = fast->arena().params(), pr = ref->arena().params();
      for (size_t i = 0; i < pf.size(); ++i) pf[i] = pr[i] = pr[i] - 0.05f * gr[i];
    }
    const double ef = fast->forward(x.data(), labels.data(), false);
    const double er = ref->forward(x.data(), labels.data(), false);
    EXPECT_NEAR(ef, er, 1e-4 * std::max(1.0, std::fabs(er)));
  }
}

}  // namespace
}  // namespace rt

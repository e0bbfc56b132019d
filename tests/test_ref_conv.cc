// The reference convolution against hand-computed values and against a direct 7-loop convolution
// (independent of its im2col formulation), grouped convolutions as their groups convolved apart.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "nn/ops.h"
#include "ref_layers.h"

namespace rt {
namespace {

using namespace test;

// ---------------------------------------------------------------- convolution

const Vec kOneToNine = {1, 2, 3, 4, 5, 6, 7, 8, 9};

TEST_F(RefLayers, ConvTwoByTwoByHand) {
  // y[i][j] = x[i][j] - x[i+1][j+1] = -4 everywhere on the 1..9 grid.
  auto op = be_->make_conv({.name = "c", .in = {1, 1, 3, 3}, .out_c = 1, .kernel_h = 2, .kernel_w = 2});
  Vec w = {1, 0, 0, -1}, y(4);
  op->forward(kOneToNine.data(), w.data(), nullptr, y.data());
  expect_near_all(y, {-4, -4, -4, -4});
}

TEST_F(RefLayers, ConvPaddedBoxFilterWithBiasByHand) {
  // 3x3 box sums of the 1..9 grid with zero padding, plus a bias of 0.5.
  Vec w(9, 1.0), b = {0.5}, y(9);
  ConvDesc d{.name = "box", .in = {1, 1, 3, 3}, .out_c = 1, .kernel_h = 3, .kernel_w = 3,
             .pad_h = 1, .pad_w = 1, .bias = true};
  be_->make_conv(d)->forward(kOneToNine.data(), w.data(), b.data(), y.data());
  expect_near_all(y, {12.5, 21.5, 16.5, 27.5, 45.5, 33.5, 24.5, 39.5, 28.5});

  // Stride 2 keeps the corners.
  d.stride_h = d.stride_w = 2;
  ASSERT_EQ(d.out(), (Shape{1, 1, 2, 2}));
  Vec y2(4);
  be_->make_conv(d)->forward(kOneToNine.data(), w.data(), b.data(), y2.data());
  expect_near_all(y2, {12.5, 16.5, 24.5, 28.5});
}

TEST_F(RefLayers, ConvMixesChannelsByHand) {
  // 1x1 kernel, weights OIHW: out0 = 2 x0 - x1 + 1, out1 = 3 x1 - 1 (bias [1, -1]).
  Vec x = {1, 2, 3, 4, /*c1*/ 10, 20, 30, 40}, w = {2, -1, 0, 3}, b = {1, -1}, y(8);
  auto op = be_->make_conv({.name = "mix", .in = {1, 2, 2, 2}, .out_c = 2, .bias = true});
  op->forward(x.data(), w.data(), b.data(), y.data());
  expect_near_all(y, {-7, -15, -23, -31, 29, 59, 89, 119});

  // dy = 1: dx0 = 2, dx1 = -1 + 3 = 2; dw[o][i] = sum x_i; db = pixel count.
  Vec dy(8, 1.0), dx(8), dw(4), db(2);
  op->backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
  expect_near_all(dx, Vec(8, 2.0));
  expect_near_all(dw, {10, 100, 10, 100});
  expect_near_all(db, {4, 4});
}

// Direct 7-loop convolution, independent of the im2col formulation.
Vec direct_conv(const ConvDesc& d, const Vec& x, const Vec& w, const Vec& b) {
  const Shape o = d.out();
  Vec y(size_t(o.numel()));
  for (int64_t n = 0; n < o.n; ++n)
    for (int64_t oc = 0; oc < o.c; ++oc)
      for (int64_t oh = 0; oh < o.h; ++oh)
        for (int64_t ow = 0; ow < o.w; ++ow) {
          double s = d.bias ? b[size_t(oc)] : 0.0;
          for (int64_t ic = 0; ic < d.in.c; ++ic)
            for (int64_t i = 0; i < d.kernel_h; ++i)
              for (int64_t j = 0; j < d.kernel_w; ++j) {
                const int64_t ih = oh * d.stride_h - d.pad_h + i, iw = ow * d.stride_w - d.pad_w + j;
                if (ih < 0 || ih >= d.in.h || iw < 0 || iw >= d.in.w) continue;
                s += x[size_t(((n * d.in.c + ic) * d.in.h + ih) * d.in.w + iw)] *
                     w[size_t(((oc * d.in.c + ic) * d.kernel_h + i) * d.kernel_w + j)];
              }
          y[size_t(((n * o.c + oc) * o.h + oh) * o.w + ow)] = s;
        }
  return y;
}

TEST_F(RefLayers, ConvMatchesDirectConvolution) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  const ConvDesc cases[] = {
      {.name = "a", .in = {2, 3, 9, 8}, .out_c = 4, .kernel_h = 3, .kernel_w = 3, .stride_h = 2,
       .stride_w = 2, .pad_h = 1, .pad_w = 1, .bias = true},
      {.name = "b", .in = {1, 2, 11, 10}, .out_c = 3, .kernel_h = 7, .kernel_w = 7, .stride_h = 2,
       .stride_w = 2, .pad_h = 3, .pad_w = 3},
      {.name = "c", .in = {2, 3, 6, 7}, .out_c = 2, .kernel_h = 2, .kernel_w = 3, .stride_h = 1,
       .stride_w = 2, .pad_h = 0, .pad_w = 1, .bias = true},
  };
  for (const ConvDesc& d : cases) {
    Vec x(size_t(d.in.numel())), w(size_t(d.weight_count())), b(size_t(d.out_c));
    for (auto* v : {&x, &w, &b})
      for (auto& e : *v) e = u(rng);
    Vec y(size_t(d.out().numel()));
    be_->make_conv(d)->forward(x.data(), w.data(), b.data(), y.data());
    SCOPED_TRACE(d.name);
    expect_near_all(y, direct_conv(d, x, w, b), 1e-12);
  }
}

// A grouped convolution is its groups convolved apart: group g's outputs are the ungrouped
// convolution of g's input channels with g's filters (the direct oracle per slice).
TEST_F(RefLayers, GroupedConvIsItsGroupsConvolvedApart) {
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> u(-1, 1);
  const ConvDesc cases[] = {
      {.name = "g2", .in = {2, 4, 7, 6}, .out_c = 6, .kernel_h = 3, .kernel_w = 3, .stride_h = 2,
       .stride_w = 2, .pad_h = 1, .pad_w = 1, .bias = true, .groups = 2},
      {.name = "depthwise", .in = {1, 3, 5, 5}, .out_c = 3, .kernel_h = 3, .kernel_w = 3,
       .pad_h = 1, .pad_w = 1, .groups = 3},
      {.name = "g4_1x1", .in = {2, 8, 3, 3}, .out_c = 4, .groups = 4},
  };
  for (const ConvDesc& d : cases) {
    SCOPED_TRACE(d.name);
    Vec x(size_t(d.in.numel())), w(size_t(d.weight_count())), b(size_t(d.out_c));
    for (auto* v : {&x, &w, &b})
      for (auto& e : *v) e = u(rng);
    const Shape o = d.out();
    Vec y(size_t(o.numel()));
    be_->make_conv(d)->forward(x.data(), w.data(), b.data(), y.data());
    const int64_t ci = d.in.c / d.groups, co = d.out_c / d.groups;
    for (int64_t g = 0; g < d.groups; ++g) {
      ConvDesc one = d;
      one.groups = 1;
      one.in.c = ci;
      one.out_c = co;
      Vec xg(size_t(one.in.numel())), bg(b.begin() + g * co, b.begin() + (g + 1) * co);
      for (int64_t n = 0; n < d.in.n; ++n)  // samples' channel slices
        std::copy_n(x.begin() + (n * d.in.c + g * ci) * d.in.h * d.in.w, ci * d.in.h * d.in.w,
                    xg.begin() + n * ci * d.in.h * d.in.w);
      const int64_t per = one.weight_count();  // group g's filters, consecutive in w
      Vec wg(w.begin() + g * per, w.begin() + (g + 1) * per);
      const Vec yg = direct_conv(one, xg, wg, bg);
      for (int64_t n = 0; n < o.n; ++n)
        for (int64_t i = 0; i < co * o.h * o.w; ++i)
          EXPECT_NEAR(y[size_t((n * o.c + g * co) * o.h * o.w + i)], yg[size_t(n * co * o.h * o.w + i)], 1e-12)
              << "group " << g << " sample " << n << " element " << i;
    }
  }
}

}  // namespace
}  // namespace rt

// The 16-bit backends' ops (cuda-bf16, cuda-fp16; one suite for both) forward and backward against
// the reference backend (fp32 NCHW); their batch norm: gpu_lowp_batchnorm.cc.
//
// Inputs are drawn already rounded to the type (Kind::round), so act_import and the weight casts
// are exact and the reference sees exactly the values the device sees: what differs is only the
// device's own arithmetic (fp32 accumulation in another order) and the one rounding of each
// stored 16-bit result. That rounding is at most one unit roundoff u of the value (bf16 keeps 8
// significant bits, u = 2^-8; fp16 11, u = 2^-11), so at most u of the largest reference value.
// Tolerances, as a normalised error max|got - ref| / max|ref|, in units of u (tol() scales the
// figures below, written for bf16, by u / 2^-8):
// - ops that only move or select values (ReLU, padded shortcut, max pool forward) and sums of
//   two values or sums in the reference's order and precision (residual add, max pool backward,
//   windowed average pooling, ECA's channel convolution) must equal the reference rounded to the
//   type, bit for bit;
// - single reductions rounded once (convolution, linear, global pooling, batch norm outputs): 1e-2,
//   2.5 u, leaving room for cuDNN/cuBLAS summation orders;
// - batch norm's dx, a difference of three reductions (cancellation): 2e-2, 5 u, of the size of
//   the terms rather than of dx (bn_dx_scale).
// fp32 results (db, dgamma, dbeta, running statistics, the linear layer's and the channel
// convolution's dw) have no 16-bit rounding and keep fixed bounds; cuDNN's dw leaves it in the
// 16-bit type and scales. The fp16 figures are derived, not yet measured on a GPU.
#include <cmath>
#include <random>
#include <string>

#include "cuda/lowp_layout.h"
#include "lowp_test_util.h"

namespace rt::cuda {
namespace {

using namespace test;

RT_INSTANTIATE_GPU_LOWP_OPS();

TEST_P(GpuLowpOps, ImportExportAndAccumulate) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  EXPECT_EQ(b.gpu->name(), k.backend);
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 3, 5, 7}, Shape{3, 16, 9, 11}}) {
    SCOPED_TRACE(s.str());
    const size_t n = size_t(s.numel());
    EXPECT_EQ(b.gpu->act_size(s), lowp_act_floats(s.numel()));
    std::vector<float> x = lowp_vec(k, n, 1), y = lowp_vec(k, n, 2);
    auto gx = b.import(x, s), gy = b.import(y, s);
    expect_equal(b.export_act(gx, s), x, "round trip");
    // Unrounded input: import rounds to nearest even.
    std::mt19937 g(3);
    std::normal_distribution<float> nd;
    std::vector<float> raw(n);
    for (auto& v : raw) v = nd(g);
    expect_equal(b.export_act(b.import(raw, s), s), rounded(k, raw), "import rounds");
    b.gpu->accumulate(gy.as<float>(), gx.as<float>(), b.gpu->act_size(s));
    std::vector<float> sum(n);
    for (size_t i = 0; i < n; ++i) sum[i] = k.round(x[i] + y[i]);
    expect_equal(b.export_act(gy, s), sum, "accumulate");
  }
  // Past the type's range, import gives inf as the host rounding does (fp16: from 65520 up; no
  // saturation, so loss scaling sees the overflow), and sums that overflow become inf too.
  const Shape s{1, 8, 1, 1};
  const std::vector<float> big = {65504, 65519, 65520, -7e4f, 1e6f, 3e38f, -1e-9f, 6e-8f};
  expect_equal(b.export_act(b.import(big, s), s), rounded(k, big), "import range");
  const float top = std::ldexp(1.0f, k.dtype == DType::f16 ? 15 : 127);  // 2 * top overflows
  const std::vector<float> tops(8, top);
  auto ga = b.import(tops, s), gb = b.import(tops, s);
  b.gpu->accumulate(gb.as<float>(), ga.as<float>(), b.gpu->act_size(s));
  for (float v : b.export_act(gb, s)) EXPECT_TRUE(std::isinf(v)) << v;
}

TEST_P(GpuLowpOps, ConvForwardBackward) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  struct Case { Shape in; int64_t out_c, k, s, p; bool bias; int64_t groups = 1; bool dx = true; };
  // resnet's first layer: 3 channels and, as the network builds it, no input gradient (cuDNN has
  // no 16-bit NHWC backward-data kernel for 3 channels; LowpConv pads such a layer instead)
  for (Case c : {Case{{2, 3, 8, 8}, 4, 3, 1, 1, false, 1, false},
                 Case{{2, 16, 8, 8}, 32, 3, 2, 1, false},
                 Case{{1, 8, 7, 9}, 8, 1, 1, 0, false},
                 Case{{2, 8, 6, 6}, 16, 1, 2, 0, false},   // 1x1 projection shortcut
                 Case{{2, 4, 5, 5}, 6, 3, 1, 1, true},
                 Case{{2, 64, 6, 6}, 64, 3, 2, 1, false, 16},  // ResNeXt's: 16 groups of 4
                 Case{{2, 32, 5, 5}, 64, 3, 1, 1, true, 4},
                 Case{{2, 16, 6, 6}, 16, 3, 1, 1, false, 16}}) {  // depthwise
    ConvDesc d{"conv", c.in, c.out_c, c.k, c.k, c.s, c.s, c.p, c.p, c.bias, c.groups};
    d.input_grad = c.dx;
    const Shape o = d.out();
    SCOPED_TRACE(c.in.str() + " -> " + o.str() + " groups " + std::to_string(c.groups));
    const size_t nx = size_t(c.in.numel()), ny = size_t(o.numel()), nw = size_t(d.weight_count()),
                 nb = size_t(c.out_c);
    std::vector<float> x = lowp_vec(k, nx, 4), w = lowp_vec(k, nw, 5, -0.5, 0.5),
                       bias = lowp_vec(k, nb, 6), dy = lowp_vec(k, ny, 7);
    std::vector<float> y(ny), dx(nx), dw(nw), db(nb);
    auto ref = b.ref->make_conv(d);
    ref->forward(x.data(), w.data(), bias.data(), y.data());
    ref->backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());

    auto gx = b.import(x, c.in), gdy = b.import(dy, o);
    auto gw = to_device(w), gb = to_device(bias);
    DeviceBuffer gy = b.act(o), gdx = b.act(c.in), gdw(nw * 4), gdb(nb * 4);
    auto op = b.gpu->make_conv(d);
    op->forward(gx.as<float>(), gw.as<float>(), gb.as<float>(), gy.as<float>());
    op->backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), c.dx ? gdx.as<float>() : nullptr,
                 gdw.as<float>(), gdb.as<float>());
    expect_normalised(b.export_act(gy, o), y, tol(k, 1e-2), "y");
    if (c.dx) expect_normalised(b.export_act(gdx, c.in), dx, tol(k, 1e-2), "dx");
    // dw leaves cuDNN in the 16-bit type (one rounding of an fp32 accumulation), then widens:
    // same bound.
    expect_normalised(b.fp32(gdw, nw), dw, tol(k, 1e-2), "dw");
    if (c.bias) expect_normalised(b.fp32(gdb, nb), db, 1e-4, "db (fp32 sums)");
    // A first-layer conv is called without dx.
    op->backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), nullptr, gdw.as<float>(),
                 gdb.as<float>());
    expect_normalised(b.fp32(gdw, nw), dw, tol(k, 1e-2), "dw without dx");
  }
}

TEST_P(GpuLowpOps, ReluAndAdd) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 3, 5, 7}, Shape{3, 16, 9, 11}}) {
    SCOPED_TRACE(s.str());
    const size_t n = size_t(s.numel());
    std::vector<float> x = tie_vec(n, 7), x2 = lowp_vec(k, n, 8), dy = lowp_vec(k, n, 9);
    std::vector<float> y(n), dx(n);
    auto gx = b.import(x, s), gx2 = b.import(x2, s), gdy = b.import(dy, s);
    DeviceBuffer gy = b.act(s), gdx = b.act(s);

    auto rr = b.ref->make_relu({"relu", s});
    auto gr = b.gpu->make_relu({"relu", s});
    rr->forward(x.data(), y.data());
    rr->backward(y.data(), dy.data(), dx.data());
    gr->forward(gx.as<float>(), gy.as<float>());
    gr->backward(gy.as<float>(), gdy.as<float>(), gdx.as<float>());
    expect_equal(b.export_act(gy, s), y, "relu y");
    expect_equal(b.export_act(gdx, s), dx, "relu dx");

    for (bool relu : {false, true}) {
      auto ra = b.ref->make_add({"add", s, relu});
      auto ga = b.gpu->make_add({"add", s, relu});
      ra->forward(x.data(), x2.data(), y.data());
      std::vector<float> g = dy;
      ra->backward(y.data(), g.data(), g.data());
      ga->forward(gx.as<float>(), gx2.as<float>(), gy.as<float>());
      auto gg = b.import(dy, s);
      ga->backward(gy.as<float>(), gg.as<float>(), gg.as<float>());  // in place, as the Net does
      ga->backward(gy.as<float>(), gdy.as<float>(), gdx.as<float>());
      // One fp32 sum of two 16-bit values, rounded once, is the reference's sum rounded.
      expect_equal(b.export_act(gy, s), rounded(k, y), "add y");
      expect_equal(b.export_act(gg, s), g, "add dx in place");
      expect_equal(b.export_act(gdx, s), g, "add dx");
    }
  }
}

TEST_P(GpuLowpOps, MaxPoolTiesAndGeometries) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  struct Case { Shape in; int64_t k, s, p; };
  for (Case c : {Case{{1, 3, 7, 9}, 3, 2, 1}, Case{{2, 4, 8, 8}, 2, 2, 0},
                 Case{{1, 1, 5, 5}, 3, 1, 1}, Case{{2, 2, 16, 16}, 3, 2, 1},
                 Case{{1, 1, 1, 1}, 1, 1, 0},
                 // Channels in multiples of 8: the vector kernels (the stem's pool is 3x3/2 pad 1).
                 Case{{2, 8, 9, 9}, 3, 2, 1}, Case{{1, 16, 16, 16}, 3, 2, 1},
                 Case{{2, 24, 6, 7}, 2, 2, 0}, Case{{1, 8, 5, 5}, 3, 1, 1}})
    for (bool ties : {true, false}) {
      MaxPoolDesc d{"pool", c.in, c.k, c.s, c.p};
      SCOPED_TRACE(c.in.str() + " k" + std::to_string(c.k) + " s" + std::to_string(c.s) +
                   (ties ? " ties" : ""));
      const Shape o = d.out();
      const size_t n = size_t(c.in.numel()), m = size_t(o.numel());
      std::vector<float> x = ties ? tie_vec(n, 10) : lowp_vec(k, n, 10);
      std::vector<float> dy = lowp_vec(k, m, 11);
      std::vector<float> y(m), dx(n);
      auto ro = b.ref->make_maxpool(d);
      ro->forward(x.data(), y.data(), true);
      ro->backward(x.data(), y.data(), dy.data(), dx.data());
      auto gx = b.import(x, c.in), gdy = b.import(dy, o);
      DeviceBuffer gy = b.act(o), gdx = b.act(c.in);
      auto go = b.gpu->make_maxpool(d);
      go->forward(gx.as<float>(), gy.as<float>(), true);
      go->backward(gx.as<float>(), gy.as<float>(), gdy.as<float>(), gdx.as<float>());
      expect_equal(b.export_act(gy, o), y, "y");
      // The same first-maximum rule and the same fp32 sums in output order, rounded once.
      expect_equal(b.export_act(gdx, c.in), rounded(k, dx), "dx");
    }
}

// Windowed average pooling: the geometries of GpuBackendOps.AvgPool (ceil_mode's clipped and
// dropped windows, padding not counted, overlapping 3x3/1 windows), then channels in multiples of
// 8 (the vector kernels). The same double sums and fp32 terms in the same order as the reference,
// each rounded once to T: the reference's outputs rounded, bit for bit.
TEST_P(GpuLowpOps, AvgPool) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  struct Case { Shape in; int64_t k, s, p; bool ceil; };
  for (Case c : {Case{{2, 3, 8, 8}, 2, 2, 0, true}, Case{{2, 5, 7, 9}, 2, 2, 0, true},
                 Case{{1, 4, 7, 7}, 2, 2, 0, false}, Case{{2, 3, 8, 10}, 3, 2, 1, true},
                 Case{{2, 3, 8, 10}, 3, 2, 1, false}, Case{{2, 6, 5, 7}, 3, 1, 1, true},
                 Case{{3, 2, 1, 1}, 2, 2, 1, true}, Case{{1, 2, 5, 8}, 3, 3, 1, true},
                 Case{{2, 16, 8, 8}, 2, 2, 0, true}, Case{{2, 8, 7, 9}, 2, 2, 0, true},
                 Case{{2, 24, 8, 10}, 3, 2, 1, true}, Case{{1, 8, 7, 9}, 3, 2, 1, false},
                 Case{{2, 8, 5, 7}, 3, 1, 1, true}}) {
    AvgPoolDesc d{"pool", c.in, c.k, c.s, c.p, c.ceil};
    const Shape o = d.out();
    SCOPED_TRACE(c.in.str() + " k" + std::to_string(c.k) + " s" + std::to_string(c.s) + " p" +
                 std::to_string(c.p) + (c.ceil ? " ceil" : "") + " -> " + o.str());
    const size_t n = size_t(c.in.numel()), m = size_t(o.numel());
    std::vector<float> x = lowp_vec(k, n, 20), dy = lowp_vec(k, m, 21);
    std::vector<float> y(m), dx(n);
    auto ro = b.ref->make_avgpool(d);
    ro->forward(x.data(), y.data());
    ro->backward(dy.data(), dx.data());
    auto gx = b.import(x, c.in), gdy = b.import(dy, o);
    DeviceBuffer gy = b.act(o), gdx = b.act(c.in);
    auto go = b.gpu->make_avgpool(d);
    go->forward(gx.as<float>(), gy.as<float>());
    go->backward(gdy.as<float>(), gdx.as<float>());
    expect_equal(b.export_act(gy, o), rounded(k, y), "y");
    expect_equal(b.export_act(gdx, c.in), rounded(k, dx), "dx");
  }
}

TEST_P(GpuLowpOps, GlobalAvgPoolAndPadShortcut) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 3, 5, 7}, Shape{2, 16, 8, 8}}) {
    SCOPED_TRACE(s.str());
    const Shape o{s.n, s.c, 1, 1};
    const size_t n = size_t(s.numel()), m = size_t(s.n * s.c);
    std::vector<float> x = lowp_vec(k, n, 12), dy = lowp_vec(k, m, 13);
    std::vector<float> y(m), dx(n);
    auto ro = b.ref->make_global_avgpool({"gap", s});
    ro->forward(x.data(), y.data());
    ro->backward(dy.data(), dx.data());
    auto gx = b.import(x, s), gdy = b.import(dy, o);
    DeviceBuffer gy = b.act(o), gdx = b.act(s);
    auto go = b.gpu->make_global_avgpool({"gap", s});
    go->forward(gx.as<float>(), gy.as<float>());
    go->backward(gdy.as<float>(), gdx.as<float>());
    expect_normalised(b.export_act(gy, o), y, tol(k, 1e-2), "gap y");
    expect_normalised(b.export_act(gdx, s), dx, tol(k, 1e-2), "gap dx");
  }
  struct Case { Shape in; int64_t out_c, stride; };
  for (Case c : {Case{{2, 3, 5, 7}, 8, 2}, Case{{1, 4, 4, 4}, 8, 1}, Case{{1, 16, 8, 8}, 32, 2},
                 Case{{2, 5, 3, 3}, 5, 1}}) {
    PadShortcutDesc d{"sc", c.in, c.out_c, c.stride};
    const Shape o = d.out();
    SCOPED_TRACE(c.in.str() + " -> " + o.str());
    const size_t n = size_t(c.in.numel()), m = size_t(o.numel());
    std::vector<float> x = lowp_vec(k, n, 14), dy = lowp_vec(k, m, 15);
    std::vector<float> y(m), dx(n);
    auto ro = b.ref->make_pad_shortcut(d);
    ro->forward(x.data(), y.data());
    ro->backward(dy.data(), dx.data());
    auto gx = b.import(x, c.in), gdy = b.import(dy, o);
    DeviceBuffer gy = b.act(o), gdx = b.act(c.in);
    auto go = b.gpu->make_pad_shortcut(d);
    go->forward(gx.as<float>(), gy.as<float>());
    go->backward(gdy.as<float>(), gdx.as<float>());
    expect_equal(b.export_act(gy, o), y, "shortcut y");
    expect_equal(b.export_act(gdx, c.in), dx, "shortcut dx");
  }
}

// y and dx are products rounded once; dg a single reduction rounded once (1e-2 as pooling's).
TEST_P(GpuLowpOps, ChannelGate) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 3, 5, 7}, Shape{2, 16, 8, 8}, Shape{3, 64, 1, 1}}) {
    SCOPED_TRACE(s.str());
    const Shape o{s.n, s.c, 1, 1};
    const size_t n = size_t(s.numel()), m = size_t(s.n * s.c);
    std::vector<float> x = lowp_vec(k, n, 16), dy = lowp_vec(k, n, 17), g = lowp_vec(k, m, 18);
    for (auto& v : g) v = k.round(4.0f * v);  // gates over the sigmoid's curve
    ChannelGateDesc d{"gate", s};
    std::vector<float> y(n), dx(n), dg(m);
    auto ro = b.ref->make_channel_gate(d);
    ro->forward(x.data(), g.data(), y.data());
    ro->backward(x.data(), g.data(), dy.data(), dx.data(), dg.data());
    auto gx = b.import(x, s), gg = b.import(g, o), gdy = b.import(dy, s);
    DeviceBuffer gy = b.act(s), gdx = b.act(s), gdg = b.act(o);
    auto go = b.gpu->make_channel_gate(d);
    go->forward(gx.as<float>(), gg.as<float>(), gy.as<float>());
    go->backward(gx.as<float>(), gg.as<float>(), gdy.as<float>(), gdx.as<float>(), gdg.as<float>());
    expect_normalised(b.export_act(gy, s), y, tol(k, 1e-2), "y");
    expect_normalised(b.export_act(gdx, s), dx, tol(k, 1e-2), "dx");
    expect_normalised(b.export_act(gdg, o), dg, tol(k, 1e-2), "dg");
  }
}

// ECA's channel convolution on 16-bit (n, c, 1, 1) tensors with fp32 weights, the cases of
// GpuBackendOps.ChannelConv. y and dx are the reference's double sums (each product of a 16-bit
// value and a float exact in double) in its order, each fp32 result rounded once to T: the
// reference's outputs rounded, bit for bit. dw stays fp32: a float rounding of the reference's
// (its sum in another order), the same bits when backward runs again without dx (overwritten).
TEST_P(GpuLowpOps, ChannelConv) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  for (int64_t taps : {3, 5, 7})
    for (int64_t c : {2, 5, 64, 300})
      for (int64_t n : {1, 3}) {
        const Shape s{n, c, 1, 1};
        SCOPED_TRACE(s.str() + " kernel " + std::to_string(taps));
        ChannelConvDesc d{"eca", s, taps};
        const size_t m = size_t(s.numel()), nw = size_t(taps);
        std::vector<float> x = lowp_vec(k, m, 30), dy = lowp_vec(k, m, 31), w = random_vec(nw, 32, -1, 1);
        std::vector<float> y(m), dx(m), dw(nw);
        auto ro = b.ref->make_channel_conv(d);
        ro->forward(x.data(), w.data(), nullptr, y.data());
        ro->backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr);
        auto gx = b.import(x, s), gdy = b.import(dy, s), gw = to_device(w);
        auto gdw = to_device(std::vector<float>(nw, 1e3f));
        DeviceBuffer gy = b.act(s), gdx = b.act(s);
        auto go = b.gpu->make_channel_conv(d);
        go->forward(gx.as<float>(), gw.as<float>(), nullptr, gy.as<float>());
        go->backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), gdx.as<float>(), gdw.as<float>(), nullptr);
        expect_equal(b.export_act(gy, s), rounded(k, y), "y");
        expect_equal(b.export_act(gdx, s), rounded(k, dx), "dx");
        const std::vector<float> dw1 = b.fp32(gdw, nw);
        expect_normalised(dw1, dw, 2.5e-7, "dw");
        go->backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), nullptr, gdw.as<float>(), nullptr);
        expect_equal(b.fp32(gdw, nw), dw1, "dw without dx");
      }
}

TEST_P(GpuLowpOps, LinearForwardBackward) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  struct Case { Shape in; int64_t out; bool bias; };
  for (Case c : {Case{{4, 16, 1, 1}, 10, true}, Case{{2, 3, 2, 2}, 5, true},  // h, w > 1: reorder
                 Case{{3, 7, 3, 1}, 4, false}, Case{{1, 64, 1, 1}, 1000, true}}) {
    LinearDesc d{"fc", c.in, c.out, c.bias};
    const Shape o = d.out();
    SCOPED_TRACE(c.in.str() + " -> " + o.str());
    const size_t nx = size_t(c.in.numel()), ny = size_t(o.numel()),
                 nw = size_t(c.out * c.in.chw()), nb = size_t(c.out);
    std::vector<float> x = lowp_vec(k, nx, 16), w = lowp_vec(k, nw, 17, -0.5, 0.5),
                       bias = lowp_vec(k, nb, 18), dy = lowp_vec(k, ny, 19);
    std::vector<float> y(ny), dx(nx), dw(nw), db(nb);
    auto ref = b.ref->make_linear(d);
    ref->forward(x.data(), w.data(), bias.data(), y.data());
    ref->backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
    auto gx = b.import(x, c.in), gdy = b.import(dy, o);
    auto gw = to_device(w), gb = to_device(bias);
    DeviceBuffer gy = b.act(o), gdx = b.act(c.in), gdw(nw * 4), gdb(nb * 4);
    auto op = b.gpu->make_linear(d);
    op->forward(gx.as<float>(), gw.as<float>(), gb.as<float>(), gy.as<float>());
    op->backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), gdx.as<float>(),
                 gdw.as<float>(), gdb.as<float>());
    expect_normalised(b.export_act(gy, o), y, tol(k, 1e-2), "y");
    expect_normalised(b.export_act(gdx, c.in), dx, tol(k, 1e-2), "dx");
    // dw is an fp32 GEMM result of exact 16-bit operands: fp32 summation order only.
    expect_normalised(b.fp32(gdw, nw), dw, 1e-4, "dw");
    if (c.bias) expect_normalised(b.fp32(gdb, nb), db, 1e-4, "db");
  }
}

// Stochastic depth on 16-bit NHWC activations: a sample's values stay together in NHWC too, and
// a product rounded once is the reference's rounded product (factors 0, 2 and 1 / 0.7).
TEST_P(GpuLowpOps, DropPath) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  for (Shape s : {Shape{3, 5, 7, 9}, Shape{4, 16, 9, 11}}) {
    SCOPED_TRACE(s.str());
    const size_t n = size_t(s.numel());
    std::vector<float> x = lowp_vec(k, n, 21), dy = lowp_vec(k, n, 22), y(n), dx(n);
    std::vector<float> scales(size_t(s.n));
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = i % 3 == 0 ? 0.0f : i % 3 == 1 ? 2.0f : 1.0f / 0.7f;
    auto ref = b.ref->make_drop_path({"drop", s});
    ref->forward(x.data(), scales.data(), y.data());
    ref->backward(dy.data(), dx.data());
    auto gx = b.import(x, s), gdy = b.import(dy, s);
    DeviceBuffer gy = b.act(s), gdx = b.act(s);
    auto op = b.gpu->make_drop_path({"drop", s});
    op->forward(gx.as<float>(), scales.data(), gy.as<float>());
    op->backward(gdy.as<float>(), gdx.as<float>());
    expect_equal(b.export_act(gy, s), rounded(k, y), "y");
    expect_equal(b.export_act(gdx, s), rounded(k, dx), "dx");
  }
}

TEST_P(GpuLowpOps, SoftmaxXent) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  for (double eps : {0.0, 0.1})
    for (Shape s : {Shape{4, 10, 1, 1}, Shape{3, 1000, 1, 1}}) {
      SCOPED_TRACE(s.str() + " eps " + std::to_string(eps));
      SoftmaxXentDesc d{"loss", s, {.label_smoothing = eps}};
      const size_t n = size_t(s.numel());
      std::vector<float> z = lowp_vec(k, n, 20, -4, 4);
      std::vector<int32_t> labels(size_t(s.n));
      for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t((7 * i + 3) % size_t(s.c));
      std::vector<float> dz(n);
      auto ref = b.ref->make_softmax_xent(d);
      const double lr = forward_loss(*ref, z.data(), labels.data());
      ref->backward(labels.data(), dz.data(), 128.0);
      auto gz = b.import(z, s);
      DeviceBuffer gdz = b.act(s);
      auto op = b.gpu->make_softmax_xent(d);
      const double lg = forward_loss(*op, gz.as<float>(), labels.data());
      op->backward(labels.data(), gdz.as<float>(), 128.0);
      // The logits are exact: the loss is fp32 arithmetic only.
      EXPECT_NEAR(lg, lr, 1e-5 * std::max(1.0, std::abs(lr)));
      expect_normalised(b.export_act(gdz, s), dz, tol(k, 1e-2), "dlogits");
    }
}

}  // namespace
}  // namespace rt::cuda

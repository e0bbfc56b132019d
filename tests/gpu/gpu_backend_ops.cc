// The CUDA backend's layers (batch norm, ReLU, residual add, pooling, padded shortcut, SE's
// channel gate, ECA's channel convolution) forward and backward against the reference backend.
#include <random>
#include <string>

#include "cuda/backend.h"
#include "gpu_test_util.h"
#include "nn/ops.h"

namespace rt::cuda {
namespace {

using test::random_vec;
using test::tie_vec;
using test::to_device;
using test::to_host;

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double atol,
                  double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_LE(std::abs(double(got[i]) - ref[i]), atol + rtol * std::abs(double(ref[i])))
        << what << " at " << i << ": " << got[i] << " vs " << ref[i];
}

void expect_equal(const std::vector<float>& got, const std::vector<float>& ref,
                  const std::string& what) {
  expect_close(got, ref, 0, 0, what);
}

struct Backends {
  std::unique_ptr<Backend<float>> gpu = make_cuda_backend();
  std::unique_ptr<Backend<float>> ref = make_backend<float>("reference");
};

// An op with forward(x, y) and backward(dy, dx) (average pooling, padded shortcut): the GPU's
// outputs must equal the reference's bit for bit; y has dy's size, dx has x's. The GPU's ops run
// on `backend`'s stream, which the reads wait for.
template <class Op>
void expect_same_fwd_bwd(Backend<float>& backend, Op& ref, Op& gpu, const std::vector<float>& x,
                         const std::vector<float>& dy, const std::string& tag) {
  std::vector<float> y(dy.size()), dx(x.size());
  ref.forward(x.data(), y.data());
  ref.backward(dy.data(), dx.data());
  auto gx = to_device(x), gdy = to_device(dy);
  DeviceBuffer gy(dy.size() * 4), gdx(x.size() * 4);
  gpu.forward(gx.as<float>(), gy.as<float>());
  gpu.backward(gdy.as<float>(), gdx.as<float>());
  backend.sync();
  expect_equal(to_host<float>(gy, dy.size()), y, tag + " y");
  expect_equal(to_host<float>(gdx, x.size()), dx, tag + " dx");
}

// One batch norm of shape s against the reference's: training (y, running mean, unbiased running
// var), backward (dx, dgamma, dbeta) and evaluation. With `group`, both synchronise over a fake
// group (test::TripledSync: three ranks holding this batch), each through its own, and must ask
// for the same sums, the reference's C + 1, C and 2C.
void expect_bn_matches_ref(Backends& b, const Shape& s, bool relu, bool group) {
  SCOPED_TRACE(s.str() + (relu ? " relu" : "") + (group ? " group" : ""));
  test::TripledSync ref_sync, gpu_sync;
  BatchNormDesc d{"bn", s, 1e-5, 0.1, relu};
  const size_t n = size_t(s.numel()), c = size_t(s.c);
  auto x = random_vec(n, 1, -3, 5), gamma = random_vec(c, 2, 0.5, 1.5), beta = random_vec(c, 3),
       dy = random_vec(n, 4), rm = random_vec(c, 5), rv = random_vec(c, 6, 0.5, 2);
  if (group) d.sync = &ref_sync;
  const auto [y, dx, dg, db, rm_ref, rv_ref, ye] = test::ref_batchnorm(*b.ref, d, x, gamma, beta, dy, rm, rv);

  if (group) d.sync = &gpu_sync;
  auto gx = to_device(x), gg = to_device(gamma), gb = to_device(beta), gdy = to_device(dy), grm = to_device(rm),
       grv = to_device(rv), erm = to_device(rm), erv = to_device(rv);
  DeviceBuffer gy(n * 4), gdx(n * 4), gdg(c * 4), gdb(c * 4), gye(n * 4);
  auto op = b.gpu->make_batchnorm(d);
  op->forward_train(gx.as<float>(), gg.as<float>(), gb.as<float>(), gy.as<float>(), grm.as<float>(),
                    grv.as<float>());
  op->backward(gx.as<float>(), gg.as<float>(), gy.as<float>(), gdy.as<float>(), gdx.as<float>(),
               gdg.as<float>(), gdb.as<float>());
  op->forward_eval(gx.as<float>(), gg.as<float>(), gb.as<float>(), erm.as<float>(), erv.as<float>(),
                   gye.as<float>());
  b.gpu->sync();
  EXPECT_EQ(gpu_sync.sizes, ref_sync.sizes);
  if (group) {
    EXPECT_EQ(ref_sync.sizes, (std::vector<size_t>{c + 1, c, 2 * c}));
  }
  expect_close(to_host<float>(gy, n), y, 1e-4, 1e-4, "y");
  expect_close(to_host<float>(grm, c), rm_ref, 1e-5, 1e-5, "running mean");
  expect_close(to_host<float>(grv, c), rv_ref, 1e-5, 1e-4, "running var (unbiased)");
  expect_close(to_host<float>(gdx, n), dx, 2e-4, 1e-3, "dx");
  expect_close(to_host<float>(gdg, c), dg, 2e-4, 1e-4, "dgamma (the rank's)");
  expect_close(to_host<float>(gdb, c), db, 2e-4, 1e-4, "dbeta (the rank's)");
  expect_close(to_host<float>(gye, n), ye, 1e-4, 1e-4, "eval y");
}

TEST(GpuBackendOps, BatchNormTrainEvalBackward) {
  RT_REQUIRE_GPU();
  Backends b;
  for (Shape s : {Shape{2, 3, 5, 7}, Shape{1, 4, 3, 3}, Shape{4, 8, 8, 8}, Shape{2, 5, 1, 1}})
    for (bool relu : {false, true}) expect_bn_matches_ref(b, s, relu, false);
}

// model.bn_group on the fp32 backends: our batch norm (cuDNN's has no place for the group's sums)
// against the reference's with the same group: running statistics over the group's count, dx
// over its sums and count, the rank's own dgamma and dbeta, one value per channel and rank allowed.
TEST(GpuBackendOps, BatchNormSynchronisedOverAGroup) {
  RT_REQUIRE_GPU();
  Backends b;
  for (Shape s : {Shape{2, 3, 5, 7}, Shape{1, 4, 1, 1}, Shape{4, 8, 8, 8}})
    for (bool relu : {false, true}) expect_bn_matches_ref(b, s, relu, true);
}

TEST(GpuBackendOps, BatchNormRefusesOneValuePerChannel) {
  RT_REQUIRE_GPU();
  Backends b;
  auto op = b.gpu->make_batchnorm({"bn1", {1, 3, 1, 1}});
  DeviceBuffer x(12), y(12), p(12), q(12), rm(12), rv(12);
  EXPECT_THROW(op->forward_train(x.as<float>(), p.as<float>(), q.as<float>(), y.as<float>(),
                                 rm.as<float>(), rv.as<float>()),
               ShapeError);
}

// cuDNN's legacy descriptors hold at most 2^31 - 1 elements: a larger batch is refused when the
// layer is made, naming it, before anything is allocated for it.
TEST(GpuBackendOps, TensorsOverCudnnsElementLimitAreRefusedByName) {
  RT_REQUIRE_GPU();
  Backends b;
  const Shape big{2048, 64, 128, 128};  // 2^31 elements
  try {
    b.gpu->make_batchnorm({"bn_big", big});
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("bn_big"), std::string::npos) << e.what();
  }
  ConvDesc conv{"conv_big", big, 8, 1, 1, 1, 1, 0, 0, false};
  try {
    b.gpu->make_conv(conv);
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("conv_big"), std::string::npos) << e.what();
  }
}

TEST(GpuBackendOps, ReluAndAdd) {
  RT_REQUIRE_GPU();
  Backends b;
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 3, 5, 7}, Shape{3, 16, 9, 11}}) {
    SCOPED_TRACE(s.str());
    const size_t n = size_t(s.numel());
    auto x = tie_vec(n, 7), x2 = random_vec(n, 8), dy = random_vec(n, 9);
    std::vector<float> y(n), dx(n);
    auto gx = to_device(x), gx2 = to_device(x2), gdy = to_device(dy);
    DeviceBuffer gy(n * 4), gdx(n * 4);

    auto rr = b.ref->make_relu({"relu", s});
    auto gr = b.gpu->make_relu({"relu", s});
    rr->forward(x.data(), y.data());
    rr->backward(y.data(), dy.data(), dx.data());
    gr->forward(gx.as<float>(), gy.as<float>());
    gr->backward(gy.as<float>(), gdy.as<float>(), gdx.as<float>());
    b.gpu->sync();
    expect_equal(to_host<float>(gy, n), y, "relu y");
    expect_equal(to_host<float>(gdx, n), dx, "relu dx");

    for (bool relu : {false, true}) {
      auto ra = b.ref->make_add({"add", s, relu});
      auto ga = b.gpu->make_add({"add", s, relu});
      ra->forward(x.data(), x2.data(), y.data());
      std::vector<float> g = dy;
      ra->backward(y.data(), g.data(), g.data());
      ga->forward(gx.as<float>(), gx2.as<float>(), gy.as<float>());
      auto gg = to_device(dy);
      ga->backward(gy.as<float>(), gg.as<float>(), gg.as<float>());  // in place, as the Net does
      ga->backward(gy.as<float>(), gdy.as<float>(), gdx.as<float>());
      b.gpu->sync();
      expect_equal(to_host<float>(gy, n), y, "add y");
      expect_equal(to_host<float>(gg, n), g, "add dx in place");
      expect_equal(to_host<float>(gdx, n), g, "add dx");
    }
  }
}

TEST(GpuBackendOps, MaxPoolTiesAndGeometries) {
  RT_REQUIRE_GPU();
  Backends b;
  struct Case { Shape in; int64_t k, s, p; };
  for (Case c : {Case{{1, 3, 7, 9}, 3, 2, 1}, Case{{2, 4, 8, 8}, 2, 2, 0},
                 Case{{1, 1, 5, 5}, 3, 1, 1}, Case{{2, 2, 16, 16}, 3, 2, 1},
                 Case{{1, 1, 1, 1}, 1, 1, 0}})
    for (bool ties : {true, false}) {
      MaxPoolDesc d{"pool", c.in, c.k, c.s, c.p};
      SCOPED_TRACE(c.in.str() + " k" + std::to_string(c.k) + " s" + std::to_string(c.s) +
                   (ties ? " ties" : ""));
      const size_t n = size_t(c.in.numel()), m = size_t(d.out().numel());
      auto x = ties ? tie_vec(n, 10) : random_vec(n, 10);
      auto dy = random_vec(m, 11);
      std::vector<float> y(m), dx(n);
      auto ro = b.ref->make_maxpool(d);
      ro->forward(x.data(), y.data(), true);
      ro->backward(x.data(), y.data(), dy.data(), dx.data());
      auto gx = to_device(x), gdy = to_device(dy);
      DeviceBuffer gy(m * 4), gdx(n * 4);
      auto go = b.gpu->make_maxpool(d);
      go->forward(gx.as<float>(), gy.as<float>(), true);
      go->backward(gx.as<float>(), gy.as<float>(), gdy.as<float>(), gdx.as<float>());
      b.gpu->sync();
      expect_equal(to_host<float>(gy, m), y, "y");
      // Gathered in output order, as the reference scatters: the same sums in the same order.
      expect_equal(to_host<float>(gdx, n), dx, "dx");
    }
}

// Stochastic depth: each sample scaled by its factor (0, 1 / keep, or 1 without factors), forward
// and backward, bit for bit the host's product; the device keeps the factors for backward, so the
// host's array may change after forward. Eval (no factors) after training ones restores 1.
TEST(GpuBackendOps, DropPath) {
  RT_REQUIRE_GPU();
  Backends b;
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{3, 5, 7, 9}, Shape{4, 16, 9, 11}}) {
    SCOPED_TRACE(s.str());
    const size_t n = size_t(s.numel());
    auto x = random_vec(n, 10), dy = random_vec(n, 11);
    std::vector<float> scales(size_t(s.n));
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = i % 2 ? 0.0f : 1.0f / 0.7f;
    std::vector<float> y(n), dx(n), y_eval(n);
    auto rd = b.ref->make_drop_path({"drop", s});
    rd->forward(x.data(), scales.data(), y.data());
    rd->backward(dy.data(), dx.data());
    rd->forward(x.data(), nullptr, y_eval.data());
    auto gx = to_device(x), gdy = to_device(dy);
    DeviceBuffer gy(n * 4), gdx(n * 4), gy_eval(n * 4);
    auto gd = b.gpu->make_drop_path({"drop", s});
    gd->forward(gx.as<float>(), scales.data(), gy.as<float>());
    std::fill(scales.begin(), scales.end(), 5.0f);  // forward read them already
    gd->backward(gdy.as<float>(), gdx.as<float>());
    gd->forward(gx.as<float>(), nullptr, gy_eval.as<float>());
    b.gpu->sync();
    expect_equal(to_host<float>(gy, n), y, "y");
    expect_equal(to_host<float>(gdx, n), dx, "dx");
    expect_equal(to_host<float>(gy_eval, n), x, "evaluation's y");
    EXPECT_EQ(y_eval, x);
  }
}

// Windowed average pooling, padding and the part past the input not counted. ResNet-D's 2x2/2
// ceil_mode on even and odd sizes (odd: the last window clipped to one row or column); 3x3/2 pad 1
// with ceil_mode (even sizes: an extra window of one row) and without; 3x3/1 pad 1, whose windows
// overlap (backward sums up to nine); 2x2/2 pad 1 of a 1x1 plane; 3x3/3 pad 1, where ceil_mode's
// last window would start in the padding and is dropped. The same double sums and fp32 terms in
// the same order as the reference: bit for bit.
TEST(GpuBackendOps, AvgPool) {
  RT_REQUIRE_GPU();
  Backends b;
  struct Case { Shape in; int64_t k, s, p; bool ceil; };
  for (Case c : {Case{{2, 3, 8, 8}, 2, 2, 0, true}, Case{{2, 5, 7, 9}, 2, 2, 0, true},
                 Case{{1, 4, 7, 7}, 2, 2, 0, false}, Case{{2, 3, 8, 10}, 3, 2, 1, true},
                 Case{{2, 3, 8, 10}, 3, 2, 1, false}, Case{{1, 2, 7, 9}, 3, 2, 1, true},
                 Case{{2, 6, 5, 7}, 3, 1, 1, true}, Case{{3, 2, 1, 1}, 2, 2, 1, true},
                 Case{{1, 2, 5, 8}, 3, 3, 1, true}, Case{{4, 16, 14, 14}, 2, 2, 0, true}}) {
    AvgPoolDesc d{"pool", c.in, c.k, c.s, c.p, c.ceil};
    SCOPED_TRACE(c.in.str() + " k" + std::to_string(c.k) + " s" + std::to_string(c.s) + " p" +
                 std::to_string(c.p) + (c.ceil ? " ceil" : "") + " -> " + d.out().str());
    auto x = random_vec(size_t(c.in.numel()), 20), dy = random_vec(size_t(d.out().numel()), 21);
    expect_same_fwd_bwd(*b.gpu, *b.ref->make_avgpool(d), *b.gpu->make_avgpool(d), x, dy, "avgpool");
  }
}

TEST(GpuBackendOps, GlobalAvgPoolAndPadShortcut) {
  RT_REQUIRE_GPU();
  Backends b;
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 3, 5, 7}, Shape{2, 16, 8, 8}}) {
    SCOPED_TRACE(s.str());
    const size_t n = size_t(s.numel()), m = size_t(s.n * s.c);
    auto x = random_vec(n, 12), dy = random_vec(m, 13);
    expect_same_fwd_bwd(*b.gpu, *b.ref->make_global_avgpool({"gap", s}),
                        *b.gpu->make_global_avgpool({"gap", s}), x, dy, "gap");
  }
  struct Case { Shape in; int64_t out_c, stride; };
  for (Case c : {Case{{2, 3, 5, 7}, 8, 2}, Case{{1, 4, 4, 4}, 8, 1}, Case{{1, 16, 8, 8}, 32, 2},
                 Case{{2, 5, 3, 3}, 5, 1}}) {
    PadShortcutDesc d{"sc", c.in, c.out_c, c.stride};
    SCOPED_TRACE(c.in.str() + " -> " + d.out().str());
    const size_t n = size_t(c.in.numel()), m = size_t(d.out().numel());
    auto x = random_vec(n, 14), dy = random_vec(m, 15);
    expect_same_fwd_bwd(*b.gpu, *b.ref->make_pad_shortcut(d), *b.gpu->make_pad_shortcut(d), x, dy,
                        "shortcut");
  }
}

// The sigmoid rounds once to float on the device (the reference keeps it in double), and the
// per-plane sums go in another order: close, not equal. Gates up to +-20 saturate it.
TEST(GpuBackendOps, ChannelGate) {
  RT_REQUIRE_GPU();
  Backends b;
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 3, 5, 7}, Shape{2, 16, 8, 8}, Shape{3, 64, 1, 1}}) {
    SCOPED_TRACE(s.str());
    const size_t n = size_t(s.numel()), m = size_t(s.n * s.c);
    auto x = random_vec(n, 16), dy = random_vec(n, 17), g = random_vec(m, 18);
    for (auto& v : g) v *= 20.0f;
    ChannelGateDesc d{"gate", s};
    std::vector<float> y(n), dx(n), dg(m);
    auto ref = b.ref->make_channel_gate(d);
    ref->forward(x.data(), g.data(), y.data());
    ref->backward(x.data(), g.data(), dy.data(), dx.data(), dg.data());
    auto gx = to_device(x), gg = to_device(g), gdy = to_device(dy);
    DeviceBuffer gy(n * 4), gdx(n * 4), gdg(m * 4);
    auto gpu = b.gpu->make_channel_gate(d);
    gpu->forward(gx.as<float>(), gg.as<float>(), gy.as<float>());
    gpu->backward(gx.as<float>(), gg.as<float>(), gdy.as<float>(), gdx.as<float>(), gdg.as<float>());
    b.gpu->sync();
    expect_close(to_host<float>(gy, n), y, 1e-7, 1e-6, "y");
    expect_close(to_host<float>(gdx, n), dx, 1e-7, 1e-6, "dx");
    expect_close(to_host<float>(gdg, m), dg, 1e-6, 1e-5, "dg");
  }
}

// ECA's channel convolution on (n, c, 1, 1) tensors: kernels 3, 5 and 7 on fewer channels than
// taps (every output sees the zero padding on both sides), as many, and more; batch 1 and 3. y and
// dx are double sums over the taps in the reference's order of products exact in double: bit for
// bit. dw sums n c products in another order: within one float rounding of the reference's, and the
// same bits again when backward runs once more without dx (overwritten, not accumulated: the
// buffer starts as garbage).
TEST(GpuBackendOps, ChannelConv) {
  RT_REQUIRE_GPU();
  Backends b;
  for (int64_t k : {3, 5, 7})
    for (int64_t c : {2, 5, 64, 300})
      for (int64_t n : {1, 3}) {
        const Shape s{n, c, 1, 1};
        SCOPED_TRACE(s.str() + " kernel " + std::to_string(k));
        ChannelConvDesc d{"eca", s, k};
        const size_t m = size_t(s.numel()), nw = size_t(k);
        auto x = random_vec(m, 30), dy = random_vec(m, 31), w = random_vec(nw, 32);
        std::vector<float> y(m), dx(m), dw(nw);
        auto ref = b.ref->make_channel_conv(d);
        ref->forward(x.data(), w.data(), nullptr, y.data());
        ref->backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr);
        auto gx = to_device(x), gw = to_device(w), gdy = to_device(dy);
        auto gdw = to_device(std::vector<float>(nw, 1e3f));
        DeviceBuffer gy(m * 4), gdx(m * 4);
        auto gpu = b.gpu->make_channel_conv(d);
        gpu->forward(gx.as<float>(), gw.as<float>(), nullptr, gy.as<float>());
        gpu->backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), gdx.as<float>(), gdw.as<float>(), nullptr);
        b.gpu->sync();
        expect_equal(to_host<float>(gy, m), y, "y");
        expect_equal(to_host<float>(gdx, m), dx, "dx");
        const auto dw1 = to_host<float>(gdw, nw);
        expect_close(dw1, dw, 1e-9, 2.5e-7, "dw");
        gpu->backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), nullptr, gdw.as<float>(), nullptr);
        b.gpu->sync();
        expect_equal(to_host<float>(gdw, nw), dw1, "dw without dx");
      }
}

TEST(GpuBackendOps, AccumulateAndActivationCopies) {
  RT_REQUIRE_GPU();
  Backends b;
  const Shape s{2, 3, 5, 7};
  const size_t n = size_t(s.numel());
  auto x = random_vec(n, 16), y = random_vec(n, 17);
  DeviceBuffer gx(n * 4), gy(n * 4);
  b.gpu->act_import(x.data(), s, gx.as<float>());
  b.gpu->act_import(y.data(), s, gy.as<float>());
  b.gpu->accumulate(gy.as<float>(), gx.as<float>(), n);
  std::vector<float> out(n);
  b.gpu->act_export(gy.as<float>(), s, out.data());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], y[i] + x[i]) << i;
}

}  // namespace
}  // namespace rt::cuda

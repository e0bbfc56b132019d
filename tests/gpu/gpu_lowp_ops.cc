// The 16-bit backends' ops (cuda-bf16, cuda-fp16; one suite for both) forward and backward against
// the reference backend (fp32 NCHW).
//
// Inputs are drawn already rounded to the type (Kind::round), so act_import and the weight casts
// are exact and the reference sees exactly the values the device sees: what differs is only the
// device's own arithmetic (fp32 accumulation in another order) and the one rounding of each
// stored 16-bit result. That rounding is at most one unit roundoff u of the value (bf16 keeps 8
// significant bits, u = 2^-8; fp16 11, u = 2^-11), so at most u of the largest reference value.
// Tolerances, as a normalised error max|got - ref| / max|ref|, in units of u (tol() scales the
// figures below, written for bf16, by u / 2^-8):
// - ops that only move or select values (ReLU, padded shortcut, max pool forward) and sums of
//   two values or a fixed-order fp32 sum (residual add, max pool backward) must equal the
//   reference rounded to the type, bit for bit;
// - single reductions rounded once (convolution, linear, pooling, batch norm outputs): 1e-2,
//   2.5 u, leaving room for cuDNN/cuBLAS summation orders;
// - batch norm's dx, a difference of three reductions (cancellation): 2e-2, 5 u, of the size of
//   the terms rather than of dx (bn_dx_scale).
// fp32 results (db, dgamma, dbeta, running statistics, the linear layer's dw) have no 16-bit
// rounding and keep fixed bounds; cuDNN's dw leaves it in the 16-bit type and scales. The fp16
// figures are derived, not yet measured on a GPU.
#include <cmath>
#include <ostream>
#include <random>
#include <string>

#include "cuda/lowp_backend.h"
#include "cuda/lowp_layout.h"
#include "gpu_test_util.h"
#include "nn/ops.h"

namespace rt::cuda {
namespace {

using test::tie_vec;
using test::to_device;
using test::to_host;

// The two storage types: the backend, the host rounding and the unit roundoff.
struct Kind {
  DType dtype;
  const char* backend;
  float (*round)(float);
  double unit;
};
// gtest names the parameter by its backend.
void PrintTo(const Kind& k, std::ostream* os) { *os << k.backend; }
const Kind kBf16{DType::bf16, "cuda-bf16", bf16_round, 0x1p-8};
const Kind kFp16{DType::f16, "cuda-fp16", f16_round, 0x1p-11};

// A bound written in bf16 units, for the type k.
double tol(const Kind& k, double bf16_bound) { return bf16_bound * (k.unit / 0x1p-8); }

std::vector<float> rounded(const Kind& k, std::vector<float> v) {
  for (auto& x : v) x = k.round(x);
  return v;
}

// Uniform values already representable in the type (so the import rounds nothing).
std::vector<float> lowp_vec(const Kind& k, size_t n, uint32_t seed, float lo = -2, float hi = 2) {
  return rounded(k, test::random_vec(n, seed, lo, hi));
}

double normalised_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::abs(double(got[i]) - double(ref[i])));
    den = std::max(den, std::abs(double(ref[i])));
  }
  return den > 0 ? num / den : num;
}

void expect_normalised(const std::vector<float>& got, const std::vector<float>& ref, double tol,
                       const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (float v : got) ASSERT_TRUE(std::isfinite(v)) << what;
  EXPECT_LE(normalised_error(got, ref), tol) << what;
}

// Batch norm's dx = gamma invstd / m (m g - sum_g - xhat sum_gxhat) is a difference of terms of
// size |gamma| invstd |dy| that cancel almost completely when a channel has few values (with two,
// 1 - xhat^2 = eps / (var + eps)), leaving fp32 rounding noise of the terms as large as dx itself.
// Its error is therefore measured against the terms' size: max over channels of |gamma| invstd
// max|dy| (NCHW host data; biased variance, as training normalises).
double bn_dx_scale(const std::vector<float>& x, const std::vector<float>& dy,
                   const std::vector<float>& gamma, const Shape& s, double eps) {
  const int64_t hw = s.h * s.w, m = s.n * hw;
  double scale = 0;
  for (int64_t c = 0; c < s.c; ++c) {
    double sum = 0, sq = 0, dmax = 0;
    for (int64_t b = 0; b < s.n; ++b)
      for (int64_t i = 0; i < hw; ++i) {
        const size_t at = size_t((b * s.c + c) * hw + i);
        sum += x[at];
        dmax = std::max(dmax, std::abs(double(dy[at])));
      }
    const double mean = sum / double(m);
    for (int64_t b = 0; b < s.n; ++b)
      for (int64_t i = 0; i < hw; ++i) {
        const double d = x[size_t((b * s.c + c) * hw + i)] - mean;
        sq += d * d;
      }
    scale = std::max(scale, std::abs(double(gamma[size_t(c)])) / std::sqrt(sq / double(m) + eps) * dmax);
  }
  return scale;
}

void expect_within(const std::vector<float>& got, const std::vector<float>& ref, double bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
    err = std::max(err, std::abs(double(got[i]) - double(ref[i])));
  }
  EXPECT_LE(err, bound) << what;
}

void expect_equal(const std::vector<float>& got, const std::vector<float>& ref,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_EQ(got[i], ref[i]) << what << " at " << i;
}

// The 16-bit backend and the reference, with activation helpers that go through act_import and
// act_export (NCHW fp32 on the host, 16-bit NHWC on the device).
struct Backends {
  explicit Backends(DType t) : gpu(make_cuda_lowp_backend(t)) {}
  std::unique_ptr<Backend<float>> gpu;
  std::unique_ptr<Backend<float>> ref = make_backend<float>("reference");

  DeviceBuffer act(const Shape& s) const { return DeviceBuffer(gpu->act_size(s) * sizeof(float)); }
  DeviceBuffer import(const std::vector<float>& nchw, const Shape& s) const {
    DeviceBuffer b = act(s);
    gpu->act_import(nchw.data(), s, b.as<float>());
    return b;
  }
  std::vector<float> export_act(const DeviceBuffer& b, const Shape& s) const {
    std::vector<float> v(size_t(s.numel()));
    gpu->act_export(b.as<float>(), s, v.data());
    return v;
  }
  // fp32 device results (weights' gradients, statistics): after the stream is done.
  std::vector<float> fp32(const DeviceBuffer& b, size_t n) const {
    gpu->sync();
    return to_host<float>(b, n);
  }
};

class GpuLowpOps : public ::testing::TestWithParam<Kind> {};
INSTANTIATE_TEST_SUITE_P(Types, GpuLowpOps, ::testing::Values(kBf16, kFp16),
                         [](const ::testing::TestParamInfo<Kind>& i) {
                           return std::string(i.param.dtype == DType::bf16 ? "bf16" : "fp16");
                         });

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
  struct Case { Shape in; int64_t out_c, k, s, p; bool bias; int64_t groups = 1; };
  for (Case c : {Case{{2, 3, 8, 8}, 4, 3, 1, 1, false},    // resnet's first layer: 3 channels
                 Case{{2, 16, 8, 8}, 32, 3, 2, 1, false},
                 Case{{1, 8, 7, 9}, 8, 1, 1, 0, false},
                 Case{{2, 8, 6, 6}, 16, 1, 2, 0, false},   // 1x1 projection shortcut
                 Case{{2, 4, 5, 5}, 6, 3, 1, 1, true},
                 Case{{2, 64, 6, 6}, 64, 3, 2, 1, false, 16},  // ResNeXt's: 16 groups of 4
                 Case{{2, 32, 5, 5}, 64, 3, 1, 1, true, 4},
                 Case{{2, 16, 6, 6}, 16, 3, 1, 1, false, 16}}) {  // depthwise
    ConvDesc d{"conv", c.in, c.out_c, c.k, c.k, c.s, c.s, c.p, c.p, c.bias, c.groups};
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
    op->backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), gdx.as<float>(),
                 gdw.as<float>(), gdb.as<float>());
    expect_normalised(b.export_act(gy, o), y, tol(k, 1e-2), "y");
    expect_normalised(b.export_act(gdx, c.in), dx, tol(k, 1e-2), "dx");
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

// One batch norm of shape s against the reference's: training (y, running mean, unbiased running
// var), backward (dx, dgamma, dbeta) and evaluation. With `group`, both synchronise over a fake
// group (test::TripledSync: three ranks holding this batch), each through its own, and must ask
// for the same sums, the reference's C + 1, C and 2C: the running variance's unbiased factor, the
// count check (one value per channel and rank passes) and dx's 1/m must all take the group's count.
void expect_bn_matches_ref(const Kind& k, Backends& b, const Shape& s, bool relu, bool group) {
  SCOPED_TRACE(s.str() + (relu ? " relu" : "") + (group ? " group" : ""));
  test::TripledSync ref_sync, gpu_sync;
  BatchNormDesc d{"bn", s, 1e-5, 0.1, relu};
  const size_t n = size_t(s.numel()), c = size_t(s.c);
  std::vector<float> x = lowp_vec(k, n, 1, -3, 5), gamma = lowp_vec(k, c, 2, 0.5, 1.5),
                     beta = lowp_vec(k, c, 3), dy = lowp_vec(k, n, 4), rm = lowp_vec(k, c, 5),
                     rv = lowp_vec(k, c, 6, 0.5, 2);
  if (group) d.sync = &ref_sync;
  const auto [y, dx, dg, db, rm_ref, rv_ref, ye] = test::ref_batchnorm(*b.ref, d, x, gamma, beta, dy, rm, rv);

  if (group) d.sync = &gpu_sync;
  auto gx = b.import(x, s), gdy = b.import(dy, s);
  auto gg = to_device(gamma), gb = to_device(beta), grm = to_device(rm), grv = to_device(rv), erm = to_device(rm),
       erv = to_device(rv);
  DeviceBuffer gy = b.act(s), gdx = b.act(s), gye = b.act(s), gdg(c * 4), gdb(c * 4);
  auto op = b.gpu->make_batchnorm(d);
  op->forward_train(gx.as<float>(), gg.as<float>(), gb.as<float>(), gy.as<float>(), grm.as<float>(),
                    grv.as<float>());
  op->backward(gx.as<float>(), gg.as<float>(), gy.as<float>(), gdy.as<float>(), gdx.as<float>(),
               gdg.as<float>(), gdb.as<float>());
  op->forward_eval(gx.as<float>(), gg.as<float>(), gb.as<float>(), erm.as<float>(), erv.as<float>(),
                   gye.as<float>());
  EXPECT_EQ(gpu_sync.sizes, ref_sync.sizes);
  if (group) {
    EXPECT_EQ(ref_sync.sizes, (std::vector<size_t>{c + 1, c, 2 * c}));
  }
  expect_normalised(b.export_act(gy, s), y, tol(k, 1e-2), "y");
  // Statistics of exact inputs in fp32: no 16-bit rounding at all.
  expect_normalised(b.fp32(grm, c), rm_ref, 1e-4, "running mean");
  expect_normalised(b.fp32(grv, c), rv_ref, 1e-4, "running var (unbiased)");
  expect_within(b.export_act(gdx, s), dx, tol(k, 2e-2) * bn_dx_scale(x, dy, gamma, s, d.eps),
                "dx, against the size of its terms");
  expect_normalised(b.fp32(gdg, c), dg, 1e-3, "dgamma (fp32 sums; the rank's)");
  expect_normalised(b.fp32(gdb, c), db, 1e-3, "dbeta (fp32 sums; the rank's)");
  expect_normalised(b.export_act(gye, s), ye, tol(k, 1e-2), "eval y");
}

TEST_P(GpuLowpOps, BatchNormTrainEvalBackward) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  for (Shape s : {Shape{2, 3, 5, 7}, Shape{1, 4, 3, 3}, Shape{4, 8, 8, 8}, Shape{2, 5, 1, 1},
                  Shape{8, 40, 16, 16}})  // 2048 rows: several chunks, two channel tiles
    for (bool relu : {false, true}) expect_bn_matches_ref(k, b, s, relu, false);
}

// model.bn_group: the 16-bit batch norm's group sums through the host, against the reference's
// (element grid, one value per channel and rank, vector grid).
TEST_P(GpuLowpOps, BatchNormSynchronisedOverAGroup) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  for (Shape s : {Shape{2, 3, 5, 7}, Shape{1, 4, 1, 1}, Shape{4, 16, 8, 8}})
    for (bool relu : {false, true}) expect_bn_matches_ref(k, b, s, relu, true);
}

// Channels in multiples of 8 on 16-byte aligned buffers take the vector grid (a thread per 8
// channels, lowp_layout.h); the same data 4 bytes further on takes the element grid. Both must
// give the same batch norm up to the order of their fp32 sums: one rounding step of the stored
// 16-bit values at most, and fp32 sums within 1e-5. Shapes with one and two vector tiles, one
// and several row chunks.
TEST_P(GpuLowpOps, BatchNormVectorGridMatchesElementGrid) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  for (Shape s : {Shape{8, 64, 6, 6}, Shape{4, 512, 3, 3}, Shape{16, 64, 16, 16}, Shape{2, 24, 5, 5}})
    for (bool relu : {false, true}) {
      SCOPED_TRACE(s.str() + (relu ? " relu" : ""));
      const ChannelReduceGeom geom = channel_reduce_geom(s.n * s.h * s.w, s.c);
      ASSERT_GT(geom.vec_tiles, 0);
      BatchNormDesc d{"bn", s, 1e-5, 0.1, relu};
      const size_t n = size_t(s.numel()), c = size_t(s.c);
      const std::vector<float> x = lowp_vec(k, n, 21, -3, 5), gamma = lowp_vec(k, c, 22, 0.5, 1.5),
                               beta = lowp_vec(k, c, 23), dy = lowp_vec(k, n, 24);
      struct Result { std::vector<float> y, dx, dg, db, rm, rv; };
      auto run = [&](size_t offset) {  // offset in floats from a 256-byte aligned allocation
        const size_t floats = b.gpu->act_size(s) + offset;
        DeviceBuffer gx(floats * 4), gy(floats * 4), gdy(floats * 4), gdx(floats * 4);
        float *px = gx.as<float>() + offset, *py = gy.as<float>() + offset,
              *pdy = gdy.as<float>() + offset, *pdx = gdx.as<float>() + offset;
        b.gpu->act_import(x.data(), s, px);
        b.gpu->act_import(dy.data(), s, pdy);
        auto gg = to_device(gamma), gb = to_device(beta), grm = to_device(std::vector<float>(c, 0)),
             grv = to_device(std::vector<float>(c, 1));
        DeviceBuffer gdg(c * 4), gdb(c * 4);
        auto op = b.gpu->make_batchnorm(d);
        op->forward_train(px, gg.as<float>(), gb.as<float>(), py, grm.as<float>(), grv.as<float>());
        op->backward(px, gg.as<float>(), py, pdy, pdx, gdg.as<float>(), gdb.as<float>());
        Result r;
        r.y.resize(n);
        r.dx.resize(n);
        b.gpu->act_export(py, s, r.y.data());
        b.gpu->act_export(pdx, s, r.dx.data());
        r.dg = b.fp32(gdg, c);
        r.db = b.fp32(gdb, c);
        r.rm = b.fp32(grm, c);
        r.rv = b.fp32(grv, c);
        return r;
      };
      const Result v = run(0), e = run(1);
      expect_normalised(v.y, e.y, k.unit, "y");
      expect_within(v.dx, e.dx, 2 * k.unit * bn_dx_scale(x, dy, gamma, s, d.eps), "dx");
      expect_normalised(v.dg, e.dg, 1e-5, "dgamma");
      expect_normalised(v.db, e.db, 1e-5, "dbeta");
      expect_normalised(v.rm, e.rm, 1e-6, "running mean");
      expect_normalised(v.rv, e.rv, 1e-6, "running var");
    }
}

// The batch norm fused with the residual add after it (BatchNormDesc::residual, what a Net makes
// of the two on these backends) equals the batch norm and then the backend's add bit for bit, in
// training and evaluation, with and without the ReLU, on the vector grid and (4 bytes further on)
// the element grid; its backward takes the add's masked gradient and equals the plain batch
// norm's; with the ReLU, backward_add_relu does the add's mask too (in place, for the residual)
// and gives the same gradients and the same masked gradient bit for bit.
TEST_P(GpuLowpOps, BatchNormResidualEqualsBatchNormThenAdd) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  ASSERT_TRUE(b.gpu->fuses_bn_add());
  for (Shape s : {Shape{8, 64, 6, 6}, Shape{2, 3, 5, 7}})
    for (size_t offset : {size_t(0), size_t(1)})
      for (bool relu : {false, true}) {
        SCOPED_TRACE(s.str() + " offset " + std::to_string(offset) + (relu ? " relu" : ""));
        const size_t n = size_t(s.numel()), c = size_t(s.c), floats = b.gpu->act_size(s) + offset;
        const std::vector<float> x = lowp_vec(k, n, 31, -3, 5), r = lowp_vec(k, n, 32, -2, 2),
                                 gamma = lowp_vec(k, c, 33, 0.5, 1.5), beta = lowp_vec(k, c, 34),
                                 dy = lowp_vec(k, n, 35);
        DeviceBuffer bx(floats * 4), br(floats * 4), bz(floats * 4), by(floats * 4), bw(floats * 4),
            bdy(floats * 4), bdy2(floats * 4), bdx1(floats * 4), bdx2(floats * 4);
        float *px = bx.as<float>() + offset, *pr = br.as<float>() + offset, *pz = bz.as<float>() + offset,
              *py = by.as<float>() + offset, *pw = bw.as<float>() + offset,
              *pdy = bdy.as<float>() + offset, *pdy2 = bdy2.as<float>() + offset,
              *pdx1 = bdx1.as<float>() + offset,
              *pdx2 = bdx2.as<float>() + offset;
        b.gpu->act_import(x.data(), s, px);
        b.gpu->act_import(r.data(), s, pr);
        b.gpu->act_import(dy.data(), s, pdy);
        b.gpu->act_import(dy.data(), s, pdy2);
        BatchNormDesc plain{"bn", s, 1e-5, 0.1, false}, fused = plain;
        fused.residual = true;
        fused.relu = relu;
        auto bn = b.gpu->make_batchnorm(plain), bnr = b.gpu->make_batchnorm(fused);
        auto add = b.gpu->make_add({"add", s, relu});
        auto gg = to_device(gamma), gb = to_device(beta);
        auto rm1 = to_device(std::vector<float>(c, 0)), rv1 = to_device(std::vector<float>(c, 1)),
             rm2 = to_device(std::vector<float>(c, 0)), rv2 = to_device(std::vector<float>(c, 1));
        bn->forward_train(px, gg.as<float>(), gb.as<float>(), pz, rm1.as<float>(), rv1.as<float>());
        add->forward(pz, pr, pw);
        bnr->forward_train_add(px, pr, gg.as<float>(), gb.as<float>(), py, rm2.as<float>(), rv2.as<float>());
        std::vector<float> want(n), got(n);
        b.gpu->act_export(pw, s, want.data());
        b.gpu->act_export(py, s, got.data());
        EXPECT_EQ(got, want) << "training";
        EXPECT_EQ(b.fp32(rm2, c), b.fp32(rm1, c));
        EXPECT_EQ(b.fp32(rv2, c), b.fp32(rv1, c));
        // Backward: the add masks (in place), then each batch norm on the masked gradient.
        add->backward(pw, pdy, pdy);
        DeviceBuffer dg1(c * 4), db1(c * 4), dg2(c * 4), db2(c * 4);
        bn->backward(px, gg.as<float>(), pz, pdy, pdx1, dg1.as<float>(), db1.as<float>());
        bnr->backward(px, gg.as<float>(), nullptr, pdy, pdx2, dg2.as<float>(), db2.as<float>());
        std::vector<float> dx1(n), dx2(n);
        b.gpu->act_export(pdx1, s, dx1.data());
        b.gpu->act_export(pdx2, s, dx2.data());
        EXPECT_EQ(dx2, dx1);
        EXPECT_EQ(b.fp32(dg2, c), b.fp32(dg1, c));
        EXPECT_EQ(b.fp32(db2, c), b.fp32(db1, c));
        EXPECT_EQ(bnr->masks_add_relu(), relu);
        if (relu) {
          bnr->backward_add_relu(px, gg.as<float>(), py, pdy2, pdx2, dg2.as<float>(), db2.as<float>());
          std::vector<float> masked(n), masked2(n);
          b.gpu->act_export(pdy, s, masked.data());
          b.gpu->act_export(pdy2, s, masked2.data());
          EXPECT_EQ(masked2, masked) << "the residual's gradient";
          EXPECT_NE(masked2, dy) << "nothing masked";
          b.gpu->act_export(pdx2, s, dx2.data());
          EXPECT_EQ(dx2, dx1) << "backward_add_relu";
          EXPECT_EQ(b.fp32(dg2, c), b.fp32(dg1, c));
          EXPECT_EQ(b.fp32(db2, c), b.fp32(db1, c));
        }
        bn->forward_eval(px, gg.as<float>(), gb.as<float>(), rm1.as<float>(), rv1.as<float>(), pz);
        add->forward(pz, pr, pw);
        bnr->forward_eval_add(px, pr, gg.as<float>(), gb.as<float>(), rm1.as<float>(), rv1.as<float>(), py);
        b.gpu->act_export(pw, s, want.data());
        b.gpu->act_export(py, s, got.data());
        EXPECT_EQ(got, want) << "evaluation";
      }
}

// Statistics of data far from zero relative to its spread: 1024 plus 0 or one spacing of the
// type there, so the variance is 2^-14 of the squared mean for bf16 (2^-20 for fp16). Computing
// it as sum(x^2) - sum(x)^2 / n in fp32 would lose it (relative error about 2^-24 times 2^14 or
// 2^20); the one-pass Welford merge (vector grid, 64 channels) and the two-pass sums (element
// grid, 12 channels) must both give the reference's variance to 1e-5.
TEST_P(GpuLowpOps, BatchNormStatisticsOfOffsetData) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  const float spacing = float(1024 * 2 * k.unit);
  for (Shape s : {Shape{16, 64, 8, 8}, Shape{16, 12, 8, 8}}) {
    SCOPED_TRACE(s.str());
    BatchNormDesc d{"bn", s, 1e-5, 1.0, false};  // momentum 1: the running values are the batch's
    const size_t n = size_t(s.numel()), c = size_t(s.c);
    std::mt19937 g(31);
    std::vector<float> x(n), gamma(c, 1.0f), beta(c, 0.0f), y(n), rm(c, 0.0f), rv(c, 1.0f);
    for (auto& v : x) v = 1024.0f + spacing * float(g() % 2);
    ASSERT_EQ(rounded(k, x), x);
    auto ref = b.ref->make_batchnorm(d);
    ref->forward_train(x.data(), gamma.data(), beta.data(), y.data(), rm.data(), rv.data());
    auto gx = b.import(x, s), gg = to_device(gamma), gb = to_device(beta),
         grm = to_device(std::vector<float>(c, 0.0f)), grv = to_device(std::vector<float>(c, 1.0f));
    DeviceBuffer gy = b.act(s);
    auto op = b.gpu->make_batchnorm(d);
    op->forward_train(gx.as<float>(), gg.as<float>(), gb.as<float>(), gy.as<float>(),
                      grm.as<float>(), grv.as<float>());
    const std::vector<float> gm = b.fp32(grm, c), gv = b.fp32(grv, c);
    for (size_t i = 0; i < c; ++i) {
      EXPECT_NEAR(gm[i], rm[i], 1e-6 * 1024) << "mean of channel " << i;
      EXPECT_NEAR(gv[i], rv[i], 1e-5 * rv[i]) << "variance of channel " << i;
    }
    expect_normalised(b.export_act(gy, s), y, tol(k, 1e-2), "y");
  }
}

TEST_P(GpuLowpOps, BatchNormRefusesOneValuePerChannel) {
  RT_REQUIRE_GPU();
  const Kind& k = GetParam();
  Backends b(k.dtype);
  auto op = b.gpu->make_batchnorm({"bn1", {1, 3, 1, 1}});
  DeviceBuffer x(16), y(16), p(12), q(12), rm(12), rv(12);
  EXPECT_THROW(op->forward_train(x.as<float>(), p.as<float>(), q.as<float>(), y.as<float>(),
                                 rm.as<float>(), rv.as<float>()),
               ShapeError);
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

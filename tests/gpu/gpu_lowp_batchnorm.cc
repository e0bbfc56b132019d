// The 16-bit backends' batch norm (cuda-bf16, cuda-fp16; the GpuLowpOps suite of gpu_lowp_ops.cc,
// whose tolerances, in units of the type's roundoff, it follows) against the reference backend:
// training, evaluation and backward, synchronised over a group, the vector grid against the
// element grid, the fused residual add, statistics of data far from zero.
#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/lowp_layout.h"
#include "lowp_test_util.h"

namespace rt::cuda {
namespace {

using namespace test;

RT_INSTANTIATE_GPU_LOWP_OPS();

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

}  // namespace
}  // namespace rt::cuda

// cuDNN convolution and cuBLAS fully connected layers against the reference backend, forward and
// backward, fp32 without TF32: |gpu - ref| <= atol + rtol |ref|.
#include <cmath>
#include <random>
#include <string>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cublas_linear.h"
#include "cuda/cudnn_conv.h"
#include "cuda/lowp_conv.h"
#include "cuda/lowp_kernels.h"  // bf16
#include "tests/gpu/gpu_test_util.h"

namespace rt::cuda {
namespace {

using test::to_device;
using test::to_host;

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Sums of up to a few thousand products in different orders: fp32 rounding differs by ~1e-6
// relative per term.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what,
                  const std::string& layer) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::abs(got[i] - want[i]), 1e-4 + 1e-4 * std::abs(want[i]))
        << layer << " " << what << " at " << i << ": " << got[i] << " vs " << want[i];
}

// Runs a layer forward and backward on the GPU and through the reference backend on the same
// random data (x, weights, bias, dy sized by the caller) and compares every output.
template <class GpuLayer, class RefLayer>
void compare_with_reference(GpuLayer& gpu, RefLayer& ref, CudaContext& ctx, const std::string& name, bool bias,
                            size_t nx, size_t nw, size_t nb, size_t ny, uint64_t seed) {
  const auto x = randn(nx, seed), w = randn(nw, seed + 1), b = randn(nb, seed + 2), dy = randn(ny, seed + 3);
  std::vector<float> y(ny), dx(nx), dw(nw), db(nb);
  ref.forward(x.data(), w.data(), bias ? b.data() : nullptr, y.data());
  ref.backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), bias ? db.data() : nullptr);
  DeviceBuffer gx = to_device(x), gw = to_device(w), gb = to_device(b), gdy = to_device(dy), gy(ny * 4),
               gdx(nx * 4), gdw(nw * 4), gdb(nb * 4);
  gpu.forward(gx.as<float>(), gw.as<float>(), bias ? gb.as<float>() : nullptr, gy.as<float>());
  gpu.backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), gdx.as<float>(), gdw.as<float>(),
               bias ? gdb.as<float>() : nullptr);
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  expect_close(to_host<float>(gy, ny), y, "y", name);
  expect_close(to_host<float>(gdx, nx), dx, "dx", name);
  expect_close(to_host<float>(gdw, nw), dw, "dw", name);
  if (bias) expect_close(to_host<float>(gdb, nb), db, "db", name);
}

void check_conv(CudaContext& ctx, const ConvDesc& d) {
  auto ref = make_backend<float>("reference")->make_conv(d);
  CudnnConv conv(d, ctx);
  compare_with_reference(conv, *ref, ctx, d.name, d.bias, size_t(d.in.numel()), size_t(d.weight_count()),
                         size_t(d.out_c), size_t(d.out().numel()), 1);
}

TEST(GpuCudnnConv, MatchesReference) {
  RT_REQUIRE_GPU();
  for (bool benchmark : {false, true}) {
    ContextConfig cfg;
    cfg.benchmark_algos = benchmark;
    CudaContext ctx(cfg);
    check_conv(ctx, {"3x3", {4, 16, 12, 12}, 32, 3, 3, 1, 1, 1, 1, false});
    check_conv(ctx, {"1x1s2", {2, 32, 9, 9}, 64, 1, 1, 2, 2, 0, 0, false});
    check_conv(ctx, {"stem", {2, 3, 32, 32}, 8, 7, 7, 2, 2, 3, 3, true});
    check_conv(ctx, {"rect", {3, 5, 7, 11}, 6, 3, 1, 2, 1, 1, 0, true});
  }
}

TEST(GpuCudnnConv, DeterministicAlgorithmsAndSharedWorkspace) {
  RT_REQUIRE_GPU();
  ContextConfig cfg;
  cfg.deterministic = true;
  CudaContext ctx(cfg);
  CudnnConv a({"a", {8, 64, 28, 28}, 64, 3, 3, 1, 1, 1, 1, false}, ctx);
  CudnnConv b({"b", {8, 64, 28, 28}, 128, 1, 1, 2, 2, 0, 0, false}, ctx);
  EXPECT_GE(ctx.workspace_bytes(), std::max(a.workspace_bytes(), b.workspace_bytes()));
  check_conv(ctx, {"det", {4, 16, 12, 12}, 32, 3, 3, 1, 1, 1, 1, false});
}

// A context chooses algorithms once per distinct convolution (kind, math, geometry); a layer of a
// shape seen before takes that choice, math types included, and computes as well.
TEST(GpuCudnnConv, AlgorithmsChosenOncePerShape) {
  RT_REQUIRE_GPU();
  for (bool benchmark : {false, true}) {
    ContextConfig cfg;
    cfg.benchmark_algos = benchmark;
    CudaContext ctx(cfg);
    const ConvDesc d{"a", {4, 16, 12, 12}, 32, 3, 3, 1, 1, 1, 1, false};
    CudnnConv a(d, ctx);
    EXPECT_EQ(ctx.conv_algos().shapes(), 1);
    EXPECT_EQ(ctx.conv_algos().reused(), 0);
    ConvDesc same = d;  // another name and a bias: the same algorithms
    same.name = "same";
    same.bias = true;
    CudnnConv b(same, ctx);
    EXPECT_EQ(ctx.conv_algos().shapes(), 1);
    EXPECT_EQ(ctx.conv_algos().reused(), 1);
    EXPECT_EQ(b.workspace_bytes(), a.workspace_bytes());
    check_conv(ctx, same);  // a third layer of the shape, against the reference
    EXPECT_EQ(ctx.conv_algos().reused(), 2);
    ConvDesc other[4] = {d, d, d, d};  // each differs from d in one respect
    other[0].stride_h = 2;
    other[1].pad_w = 0;
    other[2].out_c = 8;
    other[3].in.n = 5;
    for (const ConvDesc& o : other) {
      CudnnConv c(o, ctx);
    }
    EXPECT_EQ(ctx.conv_algos().shapes(), 5);
    LowpConv<bf16> lowp(d, ctx);  // another data type and layout
    EXPECT_EQ(ctx.conv_algos().shapes(), 6);
    EXPECT_EQ(ctx.conv_algos().reused(), 2);
    CudaContext fresh(cfg);  // choices are per context
    CudnnConv e(d, fresh);
    EXPECT_EQ(fresh.conv_algos().shapes(), 1);
    EXPECT_EQ(fresh.conv_algos().reused(), 0);
  }
}

void check_linear(CudaContext& ctx, const LinearDesc& d) {
  const int64_t in = d.in.chw(), o = d.out_features;
  auto ref = make_backend<float>("reference")->make_linear(d);
  CublasLinear fc(d, ctx);
  compare_with_reference(fc, *ref, ctx, d.name, d.bias, size_t(d.in.numel()), size_t(o * in), size_t(o),
                         size_t(d.in.n * o), 5);
}

TEST(GpuCublasLinear, MatchesReference) {
  RT_REQUIRE_GPU();
  CudaContext ctx;
  check_linear(ctx, {"fc", {32, 512, 1, 1}, 1000, true});
  check_linear(ctx, {"fc_nobias", {5, 64, 1, 1}, 10, false});
  check_linear(ctx, {"fc_spatial", {3, 4, 2, 3}, 7, true});  // input flattened over C, H, W
  check_linear(ctx, {"fc_one", {1, 1, 1, 1}, 1, true});
}

}  // namespace
}  // namespace rt::cuda

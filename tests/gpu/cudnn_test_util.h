// Shared by the cuDNN and cuBLAS layer tests (gpu_cudnn_cublas.cc, gpu_conv_algos.cc): a layer run
// forward and backward on the GPU and through the reference backend on the same data, every output
// compared (fp32 without TF32: |gpu - ref| <= 1e-4 + 1e-4 |ref|).
#pragma once
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cudnn_conv.h"
#include "tests/gpu/gpu_test_util.h"

namespace rt::cuda::test {

inline std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Sums of up to a few thousand products in different orders: fp32 rounding differs by ~1e-6
// relative per term.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what,
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
  // A convolution that adds its input gradient to what dx holds (a residual block's input).
  if constexpr (requires { gpu.adds_dx(); }) {
    ASSERT_TRUE(gpu.adds_dx()) << name;
    const auto prior = randn(nx, seed + 4);
    std::vector<float> sum(nx);
    for (size_t i = 0; i < nx; ++i) sum[i] = prior[i] + dx[i];
    DeviceBuffer gsum = to_device(prior);
    gpu.backward_add_dx(gx.as<float>(), gw.as<float>(), gdy.as<float>(), gsum.as<float>(),
                        gdw.as<float>(), bias ? gdb.as<float>() : nullptr);
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    expect_close(to_host<float>(gsum, nx), sum, "dx added", name);
    expect_close(to_host<float>(gdw, nw), dw, "dw", name);
  }
}

inline void check_conv(CudaContext& ctx, const ConvDesc& d) {
  auto ref = make_backend<float>("reference")->make_conv(d);
  CudnnConv conv(d, ctx);
  compare_with_reference(conv, *ref, ctx, d.name, d.bias, size_t(d.in.numel()), size_t(d.weight_count()),
                         size_t(d.out_c), size_t(d.out().numel()), 1);
}

}  // namespace rt::cuda::test

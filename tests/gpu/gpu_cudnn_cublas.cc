// cuDNN convolution and cuBLAS fully connected layers against the reference backend, forward and
// backward, fp32 without TF32: |gpu - ref| <= atol + rtol |ref|; a 16-bit stem cuDNN refuses, run
// on padded channels; cuDNN's reasons in errors. How the convolutions' algorithms are chosen and
// kept: gpu_conv_algos.cc.
#include <optional>
#include <random>
#include <string>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cublas_linear.h"
#include "cuda/cudnn_conv.h"
#include "cuda/lowp_conv.h"
#include "cuda/lowp_kernels.h"  // bf16
#include "tests/gpu/cudnn_test_util.h"
#ifdef RT_CUDA_EMULATOR
#include "tests/cuda_emu/cudnn_emu.h"  // the emulated cuDNN's test hooks
#endif

namespace rt::cuda {
namespace {

using namespace test;

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
    check_conv(ctx, {"grouped", {2, 32, 9, 9}, 32, 3, 3, 2, 2, 1, 1, false, 8});
    check_conv(ctx, {"depthwise", {2, 16, 7, 7}, 16, 3, 3, 1, 1, 1, 1, true, 16});
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

#ifdef RT_CUDA_EMULATOR  // whose cuDNN can be made to refuse
// A 16-bit stem (3 input channels, no input gradient) that cuDNN offers no algorithm for runs on
// its input and weights zero-padded to 8 channels: the same bits as the unpadded convolution
// (the emulator sums each output's products in double, the zeros adding nothing), one warning.
// The input is padded again in backward, so a forward between (evaluation) changes nothing.
// A layer that needs its input gradient is not padded: its error stands.
template <class T>
void padded_stem_matches_unpadded() {
  ConvDesc d{"stem", {2, 3, 10, 10}, 8, 7, 7, 2, 2, 3, 3, true};
  d.input_grad = false;
  const size_t nx = size_t(d.in.numel()), nw = size_t(d.weight_count()), nb = size_t(d.out_c),
               ny = size_t(d.out().numel());
  // Values exact in either type: multiples of 1/8 below 2 in magnitude.
  auto exact = [](size_t n, uint32_t seed) {
    std::vector<T> v(n);
    std::mt19937 g(seed);
    for (T& e : v) e = T(float(int(g() % 31) - 15) / 8.0f);
    return v;
  };
  const DeviceBuffer gx = to_device(exact(nx, 1)), gx2 = to_device(exact(nx, 2)),
                     gdy = to_device(exact(ny, 3)), gw = to_device(randn(nw, 4)),
                     gb = to_device(randn(nb, 5));
  // y, dw, db of one layer: forward on x, forward on x2, backward for x; `warnings`: what the
  // layer printed then.
  enum Refused { kNever, kAtSetUp, kAtFirstRun };
  auto run = [&](Refused refused, std::string* warnings) {
    std::optional<rt_emu::UnalignedChannelsRefused> refuse;
    if (refused != kNever) refuse.emplace(refused == kAtFirstRun);
    ContextConfig cfg;
    CudaContext ctx(cfg);
    DeviceBuffer gy(ny * sizeof(T)), gy2(ny * sizeof(T)), gdw(nw * 4), gdb(nb * 4);
    testing::internal::CaptureStderr();
    {
      LowpConv<T> conv(d, ctx);
      conv.forward(gx.as<float>(), gw.as<float>(), gb.as<float>(), gy.as<float>());
      conv.forward(gx2.as<float>(), gw.as<float>(), gb.as<float>(), gy2.as<float>());
      conv.backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), nullptr, gdw.as<float>(),
                    gdb.as<float>());
    }
    *warnings = testing::internal::GetCapturedStderr();
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    // y's 16-bit patterns widened, so that the three compare alike.
    const std::vector<uint16_t> y = to_host<uint16_t>(gy, ny);
    return std::vector{std::vector<float>(y.begin(), y.end()), to_host<float>(gdw, nw),
                       to_host<float>(gdb, nb)};
  };
  std::string as_is;
  const auto want = run(kNever, &as_is);
  EXPECT_EQ(as_is, "");
  // Refused by the rankings at set-up, or, as a heuristic choice finds out, only by the calls at
  // the first run: padded either way, once.
  for (Refused when : {kAtSetUp, kAtFirstRun}) {
    std::string padded;
    const auto got = run(when, &padded);
    EXPECT_NE(padded.find("warning: layer stem: cuDNN offers no"), std::string::npos) << padded;
    EXPECT_NE(padded.find("zero-padded to 8 channels"), std::string::npos) << padded;
    EXPECT_EQ(padded.find("zero-padded"), padded.rfind("zero-padded")) << padded;
    const char* what[] = {"y", "dw", "db"};
    for (size_t i = 0; i < 3; ++i)
      for (size_t j = 0; j < want[i].size(); ++j)
        ASSERT_EQ(got[i][j], want[i][j]) << what[i] << " at " << j << ", refused " << int(when);
  }

  rt_emu::UnalignedChannelsRefused refuse;
  ContextConfig cfg;
  CudaContext ctx(cfg);
  d.input_grad = true;
  try {
    LowpConv<T> conv(d, ctx);
    FAIL() << "a layer needing its input gradient was padded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("16-bit NHWC data whose channels are not a multiple of 8"),
              std::string::npos)
        << e.what();
  }
  // Nor when the refusal comes at its first run: the refusal is the error.
  rt_emu::UnalignedChannelsRefused at_run(true);
  LowpConv<T> conv(d, ctx);
  DeviceBuffer gy(ny * sizeof(T));
  testing::internal::CaptureStderr();
  try {
    conv.forward(gx.as<float>(), gw.as<float>(), gb.as<float>(), gy.as<float>());
    FAIL() << "a layer needing its input gradient was padded at its first run";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layer stem: cuDNN runs no"), std::string::npos) << m;
    EXPECT_NE(m.find("16-bit NHWC data whose channels are not a multiple of 8"), std::string::npos) << m;
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("zero-padded"), std::string::npos);
}

TEST(GpuLowpConv, StemCudnnRefusesRunsOnPaddedChannels) {
  padded_stem_matches_unpadded<bf16>();
  padded_stem_matches_unpadded<f16>();
}

// A failing cuDNN call's error carries cuDNN's own reason (cudnnGetLastErrorString).
TEST(GpuCudnnConv, ErrorsCarryCudnnsReason) {
  ContextConfig cfg;
  CudaContext ctx(cfg);
  cudnnTensorDescriptor_t t = nullptr;
  cudnnFilterDescriptor_t f = nullptr;
  cudnnConvolutionDescriptor_t c = nullptr;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&t));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&f));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&c));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 2, 5, 5));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 2, 2, 3, 3));
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(c, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                              CUDNN_DATA_FLOAT));
  DeviceBuffer x(50 * 4), w(36 * 4), y(50 * 4), ws(64);
  const float one = 1, zero = 0;
  std::string m;
  try {
    CUDNN_CHECK(cudnnConvolutionForward(ctx.cudnn(), &one, t, x.get(), f, w.get(), c,
                                        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, ws.get(), 64,
                                        &zero, t, y.get()));
  } catch (const Error& e) {
    m = e.what();
  }
  cudnnDestroyConvolutionDescriptor(c);
  cudnnDestroyFilterDescriptor(f);
  cudnnDestroyTensorDescriptor(t);
  EXPECT_NE(m.find("CUDNN_STATUS_BAD_PARAM (emulated cuDNN) (2000): workspace too small"),
            std::string::npos)
      << m;
}
#endif

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

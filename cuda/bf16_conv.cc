// Bf16Conv: NHWC bf16 descriptors (cuDNN's "pseudo bf16" configuration: bf16 data, fp32
// compute), algorithm choice once per shape, execution with the private KRSC weight copy.
// Uses cuDNN's legacy convolution API, as cuda/cudnn_conv.cc.
#include "cuda/bf16_conv.h"

#include <algorithm>
#include <vector>

#include "cuda/algo_pick.h"
#include "cuda/bf16_kernels.h"
#include "cuda/check.h"

namespace rt::cuda {
namespace {

int narrow(int64_t v, const ConvDesc& d) {
  RT_SHAPE_CHECK(v >= 0 && v <= INT32_MAX, "layer ", d.name, ": dimension ", v,
                 " does not fit cuDNN's int (input ", d.in.str(), ")");
  return int(v);
}

void set_nhwc_bf16(cudnnTensorDescriptor_t t, const Shape& s, const ConvDesc& d) {
  // The logical dimensions are given as N, C, H, W whatever the format; NHWC sets the strides.
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16,
                                         narrow(s.n, d), narrow(s.c, d), narrow(s.h, d),
                                         narrow(s.w, d)));
}

// The policy's choice among cuDNN's ranked results for one direction (as cudnn_conv.cc).
template <class Perf>
const Perf& choose(const std::vector<Perf>& perf, int returned, const ContextConfig& cfg,
                   const ConvDesc& d, const char* direction) {
  std::vector<AlgoCandidate> cands;
  for (int i = 0; i < returned; ++i)
    cands.push_back({int(perf[i].algo), perf[i].status == CUDNN_STATUS_SUCCESS, perf[i].memory,
                     perf[i].determinism == CUDNN_DETERMINISTIC});
  const int k = algo_pick(cands, cfg.workspace_limit, cfg.deterministic);
  if (k < 0)
    throw Error(str_cat("layer ", d.name, ": no cuDNN bf16 NHWC ", direction,
                        " algorithm for input ", d.in.str(), " fits a workspace of ",
                        cfg.workspace_limit, " bytes", cfg.deterministic ? " and is deterministic" : "",
                        " (", returned, " candidates)"));
  return perf[size_t(k)];
}

}  // namespace

Bf16Conv::Bf16Conv(const ConvDesc& d, CudaContext& ctx) : d_(d), ctx_(ctx) {
  d_.validate();
  const Shape out = d_.out();
  wg_ = {d_.out_c, d_.in.c, d_.kernel_h, d_.kernel_w};
  out_rows_ = out.n * out.h * out.w;
  const ContextConfig& cfg = ctx_.config();
  cudnnHandle_t h = ctx_.cudnn();
  try {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
    set_nhwc_bf16(x_, d_.in, d_);
    set_nhwc_bf16(y_, out, d_);
    // NHWC filters are KRSC: [out][kh][kw][in], our OHWI copy.
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NHWC,
                                           narrow(d_.out_c, d_), narrow(d_.in.c, d_),
                                           narrow(d_.kernel_h, d_), narrow(d_.kernel_w, d_)));
    for (cudnnConvolutionDescriptor_t* c : {&fwd_, &bwd_data_, &bwd_filter_}) {
      CUDNN_CHECK(cudnnCreateConvolutionDescriptor(c));
      CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
          *c, narrow(d_.pad_h, d_), narrow(d_.pad_w, d_), narrow(d_.stride_h, d_),
          narrow(d_.stride_w, d_), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      CUDNN_CHECK(cudnnSetConvolutionMathType(*c, CUDNN_TENSOR_OP_MATH));
    }
    int n = 0, c = 0, oh = 0, ow = 0;
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(fwd_, x_, w_, &n, &c, &oh, &ow));
    RT_SHAPE_CHECK(n == out.n && c == out.c && oh == out.h && ow == out.w, "layer ", d_.name,
                   ": cuDNN computes output [", n, ",", c, ",", oh, ",", ow, "], expected ",
                   out.str());

    // Each direction keeps the math type cuDNN reported for the algorithm it chose.
    {
      int max = 0, got = 0;
      CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(max));
      if (cfg.benchmark_algos)
        CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, x_, w_, fwd_, y_, max, &got, perf.data()));
      else
        CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, x_, w_, fwd_, y_, max, &got, perf.data()));
      const auto& p = choose(perf, got, cfg, d_, "forward");
      fwd_algo_ = p.algo;
      CUDNN_CHECK(cudnnSetConvolutionMathType(fwd_, p.mathType));
    }
    {
      int max = 0, got = 0;
      CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(max));
      if (cfg.benchmark_algos)
        CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, w_, y_, bwd_data_, x_, max, &got,
                                                              perf.data()));
      else
        CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_, y_, bwd_data_, x_, max,
                                                                &got, perf.data()));
      const auto& p = choose(perf, got, cfg, d_, "backward-data");
      bwd_data_algo_ = p.algo;
      CUDNN_CHECK(cudnnSetConvolutionMathType(bwd_data_, p.mathType));
    }
    {
      int max = 0, got = 0;
      CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<size_t>(max));
      if (cfg.benchmark_algos)
        CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(h, x_, y_, bwd_filter_, w_, max,
                                                                &got, perf.data()));
      else
        CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_, y_, bwd_filter_, w_, max,
                                                                  &got, perf.data()));
      const auto& p = choose(perf, got, cfg, d_, "backward-filter");
      bwd_filter_algo_ = p.algo;
      CUDNN_CHECK(cudnnSetConvolutionMathType(bwd_filter_, p.mathType));
    }
    size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
    CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, x_, w_, fwd_, y_, fwd_algo_, &fwd_ws));
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_, y_, bwd_data_, x_,
                                                             bwd_data_algo_, &data_ws));
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x_, y_, bwd_filter_, w_,
                                                               bwd_filter_algo_, &filter_ws));
    workspace_ = std::max({fwd_ws, data_ws, filter_ws});
    ctx_.reserve_workspace(workspace_);
    w16_ = DeviceBuffer(size_t(wg_.count()) * sizeof(bf16));
    dw16_ = DeviceBuffer(size_t(wg_.count()) * sizeof(bf16));
    if (d_.bias) {
      bias_geom_ = channel_reduce_geom(out_rows_, d_.out_c);
      bias_partial_ =
          DeviceBuffer(size_t(2 * bias_geom_.chunks * bias_geom_.channels) * sizeof(float));
    }
  } catch (...) {  // the descriptors; the buffers free themselves
    release();
    throw;
  }
}

Bf16Conv::~Bf16Conv() { release(); }

void Bf16Conv::release() noexcept {
  for (cudnnConvolutionDescriptor_t c : {fwd_, bwd_data_, bwd_filter_})
    if (c) cudnnDestroyConvolutionDescriptor(c);
  if (w_) cudnnDestroyFilterDescriptor(w_);
  for (cudnnTensorDescriptor_t t : {x_, y_})
    if (t) cudnnDestroyTensorDescriptor(t);
  fwd_ = bwd_data_ = bwd_filter_ = nullptr;
  w_ = nullptr;
  x_ = y_ = nullptr;
}

void Bf16Conv::forward(const float* x, const float* w, const float* b, float* y) {
  const float one = 1, zero = 0;  // cuDNN takes fp32 scaling factors for bf16 data
  weight_to_ohwi_bf16(w, w16_.as<bf16>(), wg_, ctx_.stream());
  CUDNN_CHECK(cudnnConvolutionForward(ctx_.cudnn(), &one, x_, x, w_, w16_.get(), fwd_, fwd_algo_,
                                      ctx_.workspace(), workspace_, &zero, y_, y));
  if (d_.bias) bf16_bias_add(reinterpret_cast<bf16*>(y), b, out_rows_, d_.out_c, ctx_.stream());
}

void Bf16Conv::backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                        float* db) {
  const float one = 1, zero = 0;
  cudnnHandle_t h = ctx_.cudnn();
  if (dx) {
    weight_to_ohwi_bf16(w, w16_.as<bf16>(), wg_, ctx_.stream());
    CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, w_, w16_.get(), y_, dy, bwd_data_,
                                             bwd_data_algo_, ctx_.workspace(), workspace_, &zero,
                                             x_, dx));
  }
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, x_, x, y_, dy, bwd_filter_,
                                             bwd_filter_algo_, ctx_.workspace(), workspace_,
                                             &zero, w_, dw16_.get()));
  weight_grad_to_oihw(dw16_.as<bf16>(), dw, wg_, ctx_.stream());
  if (d_.bias) {
    ChannelSumArgs a;
    a.kind = ChannelSum::dy;
    a.dy = reinterpret_cast<const bf16*>(dy);
    a.partial = bias_partial_.as<float>();
    channel_sums(a, bias_geom_, db, nullptr, ctx_.stream());
  }
}

}  // namespace rt::cuda

// CudnnConv: descriptors, algorithm choice once per shape, execution on the context's stream.
// Uses cuDNN's legacy convolution API (still in cuDNN 9, deprecated in favour of the graph API).
#include "cuda/cudnn_conv.h"

#include <algorithm>
#include <vector>

#include "cuda/algo_pick.h"
#include "cuda/check.h"

namespace rt::cuda {
namespace {

int narrow(int64_t v, const ConvDesc& d) {
  RT_SHAPE_CHECK(v >= 0 && v <= INT32_MAX, "layer ", d.name, ": dimension ", v,
                 " does not fit cuDNN's int (input ", d.in.str(), ")");
  return int(v);
}

void set_nchw(cudnnTensorDescriptor_t t, const Shape& s, const ConvDesc& d) {
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, narrow(s.n, d),
                                         narrow(s.c, d), narrow(s.h, d), narrow(s.w, d)));
}

// fp32 without TF32 must not run on tensor cores (they round inputs to a 10-bit mantissa).
cudnnMathType_t math_for(cudnnMathType_t algo_math, bool allow_tf32) {
  return allow_tf32 ? algo_math : CUDNN_FMA_MATH;
}

// The ranked perf results of one direction into candidates, then the policy's choice. The three
// cudnn*AlgoPerf_t structs share these fields.
template <class Perf>
const Perf& choose(const std::vector<Perf>& perf, int returned, const ContextConfig& cfg,
                   const ConvDesc& d, const char* direction) {
  std::vector<AlgoCandidate> cands;
  for (int i = 0; i < returned; ++i)
    cands.push_back({int(perf[i].algo), perf[i].status == CUDNN_STATUS_SUCCESS, perf[i].memory,
                     perf[i].determinism == CUDNN_DETERMINISTIC});
  const int k = algo_pick(cands, cfg.workspace_limit, cfg.deterministic);
  if (k < 0)
    throw Error(str_cat("layer ", d.name, ": no cuDNN ", direction, " algorithm for input ",
                        d.in.str(), " fits a workspace of ", cfg.workspace_limit, " bytes",
                        cfg.deterministic ? " and is deterministic" : "", " (", returned,
                        " candidates)"));
  return perf[size_t(k)];
}

}  // namespace

CudnnConv::CudnnConv(const ConvDesc& d, CudaContext& ctx) : d_(d), ctx_(ctx) {
  d_.validate();
  const Shape out = d_.out();
  const ContextConfig& cfg = ctx_.config();
  cudnnHandle_t h = ctx_.cudnn();
  try {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias_));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
    set_nchw(x_, d_.in, d_);
    set_nchw(y_, out, d_);
    set_nchw(bias_, Shape{1, d_.out_c, 1, 1}, d_);
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                           narrow(d_.out_c, d_), narrow(d_.in.c, d_),
                                           narrow(d_.kernel_h, d_), narrow(d_.kernel_w, d_)));
    for (cudnnConvolutionDescriptor_t* c : {&fwd_, &bwd_data_, &bwd_filter_}) {
      CUDNN_CHECK(cudnnCreateConvolutionDescriptor(c));
      // Cross-correlation is what every framework calls convolution; fp32 accumulation.
      CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
          *c, narrow(d_.pad_h, d_), narrow(d_.pad_w, d_), narrow(d_.stride_h, d_),
          narrow(d_.stride_w, d_), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      CUDNN_CHECK(cudnnSetConvolutionMathType(*c, cfg.allow_tf32 ? CUDNN_DEFAULT_MATH
                                                                 : CUDNN_FMA_MATH));
    }
    // cuDNN must agree with the output shape the rest of the model was built for.
    int n = 0, c = 0, oh = 0, ow = 0;
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(fwd_, x_, w_, &n, &c, &oh, &ow));
    RT_SHAPE_CHECK(n == out.n && c == out.c && oh == out.h && ow == out.w, "layer ", d_.name,
                   ": cuDNN computes output [", n, ",", c, ",", oh, ",", ow, "], expected ",
                   out.str());

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
      CUDNN_CHECK(cudnnSetConvolutionMathType(fwd_, math_for(p.mathType, cfg.allow_tf32)));
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
      CUDNN_CHECK(cudnnSetConvolutionMathType(bwd_data_, math_for(p.mathType, cfg.allow_tf32)));
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
      CUDNN_CHECK(cudnnSetConvolutionMathType(bwd_filter_, math_for(p.mathType, cfg.allow_tf32)));
    }
    // Workspace sizes for the chosen algorithms under the final math types.
    size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
    CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, x_, w_, fwd_, y_, fwd_algo_, &fwd_ws));
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_, y_, bwd_data_, x_,
                                                             bwd_data_algo_, &data_ws));
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x_, y_, bwd_filter_, w_,
                                                               bwd_filter_algo_, &filter_ws));
    workspace_ = std::max({fwd_ws, data_ws, filter_ws});
    ctx_.reserve_workspace(workspace_);
  } catch (...) {
    release();
    throw;
  }
}

CudnnConv::~CudnnConv() { release(); }

void CudnnConv::release() noexcept {
  for (cudnnConvolutionDescriptor_t c : {fwd_, bwd_data_, bwd_filter_})
    if (c) cudnnDestroyConvolutionDescriptor(c);
  if (w_) cudnnDestroyFilterDescriptor(w_);
  for (cudnnTensorDescriptor_t t : {x_, y_, bias_})
    if (t) cudnnDestroyTensorDescriptor(t);
  fwd_ = bwd_data_ = bwd_filter_ = nullptr;
  w_ = nullptr;
  x_ = y_ = bias_ = nullptr;
}

void CudnnConv::forward(const float* x, const float* w, const float* b, float* y) {
  const float one = 1, zero = 0;
  CUDNN_CHECK(cudnnConvolutionForward(ctx_.cudnn(), &one, x_, x, w_, w, fwd_, fwd_algo_,
                                      ctx_.workspace(), workspace_, &zero, y_, y));
  if (d_.bias) CUDNN_CHECK(cudnnAddTensor(ctx_.cudnn(), &one, bias_, b, &one, y_, y));
}

void CudnnConv::backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                         float* db) {
  const float one = 1, zero = 0;
  cudnnHandle_t h = ctx_.cudnn();
  if (dx)
    CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, w_, w, y_, dy, bwd_data_, bwd_data_algo_,
                                             ctx_.workspace(), workspace_, &zero, x_, dx));
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, x_, x, y_, dy, bwd_filter_,
                                             bwd_filter_algo_, ctx_.workspace(), workspace_,
                                             &zero, w_, dw));
  if (d_.bias) CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, y_, dy, &zero, bias_, db));
}

}  // namespace rt::cuda

// CudnnConv: descriptors, algorithm choice once per shape, execution on the context's stream.
// Uses cuDNN's legacy convolution API (still in cuDNN 9, deprecated in favour of the graph API).
#include "cuda/cudnn_conv.h"

#include "cuda/check.h"
#include "cuda/conv_algos.h"

namespace rt::cuda {
CudnnConv::CudnnConv(const ConvDesc& d, CudaContext& ctx) : d_(d), ctx_(ctx) {
  d_.validate();
  const Shape out = d_.out();
  const ContextConfig& cfg = ctx_.config();
  try {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias_));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
    conv_set_tensor(x_, d_.in, d_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT);
    conv_set_tensor(y_, out, d_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT);
    conv_set_tensor(bias_, Shape{1, d_.out_c, 1, 1}, d_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT);
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                           lib_int(d_.out_c, d_), lib_int(d_.in_per_group(), d_),
                                           lib_int(d_.kernel_h, d_), lib_int(d_.kernel_w, d_)));
    for (cudnnConvolutionDescriptor_t* c : {&fwd_, &bwd_data_, &bwd_filter_}) {
      CUDNN_CHECK(cudnnCreateConvolutionDescriptor(c));
      // Cross-correlation is what every framework calls convolution; fp32 accumulation.
      CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
          *c, lib_int(d_.pad_h, d_), lib_int(d_.pad_w, d_), lib_int(d_.stride_h, d_),
          lib_int(d_.stride_w, d_), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      CUDNN_CHECK(cudnnSetConvolutionGroupCount(*c, lib_int(d_.groups, d_)));
      CUDNN_CHECK(cudnnSetConvolutionMathType(*c, cfg.allow_tf32 ? CUDNN_DEFAULT_MATH
                                                                 : CUDNN_FMA_MATH));
    }
    // cuDNN must agree with the output shape the rest of the model was built for.
    int n = 0, c = 0, oh = 0, ow = 0;
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(fwd_, x_, w_, &n, &c, &oh, &ow));
    RT_SHAPE_CHECK(n == out.n && c == out.c && oh == out.h && ow == out.w, "layer ", d_.name,
                   ": cuDNN computes output [", n, ",", c, ",", oh, ",", ow, "], expected ",
                   out.str());

    // Without TF32, FMA math: fp32 results comparable with the CPU backends.
    run_.emplace(
        conv_choose_algos(ctx_, x_, w_, y_, fwd_, bwd_data_, bwd_filter_, d_, cfg.allow_tf32, ""));
    ctx_.reserve_workspace(run_->workspace());
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
  auto conv = [&](int algo, void* ws, size_t bytes) {
    return cudnnConvolutionForward(ctx_.cudnn(), &one, x_, x, w_, w, fwd_,
                                   cudnnConvolutionFwdAlgo_t(algo), ws, bytes, &zero, y_, y);
  };
  CUDNN_CHECK(run_->run(kConvForward, conv));
  if (d_.bias) CUDNN_CHECK(cudnnAddTensor(ctx_.cudnn(), &one, bias_, b, &one, y_, y));
}

void CudnnConv::backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                         float* db) {
  run_backward(x, w, dy, dx, dw, db, 0.0f);
}

void CudnnConv::run_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                             float* db, float dx_beta) {
  const float one = 1, zero = 0;
  cudnnHandle_t h = ctx_.cudnn();
  if (dx && !d_.input_grad)
    throw Error(str_cat("layer ", d_.name, ": asked for the input gradient of a convolution built "
                        "without one (ConvDesc::input_grad)"));
  auto data = [&](int algo, void* ws, size_t bytes) {
    return cudnnConvolutionBackwardData(h, &one, w_, w, y_, dy, bwd_data_,
                                        cudnnConvolutionBwdDataAlgo_t(algo), ws, bytes, &dx_beta,
                                        x_, dx);
  };
  auto filter = [&](int algo, void* ws, size_t bytes) {
    return cudnnConvolutionBackwardFilter(h, &one, x_, x, y_, dy, bwd_filter_,
                                          cudnnConvolutionBwdFilterAlgo_t(algo), ws, bytes, &zero,
                                          w_, dw);
  };
  if (dx) CUDNN_CHECK(run_->run(kConvBackwardData, data));
  CUDNN_CHECK(run_->run(kConvBackwardFilter, filter));
  if (d_.bias) CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, y_, dy, &zero, bias_, db));
}

}  // namespace rt::cuda

// Bf16Conv: NHWC bf16 descriptors (cuDNN's "pseudo bf16" configuration: bf16 data, fp32
// compute), algorithm choice once per shape, execution with the private KRSC weight copy.
// Uses cuDNN's legacy convolution API, as cuda/cudnn_conv.cc.
#include "cuda/bf16_conv.h"

#include "cuda/bf16_kernels.h"
#include "cuda/check.h"
#include "cuda/conv_algos.h"

namespace rt::cuda {
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
    conv_set_tensor(x_, d_.in, d_, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16);
    conv_set_tensor(y_, out, d_, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16);
    // NHWC filters are KRSC: [out][kh][kw][in], our OHWI copy.
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NHWC,
                                           conv_narrow(d_.out_c, d_), conv_narrow(d_.in.c, d_),
                                           conv_narrow(d_.kernel_h, d_), conv_narrow(d_.kernel_w, d_)));
    for (cudnnConvolutionDescriptor_t* c : {&fwd_, &bwd_data_, &bwd_filter_}) {
      CUDNN_CHECK(cudnnCreateConvolutionDescriptor(c));
      CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
          *c, conv_narrow(d_.pad_h, d_), conv_narrow(d_.pad_w, d_), conv_narrow(d_.stride_h, d_),
          conv_narrow(d_.stride_w, d_), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      CUDNN_CHECK(cudnnSetConvolutionMathType(*c, CUDNN_TENSOR_OP_MATH));
    }
    int n = 0, c = 0, oh = 0, ow = 0;
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(fwd_, x_, w_, &n, &c, &oh, &ow));
    RT_SHAPE_CHECK(n == out.n && c == out.c && oh == out.h && ow == out.w, "layer ", d_.name,
                   ": cuDNN computes output [", n, ",", c, ",", oh, ",", ow, "], expected ",
                   out.str());

    // Tensor-core math: each direction keeps the math type cuDNN reported for its algorithm.
    const ConvAlgos a =
        conv_choose_algos(h, x_, w_, y_, fwd_, bwd_data_, bwd_filter_, cfg, d_, true, "bf16 NHWC ");
    fwd_algo_ = a.fwd;
    bwd_data_algo_ = a.bwd_data;
    bwd_filter_algo_ = a.bwd_filter;
    workspace_ = a.workspace;
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

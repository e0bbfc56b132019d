// LowpConv: NHWC 16-bit descriptors (cuDNN's "pseudo" 16-bit configurations: bf16 or half
// data, fp32 compute), algorithm choice once per shape, execution with the private KRSC weight
// copy. Uses cuDNN's legacy convolution API, as cuda/cudnn_conv.cc.
#include "cuda/lowp_conv.h"

#include <cstdio>
#include <string>

#include "cuda/check.h"
#include "cuda/conv_algos.h"
#include "cuda/lowp_kernels.h"

namespace rt::cuda {
namespace {

// The storage type's cuDNN data type (the compute type is CUDNN_DATA_FLOAT for both).
template <class T> constexpr cudnnDataType_t kCudnnType = CUDNN_DATA_BFLOAT16;  // T = bf16
template <> constexpr cudnnDataType_t kCudnnType<f16> = CUDNN_DATA_HALF;

// The kind of convolution, for messages and the algorithm cache's key.
template <class T>
const std::string& kind() {
  static const std::string k = std::string(Lowp<T>::name) + " NHWC ";
  return k;
}

}  // namespace

template <class T>
LowpConv<T>::LowpConv(const ConvDesc& d, CudaContext& ctx) : d_(d), ctx_(ctx) {
  d_.validate();
  const Shape out = d_.out();
  wg_ = {d_.out_c, d_.in_per_group(), d_.kernel_h, d_.kernel_w};
  out_rows_ = out.n * out.h * out.w;
  try {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
    set_input_channels(d_.in.c);
    conv_set_tensor(y_, out, d_, CUDNN_TENSOR_NHWC, kCudnnType<T>);
    for (cudnnConvolutionDescriptor_t* c : {&fwd_, &bwd_data_, &bwd_filter_}) {
      CUDNN_CHECK(cudnnCreateConvolutionDescriptor(c));
      CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
          *c, lib_int(d_.pad_h, d_), lib_int(d_.pad_w, d_), lib_int(d_.stride_h, d_),
          lib_int(d_.stride_w, d_), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      CUDNN_CHECK(cudnnSetConvolutionGroupCount(*c, lib_int(d_.groups, d_)));
      CUDNN_CHECK(cudnnSetConvolutionMathType(*c, CUDNN_TENSOR_OP_MATH));
    }
    int n = 0, c = 0, oh = 0, ow = 0;
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(fwd_, x_, w_, &n, &c, &oh, &ow));
    RT_SHAPE_CHECK(n == out.n && c == out.c && oh == out.h && ow == out.w, "layer ", d_.name,
                   ": cuDNN computes output [", n, ",", c, ",", oh, ",", ow, "], expected ",
                   out.str());

    // Tensor-core math: each direction keeps the math type cuDNN reported for its algorithm.
    if (const std::string why = choose_algos(d_); !why.empty()) {
      if (!paddable()) throw Error(why);
      pad_input_channels(why);
    }
    ctx_.reserve_workspace(run_->workspace());
    w16_ = DeviceBuffer(size_t(wg_.count()) * sizeof(T));
    dw16_ = DeviceBuffer(size_t(wg_.count()) * sizeof(T));
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

template <class T>
void LowpConv<T>::set_input_channels(int64_t c) {
  Shape in = d_.in;
  in.c = c;
  conv_set_tensor(x_, in, d_, CUDNN_TENSOR_NHWC, kCudnnType<T>);
  // NHWC filters are KRSC: [out][kh][kw][in / groups], our OHWI copy.
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, kCudnnType<T>, CUDNN_TENSOR_NHWC,
                                         lib_int(d_.out_c, d_), lib_int(c / d_.groups, d_),
                                         lib_int(d_.kernel_h, d_), lib_int(d_.kernel_w, d_)));
}

template <class T>
std::string LowpConv<T>::choose_algos(const ConvDesc& shape) {
  try {
    run_.emplace(conv_choose_algos(ctx_, x_, w_, y_, fwd_, bwd_data_, bwd_filter_, shape, true,
                                   kind<T>().c_str()));
    return "";
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    return e.what();
  }
}

template <class T>
bool LowpConv<T>::paddable() const {
  return !pad_c_ && !d_.input_grad && d_.in.c % 8 != 0 && d_.groups == 1;
}

template <class T>
template <class Run>
void LowpConv<T>::padded_if_refused(Run&& run) {
  try {
    run();
  } catch (const ConvRefused& e) {
    // Heuristic choice (cuda.conv_algos: heuristic, cuda.deterministic) runs nothing at set-up, so
    // a stem cuDNN will not run as it is may show it only now: padded, as at set-up, and run again
    // (its buffers allocated once, in the first step).
    if (!paddable()) throw;
    pad_input_channels(e.what());
    ctx_.reserve_workspace(run_->workspace());
    run();
  }
}

template <class T>
void LowpConv<T>::pad_input_channels(const std::string& why) {
  pad_c_ = (d_.in.c + 7) / 8 * 8;
  set_input_channels(pad_c_);
  ConvDesc padded = d_;  // the shape cuDNN sees, and the algorithm cache's key for it
  padded.in.c = pad_c_;
  if (const std::string e = choose_algos(padded); !e.empty())
    throw Error(str_cat(why, "; nor with its input zero-padded to ", pad_c_, " channels: ", e));
  x_pad_ = {d_.in.n, d_.in.c, d_.in.h, d_.in.w, pad_c_, d_.in.h, d_.in.w, 1, 0};
  w_pad_ = {d_.out_c, d_.in.c, d_.kernel_h, d_.kernel_w, pad_c_, d_.kernel_h, d_.kernel_w, 1, 0};
  x16p_ = DeviceBuffer(size_t(d_.in.n * d_.in.h * d_.in.w * pad_c_) * sizeof(T));
  w16p_ = DeviceBuffer(size_t(d_.out_c * d_.kernel_h * d_.kernel_w * pad_c_) * sizeof(T));
  dw16p_ = DeviceBuffer(w16p_.bytes());
  std::fprintf(stderr,
               "warning: layer %s: cuDNN offers no %sconvolution for its %lld input channels (%s); "
               "it runs on its input zero-padded to %lld channels, with the same results\n",
               d_.name.c_str(), kind<T>().c_str(), (long long)d_.in.c, why.c_str(), (long long)pad_c_);
}

template <class T>
const void* LowpConv<T>::conv_input(const float* x) {
  if (!pad_c_) return x;
  lowp_pad_shortcut_forward(reinterpret_cast<const T*>(x), x16p_.as<T>(), x_pad_, ctx_.stream());
  return x16p_.get();
}

template <class T>
const void* LowpConv<T>::conv_weights(const float* w) {
  weight_to_ohwi_lowp(w, w16_.as<T>(), wg_, ctx_.stream());
  if (!pad_c_) return w16_.get();
  lowp_pad_shortcut_forward(w16_.as<T>(), w16p_.as<T>(), w_pad_, ctx_.stream());
  return w16p_.get();
}

template <class T>
LowpConv<T>::~LowpConv() { release(); }

template <class T>
void LowpConv<T>::release() noexcept {
  for (cudnnConvolutionDescriptor_t c : {fwd_, bwd_data_, bwd_filter_})
    if (c) cudnnDestroyConvolutionDescriptor(c);
  if (w_) cudnnDestroyFilterDescriptor(w_);
  for (cudnnTensorDescriptor_t t : {x_, y_})
    if (t) cudnnDestroyTensorDescriptor(t);
  fwd_ = bwd_data_ = bwd_filter_ = nullptr;
  w_ = nullptr;
  x_ = y_ = nullptr;
}

template <class T>
void LowpConv<T>::forward(const float* x, const float* w, const float* b, float* y) {
  padded_if_refused([&] {
    const float one = 1, zero = 0;  // cuDNN takes fp32 scaling factors for 16-bit data
    const void* wc = conv_weights(w);
    const void* xc = conv_input(x);
    auto conv = [&](int algo, void* ws, size_t bytes) {
      return cudnnConvolutionForward(ctx_.cudnn(), &one, x_, xc, w_, wc, fwd_,
                                     cudnnConvolutionFwdAlgo_t(algo), ws, bytes, &zero, y_, y);
    };
    CUDNN_CHECK(run_->run(kConvForward, conv));
  });
  if (d_.bias) lowp_bias_add(reinterpret_cast<T*>(y), b, out_rows_, d_.out_c, ctx_.stream());
}

template <class T>
void LowpConv<T>::backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                        float* db) {
  run_backward(x, w, dy, dx, dw, db, 0.0f);
}

template <class T>
void LowpConv<T>::run_backward(const float* x, const float* w, const float* dy, float* dx,
                               float* dw, float* db, float dx_beta) {
  const float one = 1, zero = 0;
  cudnnHandle_t h = ctx_.cudnn();
  if (dx && !d_.input_grad)
    throw Error(str_cat("layer ", d_.name, ": asked for the input gradient of a convolution built "
                        "without one (ConvDesc::input_grad)"));
  if (dx) {  // never padded: a padded layer has no input gradient
    weight_to_ohwi_lowp(w, w16_.as<T>(), wg_, ctx_.stream());
    auto data = [&](int algo, void* ws, size_t bytes) {
      return cudnnConvolutionBackwardData(h, &one, w_, w16_.get(), y_, dy, bwd_data_,
                                          cudnnConvolutionBwdDataAlgo_t(algo), ws, bytes,
                                          &dx_beta, x_, dx);
    };
    CUDNN_CHECK(run_->run(kConvBackwardData, data));
  }
  // Padded again rather than kept from forward: another forward (evaluation) may come between.
  padded_if_refused([&] {
    const void* xc = conv_input(x);
    void* dwc = pad_c_ ? dw16p_.get() : dw16_.get();
    auto filter = [&](int algo, void* ws, size_t bytes) {
      return cudnnConvolutionBackwardFilter(h, &one, x_, xc, y_, dy, bwd_filter_,
                                            cudnnConvolutionBwdFilterAlgo_t(algo), ws, bytes,
                                            &zero, w_, dwc);
    };
    CUDNN_CHECK(run_->run(kConvBackwardFilter, filter));
  });
  // The padded channels' gradients are dropped: the first c of each KRSC row are the layer's.
  if (pad_c_) lowp_pad_shortcut_backward(dw16p_.as<T>(), dw16_.as<T>(), w_pad_, ctx_.stream());
  weight_grad_to_oihw(dw16_.as<T>(), dw, wg_, ctx_.stream());
  if (d_.bias) bias_grad<T>(dy, bias_partial_.as<float>(), bias_geom_, db, ctx_.stream());
}

template class LowpConv<bf16>;
template class LowpConv<f16>;

}  // namespace rt::cuda

// Convolution for the 16-bit backends (cuda-bf16, cuda-fp16): cuDNN on NHWC activations of
// T = bf16 or f16 (CUDNN_DATA_BFLOAT16 / CUDNN_DATA_HALF) with fp32 compute on tensor cores, as
// an rt::ConvOp<float> whose x, y, dy, dx are T NHWC device buffers (passed as float*) and whose
// w, b, dw, db are the arena's fp32 canonical tensors. Instantiated for both types.
//
// A layer without an input gradient (the stem) whose channels are not a multiple of 8 (3, for
// images) and for which cuDNN offers no algorithm in that layout runs on its input and weights
// zero-padded to the next multiple of 8 instead: the padded channels add zeros to y and their
// weight gradients are dropped, so the results are the unpadded convolution's. One warning
// says so, with cuDNN's reason.
#pragma once
#include <cudnn.h>

#include <cstddef>
#include <optional>

#include "cuda/layer_kernels.h"
#include "cuda/lowp_layout.h"
#include "cuda/context.h"
#include "cuda/conv_run.h"
#include "cuda/memory.h"
#include "nn/ops.h"

namespace rt::cuda {

template <class T>
class LowpConv final : public ConvOp<float> {
 public:
  // Chooses the three algorithms once for the shape (ctx.config(): timed or heuristic,
  // deterministic or not, workspace limit), grows the context's workspace and allocates the
  // private T weight and weight-gradient copies (KRSC), and the padded copies if it pads.
  // Throws rt::Error naming the layer when no algorithm fits.
  LowpConv(const ConvDesc& d, CudaContext& ctx);
  ~LowpConv() override;
  LowpConv(const LowpConv&) = delete;
  LowpConv& operator=(const LowpConv&) = delete;

  // Asynchronous on the context's stream. Each call first casts w (fp32 OIHW) to the private
  // T KRSC copy, so the op never uses stale weights. dw (and db) are overwritten in fp32:
  // cuDNN computes dw in T (fp32 accumulation, one rounding), then it is widened.
  void forward(const float* x, const float* w, const float* b, float* y) override;
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db) override;
  // backward_add_dx: dx += the input gradient (cuDNN's beta = 1), computed in fp32 and rounded
  // to T once.
  bool adds_dx() const override { return d_.input_grad; }
  void backward_add_dx(const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db) override {
    run_backward(x, w, dy, dx, dw, db, 1.0f);
  }

 private:
  // backward, dx scaled by dx_beta before the gradient is added (0: overwritten).
  void run_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                    float dx_beta);
  void release() noexcept;
  // The descriptors of x and w for c input channels.
  void set_input_channels(int64_t c);
  // Chooses the algorithms for the descriptors as set, a layer of `shape`: "" or, when none
  // fits, why (an allocation failure throws rt::OutOfMemory).
  std::string choose_algos(const ConvDesc& shape);
  // Chooses the algorithms on the input padded to pad_c_ channels, after `why` refused it as is.
  void pad_input_channels(const std::string& why);
  // A layer whose refusal padding answers: no input gradient, channels not a multiple of 8, one
  // group, not padded yet.
  bool paddable() const;
  // run(), padded and run again when a first run finds cuDNN refusing every candidate.
  template <class Run>
  void padded_if_refused(Run&& run);
  // What cuDNN reads: x, or its padded copy; the weights cast (and padded) from the fp32 w.
  const void* conv_input(const float* x);
  const void* conv_weights(const float* w);
  ConvDesc d_;
  CudaContext& ctx_;
  WeightGeom wg_;
  int64_t out_rows_ = 0;  // n * out_h * out_w
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t fwd_ = nullptr, bwd_data_ = nullptr, bwd_filter_ = nullptr;
  std::optional<ConvRunner> run_;  // the algorithms, once chosen
  DeviceBuffer w16_, dw16_;
  int64_t pad_c_ = 0;                 // input channels cuDNN sees when padded, else 0
  ShortcutGeom x_pad_, w_pad_;        // x and the KRSC weights (as NHWC) to pad_c_ channels
  DeviceBuffer x16p_, w16p_, dw16p_;  // the padded copies
  ChannelReduceGeom bias_geom_;  // db: sums of dy over its rows
  DeviceBuffer bias_partial_;
};

}  // namespace rt::cuda

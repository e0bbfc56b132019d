// The 16-bit backends' layers (cuda-bf16, cuda-fp16) other than convolution: batch norm, ReLU,
// residual add, max, windowed and global average pooling, CIFAR padded shortcut, SE channel gate,
// ECA channel convolution, linear and the loss, for storage type T = bf16 or f16
// (cuda/lowp_kernels.h). Activations and their gradients are T NHWC device buffers passed as
// float*; parameters, their gradients and the running statistics are the arena's fp32 tensors.
// Every op runs on the context's stream.
#pragma once
#include <memory>

#include "cuda/context.h"
#include "cuda/cudnn_batchnorm.h"  // SharedScratch
#include "nn/ops.h"

namespace rt::cuda {

// A 16-bit activation buffer, passed through the float* interface, as its storage type.
template <class T>
const T* lowp_data(const float* p) { return reinterpret_cast<const T*>(p); }
template <class T>
T* lowp_data(float* p) { return reinterpret_cast<T*>(p); }

// Our own kernels (cuDNN's legacy batch norm is not used for 16-bit data): per-channel
// statistics in fp32 (one Welford pass on the vector grid, else the mean, then the squared
// deviations), combined in a fixed order. The
// chunk partials live in `scratch`, shared by all batch norms of a model.
template <class T>
std::unique_ptr<BatchNormOp<float>> make_lowp_batchnorm(const BatchNormDesc& d, CudaContext& ctx,
                                                        SharedScratch& scratch);
template <class T>
std::unique_ptr<ReluOp<float>> make_lowp_relu(const ReluDesc& d, CudaContext& ctx);
template <class T>
std::unique_ptr<AddOp<float>> make_lowp_add(const AddDesc& d, CudaContext& ctx);
template <class T>
std::unique_ptr<MaxPoolOp<float>> make_lowp_maxpool(const MaxPoolDesc& d, CudaContext& ctx);
template <class T>
std::unique_ptr<AvgPoolOp<float>> make_lowp_avgpool(const AvgPoolDesc& d, CudaContext& ctx);
template <class T>
std::unique_ptr<GlobalAvgPoolOp<float>> make_lowp_global_avgpool(const GlobalAvgPoolDesc& d,
                                                                 CudaContext& ctx);
template <class T>
std::unique_ptr<PadShortcutOp<float>> make_lowp_pad_shortcut(const PadShortcutDesc& d,
                                                             CudaContext& ctx);
template <class T>
std::unique_ptr<ChannelGateOp<float>> make_lowp_channel_gate(const ChannelGateDesc& d, CudaContext& ctx);
// The fp32 backend's kernels on T (channel_conv_forward, cuda/layer_kernels.h): y and dx the
// reference's results rounded to T, dw fp32.
template <class T>
std::unique_ptr<ChannelConvOp<float>> make_lowp_channel_conv(const ChannelConvDesc& d, CudaContext& ctx);
// cublasGemmEx with T operands and fp32 accumulation; the output is computed in fp32, the bias
// added, then rounded once to T. dw is computed in fp32 and reordered to [out][C][H][W].
template <class T>
std::unique_ptr<LinearOp<float>> make_lowp_linear(const LinearDesc& d, CudaContext& ctx);
// Takes host labels (uploaded in forward); widens the T logits to fp32 and runs the fp32 device
// loss (cuda/softmax_xent.h); dlogits (already multiplied by the loss scale) are rounded to T.
template <class T>
std::unique_ptr<SoftmaxXentOp<float>> make_lowp_softmax_xent(const SoftmaxXentDesc& d,
                                                             CudaContext& ctx);

}  // namespace rt::cuda

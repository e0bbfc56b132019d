// The bf16 backend's layers (cuda-bf16) other than convolution: batch norm, ReLU, residual add,
// max and global average pooling, CIFAR padded shortcut, linear and the loss. Activations and
// their gradients are bf16 NHWC device buffers passed as float*; parameters, their gradients and
// the running statistics are the arena's fp32 tensors. Every op runs on the context's stream.
#pragma once
#include <memory>

#include "cuda/context.h"
#include "cuda/cudnn_batchnorm.h"  // SharedScratch
#include "nn/ops.h"

namespace rt::cuda {

// Our own kernels (cuDNN's legacy batch norm is not used for bf16): per-channel statistics in
// fp32, two passes (mean, then squared deviations), summed in a fixed order. The chunk partials
// live in `scratch`, shared by all batch norms of a model.
std::unique_ptr<BatchNormOp<float>> make_bf16_batchnorm(const BatchNormDesc& d, CudaContext& ctx,
                                                        SharedScratch& scratch);
std::unique_ptr<ReluOp<float>> make_bf16_relu(const ReluDesc& d, CudaContext& ctx);
std::unique_ptr<AddOp<float>> make_bf16_add(const AddDesc& d, CudaContext& ctx);
std::unique_ptr<MaxPoolOp<float>> make_bf16_maxpool(const MaxPoolDesc& d, CudaContext& ctx);
std::unique_ptr<GlobalAvgPoolOp<float>> make_bf16_global_avgpool(const GlobalAvgPoolDesc& d,
                                                                 CudaContext& ctx);
std::unique_ptr<PadShortcutOp<float>> make_bf16_pad_shortcut(const PadShortcutDesc& d,
                                                             CudaContext& ctx);
// cublasGemmEx with bf16 operands and fp32 accumulation; the output is computed in fp32, the
// bias added, then rounded once to bf16. dw is computed in fp32 and reordered to [out][C][H][W].
std::unique_ptr<LinearOp<float>> make_bf16_linear(const LinearDesc& d, CudaContext& ctx);
// Takes host labels (uploaded in forward); widens the bf16 logits to fp32 and runs the fp32
// device loss (cuda/softmax_xent.h); dlogits are rounded to bf16.
std::unique_ptr<SoftmaxXentOp<float>> make_bf16_softmax_xent(const SoftmaxXentDesc& d,
                                                             CudaContext& ctx);

}  // namespace rt::cuda

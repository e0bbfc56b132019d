// The cuDNN side of choosing a convolution's three algorithms once per shape, shared by the fp32
// (cudnn_conv) and 16-bit (lowp_conv) convolutions: ranked candidates from cuDNN's heuristics or
// timing, the policy of algo_pick.h, the math type, the workspace they need.
#pragma once
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/conv_algo_cache.h"
#include "cuda/context.h"
#include "cuda/conv_run.h"
#include "nn/ops.h"

namespace rt::cuda {

// Sets a 4-D tensor descriptor of logical shape s (N, C, H, W whatever the format: the format sets
// the strides), checking each dimension with lib_int and the total against the legacy
// descriptors' 2^31 - 1 elements (rt::ShapeError naming the layer).
void conv_set_tensor(cudnnTensorDescriptor_t t, const Shape& s, const ConvDesc& d,
                     cudnnTensorFormat_t format, cudnnDataType_t type);

// The cache key of a convolution: its kind ("", "bf16 NHWC ", ...), the math it may use and its
// geometry (input shape, output channels, kernel, stride, padding, groups; not its name or
// bias).
std::string conv_algo_key(const ConvDesc& d, bool tensor_ops, const char* kind);

// For descriptors already set (x, w, y; one convolution descriptor per direction): chooses each
// direction's algorithm (ctx.config(): timed or heuristic, deterministic or not, workspace limit;
// the best ranked one whose workspace cuDNN's size query confirms within the limit), or takes
// the choice ctx made for an earlier layer of the same key (ctx.conv_algos()) or one its
// algorithm cache file holds (when cuDNN still accepts it for these descriptors), sets that
// direction's math type to tensor_ops ? the type cuDNN reported for it : CUDNN_FMA_MATH (fp32
// without TF32 must not use tensor cores, which round inputs to a 10-bit mantissa), and returns
// the runner of the layer's calls (conv_run.h) holding them, the workspace they need under those
// math types and each direction's other confirmed candidates in rank order. `kind` names the
// convolution in errors ("", "bf16 NHWC ", "fp16 NHWC "). Throws rt::Error naming the layer when
// no algorithm fits.
ConvRunner conv_choose_algos(CudaContext& ctx, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                             cudnnTensorDescriptor_t y, cudnnConvolutionDescriptor_t fwd,
                             cudnnConvolutionDescriptor_t bwd_data,
                             cudnnConvolutionDescriptor_t bwd_filter, const ConvDesc& d,
                             bool tensor_ops, const char* kind);

}  // namespace rt::cuda

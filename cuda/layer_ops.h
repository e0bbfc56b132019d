// The backend's element-wise and pooling layers as rt ops over device pointers (fp32 NCHW),
// each a thin set-up wrapper around cuda/layer_kernels.h on the context's stream.
#pragma once
#include <memory>

#include "cuda/context.h"
#include "nn/ops.h"

namespace rt::cuda {

std::unique_ptr<ReluOp<float>> make_device_relu(const ReluDesc& d, CudaContext& ctx);
std::unique_ptr<AddOp<float>> make_device_add(const AddDesc& d, CudaContext& ctx);
std::unique_ptr<MaxPoolOp<float>> make_device_maxpool(const MaxPoolDesc& d, CudaContext& ctx);
std::unique_ptr<AvgPoolOp<float>> make_device_avgpool(const AvgPoolDesc& d, CudaContext& ctx);
std::unique_ptr<GlobalAvgPoolOp<float>> make_device_global_avgpool(const GlobalAvgPoolDesc& d,
                                                                   CudaContext& ctx);
std::unique_ptr<PadShortcutOp<float>> make_device_pad_shortcut(const PadShortcutDesc& d,
                                                               CudaContext& ctx);
std::unique_ptr<ChannelGateOp<float>> make_device_channel_gate(const ChannelGateDesc& d, CudaContext& ctx);
std::unique_ptr<ChannelConvOp<float>> make_device_channel_conv(const ChannelConvDesc& d, CudaContext& ctx);

}  // namespace rt::cuda

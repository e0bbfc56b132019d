// Factories of the reference backend's ops, one translation unit per family of layers.
#pragma once
#include <cmath>
#include <memory>

#include "nn/ops.h"

namespace rt::ref {

// Loops with less work than this run on one thread: a parallel region costs more, and far more
// when the cores are shared.
constexpr int64_t kParallelWork = 1 << 15;

// max(v, 0) that keeps NaN, as torch.relu does.
inline double relu_value(double v) { return (v > 0 || std::isnan(v)) ? v : 0.0; }

// Each validates its description, then allocates all scratch it will ever need.
template <class T> std::unique_ptr<ConvOp<T>> make_conv(const ConvDesc& d);
template <class T> std::unique_ptr<LinearOp<T>> make_linear(const LinearDesc& d);
template <class T> std::unique_ptr<BatchNormOp<T>> make_batchnorm(const BatchNormDesc& d);
template <class T> std::unique_ptr<MaxPoolOp<T>> make_maxpool(const MaxPoolDesc& d);
template <class T> std::unique_ptr<AvgPoolOp<T>> make_avgpool(const AvgPoolDesc& d);
template <class T> std::unique_ptr<GlobalAvgPoolOp<T>> make_global_avgpool(const GlobalAvgPoolDesc& d);
template <class T> std::unique_ptr<ReluOp<T>> make_relu(const ReluDesc& d);
template <class T> std::unique_ptr<AddOp<T>> make_add(const AddDesc& d);
template <class T> std::unique_ptr<PadShortcutOp<T>> make_pad_shortcut(const PadShortcutDesc& d);
template <class T> std::unique_ptr<SoftmaxXentOp<T>> make_softmax_xent(const SoftmaxXentDesc& d);
template <class T> std::unique_ptr<ChannelGateOp<T>> make_channel_gate(const ChannelGateDesc& d);

}  // namespace rt::ref

// Winograd F(2x2, 3x3) convolution on nChw8c activations: 3x3, stride 1, pad 1, no bias, C and K
// multiples of 8. oneDNN 2.6 offers Winograd only on AVX-512; this one runs on AVX2+FMA.
#pragma once
#include <memory>

#include "nn/onednn/onednn_common.h"

namespace rt::dnn {

// How the backend picks a convolution algorithm, fixed when the backend is made.
enum class ConvAlgo { automatic, direct, winograd };

// Whether the Winograd op can run d at all (geometry, layout, CPU).
bool winograd_applies(const ConvDesc& d);

// The automatic rule, from per-layer measurements against oneDNN's direct convolution (see
// docs/winograd.md). A function of the shapes only, so every run makes the same choice.
bool winograd_pays(const ConvDesc& d);

std::unique_ptr<ConvOp<float>> make_winograd_conv_op(const ContextPtr& ctx, const ConvDesc& d);

}  // namespace rt::dnn

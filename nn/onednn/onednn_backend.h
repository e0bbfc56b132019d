// The oneDNN CPU backend (fp32): primitives created once per shape, blocked layouts kept end to end.
#pragma once
#include <memory>
#include <string>

#include "nn/ops.h"

namespace rt {

// Activation layout: nChw8c or nChw16c (channel blocks of `block`: 8, 16, or 0 for the
// processor's, 16 with AVX-512) for tensors with C a multiple of the block and more than one
// pixel, plain NCHW otherwise (the 3-channel input, other channel counts, (n, c, 1, 1) vectors);
// act_size is always n*c*h*w. Ops of one backend share scratch buffers, so they must not run
// concurrently (use one backend per thread). oneDNN sizes its thread partitioning when an op is
// made: call omp_set_num_threads before building the model, not after.
// name picks the 3x3 convolution algorithm: "onednn" (alias "cpu") Winograd F(2x2, 3x3) where
// the shape rule in winograd.cc says it pays on 8-channel blocks, oneDNN direct elsewhere;
// "onednn-direct" never Winograd; "onednn-winograd" Winograd wherever it applies (8-channel
// blocks, whatever the processor). Null for any other name; rt::Error for a block not 0, 8 or 16,
// or 16 with onednn-winograd.
std::unique_ptr<Backend<float>> make_onednn_backend(const std::string& name, int block = 0);

}  // namespace rt

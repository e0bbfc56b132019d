// Launchers of the loss kernels, softmax cross-entropy or BCE (C++17-clean: nvcc includes it).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace rt::cuda {

struct XentArgs {
  int64_t n = 0, k = 0;          // rows (batch) and classes
  float label_smoothing = 0;     // eps
  bool bce = false;              // a sigmoid and binary cross-entropy per class (nn/ops.h LossKind)
  float bce_threshold = -1;      // bce: >= 0 makes each target 1 above it, else 0
  const float* logits = nullptr; // (n, k)
  const int32_t* labels = nullptr;
  const int32_t* mixed = nullptr; // the blend's second label per row (weight 1 - mix); targets
  float mix = 1;                  //   that are not blended: labels itself at weight 1, the same bits
  float* prob = nullptr;         // (n, k): softmax (bce: sigmoid), kept for backward
  float* row_loss = nullptr;     // (n)
  double* mean_loss = nullptr;   // (1)
  int* bad_row = nullptr;        // (1): -1, or the first row whose label is outside [0, k)
};

// prob, row_loss and mean_loss from logits and labels; *bad_row must be -1 before the launch
// (a row with either label outside [0, k) is bad).
void xent_forward_launch(const XentArgs& a, cudaStream_t stream);
// dlogits = (prob - target) * scale / n (bce: / (n k)), target = (1 - eps) (mix onehot(label) +
// (1 - mix) onehot(mixed)) + eps / k, thresholded for bce.
void xent_backward_launch(const XentArgs& a, float* dlogits, float scale, cudaStream_t stream);

}  // namespace rt::cuda

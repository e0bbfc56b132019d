// The emulated cuDNN's descriptors and the helpers its two sources share (cudnn.cc: descriptors,
// convolution, bias; cudnn_bn.cc: batch norm).
#pragma once
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>

#include "tests/cuda_emu/elements.h"

// A handle: the stream its work is queued on (0 until cudnnSetStream, as cuDNN's).
struct cudnnContext {
  cudaStream_t stream = nullptr;
};
struct cudnnTensorStruct {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  bool nhwc = false;
  int n = 0, c = 0, h = 0, w = 0;
  int64_t at(int b, int ch, int y, int x) const {
    return nhwc ? ((int64_t(b) * h + y) * w + x) * c + ch : ((int64_t(b) * c + ch) * h + y) * w + x;
  }
  int64_t count() const { return int64_t(n) * c * h * w; }
};
struct cudnnFilterStruct : cudnnTensorStruct {};  // n = k (outputs), c = inputs, h x w kernel
struct cudnnConvolutionStruct {
  int pad_h = 0, pad_w = 0, u = 1, v = 1, dil_h = 1, dil_w = 1;
  int groups = 1;  // the filter's c is the input's c / groups
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace rt_emu {

inline cudnnStatus_t set_tensor(cudnnTensorStruct* t, cudnnTensorFormat_t f,
                                cudnnDataType_t type, int n, int c, int h, int w) {
  if (!t || n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  if (int64_t(n) * c * h * w > INT32_MAX) return CUDNN_STATUS_NOT_SUPPORTED;  // 2 Gi elements
  if (f != CUDNN_TENSOR_NCHW && f != CUDNN_TENSOR_NHWC) return CUDNN_STATUS_NOT_SUPPORTED;
  if (type != CUDNN_DATA_FLOAT && type != CUDNN_DATA_HALF && type != CUDNN_DATA_BFLOAT16)
    return CUDNN_STATUS_NOT_SUPPORTED;
  t->type = type;
  t->nhwc = f == CUDNN_TENSOR_NHWC;
  t->n = n, t->c = c, t->h = h, t->w = w;
  return CUDNN_STATUS_SUCCESS;
}

inline float scalar(const void* p) { return *static_cast<const float*>(p); }

// Backward-data algorithm searches (heuristic or timed) this process has asked for (tests).
int64_t bwd_data_algo_queries();
// On: the convolution algorithm rankings put two decoys first (cudnn.cc), which a choice must
// pass over. Off by default; process-wide.
void offer_decoy_algorithms(bool on);
// On: the rankings list algorithm 0 twice, the second time under the other math type (tensor-op
// math, or default math for a tensor-op descriptor), as cuDNN's heuristics list an algorithm's
// versions. Off by default; process-wide.
void list_algorithms_twice(bool on);
// On: the rankings put first an algorithm that the workspace queries accept and the calls refuse
// with `refusal` (cudnn.cc), leaving the device faulted with `fault` unless it is cudaSuccess
// (rt_emu::set_device_fault; off clears it). Off by default; process-wide.
void offer_unrunnable_algorithm(bool on, cudnnStatus_t refusal = CUDNN_STATUS_NOT_SUPPORTED,
                                cudaError_t fault = cudaSuccess);

// On: no convolution ranking, workspace query or call takes 16-bit NHWC data whose channels are
// not a multiple of 8 (CUDNN_STATUS_NOT_SUPPORTED), as a cuDNN without kernels for the 3-channel
// stem in that layout would answer; at_run_only: the rankings and queries take it and only the
// calls refuse, as a heuristic choice would find out. Off by default; process-wide.
void refuse_unaligned_channels(bool on, bool at_run_only = false);

// Each on for a scope (a test's), off again at its end.
struct DecoyAlgorithms {
  DecoyAlgorithms() { offer_decoy_algorithms(true); }
  ~DecoyAlgorithms() { offer_decoy_algorithms(false); }
};
struct AlgorithmsListedTwice {
  AlgorithmsListedTwice() { list_algorithms_twice(true); }
  ~AlgorithmsListedTwice() { list_algorithms_twice(false); }
};
struct UnalignedChannelsRefused {
  explicit UnalignedChannelsRefused(bool at_run_only = false) {
    refuse_unaligned_channels(true, at_run_only);
  }
  ~UnalignedChannelsRefused() { refuse_unaligned_channels(false); }
};
struct UnrunnableAlgorithm {
  explicit UnrunnableAlgorithm(cudnnStatus_t refusal = CUDNN_STATUS_NOT_SUPPORTED,
                               cudaError_t fault = cudaSuccess) {
    offer_unrunnable_algorithm(true, refusal, fault);
  }
  ~UnrunnableAlgorithm() { offer_unrunnable_algorithm(false); }
};

}  // namespace rt_emu

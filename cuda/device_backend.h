// What the CUDA backends share: the context (stream, handles, workspace), where a Net's memory
// lives (device memory for activations and the fp32 arena alike) and the step's passes over the
// arena on the device (the fused SGD, the gradient scale-and-check). The backends add their
// activation layout and op factories.
#pragma once
#include <memory>
#include <vector>

#include "cuda/context.h"
#include "cuda/cudnn_batchnorm.h"  // SharedScratch
#include "cuda/memory.h"
#include "cuda/memory_spaces.h"
#include "nn/ops.h"

namespace rt::cuda {

class DeviceBackend : public Backend<float> {
 public:
  explicit DeviceBackend(const ContextConfig& cfg)
      : ctx_(cfg), device_(ctx_.stream()) {}
  ~DeviceBackend() override { cudaStreamSynchronize(ctx_.stream()); }

  const MemorySpace* act_memory() const override { return &device_; }
  const MemorySpace* param_memory() const override { return &device_; }
  void sync() const override;
  void* stream() const override { return ctx_.stream(); }

  // The fused device SGD (cuda/sgd.h), LARS included, equal to the CPU's Sgd<float> bit for bit.
  std::unique_ptr<Optimizer<float>> make_sgd(std::vector<ParamInfo> layout, SgdConfig cfg) override;
  // One kernel scales and flags; only a flagged buffer is counted (on a host copy, a rare path).
  size_t scale_count_nonfinite(float* v, size_t n, float s, bool count) override;

 protected:
  // Ops keep references to these: a Net destroys its ops and buffers before its backend.
  CudaContext ctx_;
  SharedScratch scratch_;  // batch norm's shared scratch
  DeviceMemorySpace device_;

 private:
  DeviceBuffer flag_{sizeof(int)};  // scale_count_nonfinite's "saw inf or NaN"
};

}  // namespace rt::cuda

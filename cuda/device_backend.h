// What the CUDA backends share: the context (stream, handles, workspace), where a Net's memory
// lives (device memory for activations and the fp32 arena alike) and the step's passes over the
// arena on the device (the fused SGD, the gradient scale-and-check). The backends add their
// activation layout and op factories.
#pragma once
#include <memory>
#include <vector>

#include "cuda/context.h"
#include "cuda/cudnn_batchnorm.h"  // SharedScratch
#include "cuda/input_stage.h"
#include "cuda/kernels.h"          // Elem
#include "cuda/memory.h"
#include "cuda/memory_spaces.h"
#include "nn/ops.h"

namespace rt::cuda {

class DeviceBackend : public Backend<float> {
 public:
  explicit DeviceBackend(const ContextConfig& cfg)
      : ctx_(cfg), device_(ctx_.stream()) {}
  ~DeviceBackend() override;

  const MemorySpace* act_memory() const override { return &device_; }
  const MemorySpace* param_memory() const override { return &device_; }
  void sync() const override;
  void* stream() const override { return ctx_.stream(); }
  // Two timing events on the compute stream, created at the first mark.
  void mark_compute(int which) override;
  double compute_seconds() const override;

  // The fused device SGD (cuda/sgd.h), LARS included, equal to the CPU's Sgd<float> bit for bit.
  std::unique_ptr<Optimizer<float>> make_sgd(std::vector<ParamInfo> layout, SgdConfig cfg) override;
  // One kernel scales and flags; only a flagged buffer is counted (on a host copy, a rare path).
  size_t scale_count_nonfinite(float* v, size_t n, float s, bool count) override;
  // One kernel, queued after the step's optimizer update.
  void ema_update(float* avg, const float* x, size_t n, float w) const override {
    cuda::ema_update(avg, x, n, w, ctx_.stream());
  }
  // One kernel for the chunks' sums; the host adds them up (a sync: the caller needs the value).
  double sum_squares(const float* v, size_t n) const override;
  // The next batch's copy runs on a stream of its own while the current step computes.
  bool can_stage_input() const override { return true; }
  void stage_input(const void* host, size_t bytes) override { input_.stage(host, bytes); }
  HostMemory* input_memory() const override { return &pinned_memory(ctx_.config().device); }
  const CudaContext& context() const { return ctx_; }
  // How the convolution algorithms were chosen: timed or heuristic, shapes and layers, and what
  // the algorithm cache file gave and took.
  std::string setup_note() const override;

 protected:
  // The 8-bit input (s.n images, NHWC RGB) normalized on the device into dst as `out`: fp32 NCHW
  // or 16-bit NHWC. Reads the staged copy when there is one; else uploads the bytes (a quarter of
  // the floats) into a buffer sized at the first call, and waits, as the caller reuses its host
  // batch next. The kernel rounds the product and the sum separately (the host rounds once,
  // nn/normalize.h): the two agree within 1 ulp of fp32.
  void import_u8(const uint8_t* nhwc, const Shape& s, const NormParams& p, Elem out, void* dst) const;

  // Ops keep references to these: a Net destroys its ops and buffers before its backend.
  CudaContext ctx_;
  SharedScratch scratch_;  // batch norm's shared scratch
  DeviceMemorySpace device_;
  mutable InputStage input_{ctx_.stream()};  // taken from by the (const) imports

 private:
  DeviceBuffer flag_{sizeof(int)};  // scale_count_nonfinite's "saw inf or NaN"
  mutable DeviceBuffer u8_upload_;   // import_u8's bytes when nothing was staged
  mutable DeviceBuffer squares_;     // sum_squares' chunk sums (sized at the first call) ...
  mutable std::vector<double> squares_host_;  // ... and their copy on the host
  cudaEvent_t marks_[2] = {};
  bool marked_[2] = {};  // since the last mark_compute(0)
};

}  // namespace rt::cuda

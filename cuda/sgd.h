// SGD with momentum, Nesterov, masked weight decay and LARS on the device: Sgd<float>'s semantics
// and rounding (nn/optimizer.h) in one fused kernel over the flat arena (LARS adds two small ones);
// AdamW and LAMB as Adam<float> (nn/adam.h) computes them, by optimizer.kind.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/memory.h"
#include "cuda/sgd_kernel.h"
#include "nn/adam.h"
#include "nn/optimizer.h"

namespace rt::cuda {

class DeviceSgd {
 public:
  // Uploads the segment list (and LARS's tensor list) and allocates the zeroed momentum buffer
  // (and LARS's scratch): the only allocations. Throws rt::Error for a bad layout or config.
  DeviceSgd(const std::vector<ParamInfo>& layout, SgdConfig cfg);

  // One update of params (device, in place) from grads (device), laid out as `layout`;
  // asynchronous on stream. lr finite and >= 0 (throws rt::Error otherwise).
  void step(float* params, const float* grads, double lr, cudaStream_t stream);

  // Momentum buffer on the device, laid out like the parameters (elements: size()); Adam's first
  // moment; its second (nullptr for SGD).
  float* momentum() { return momentum_.as<float>(); }
  float* second_moment() { return second_.as<float>(); }
  bool has_second_moment() const { return cfg_.kind != OptimizerKind::sgd; }
  size_t size() const { return size_; }
  int64_t steps() const { return steps_; }
  // Restores state saved from the CPU optimizer or a checkpoint (host data, size() elements).
  void restore(const float* host_momentum, size_t n, int64_t steps);
  void restore_second_moment(const float* host, size_t n);
  // AdamW, LAMB: each tensor's update count (nn/adam.h AdamStepCounts), as Adam<T>'s. restore()
  // gives every tensor the restored step count; restore_tensor_steps then sets them apart (it
  // uploads the segment list again, with their groups).
  std::vector<int64_t> tensor_steps() const;
  void restore_tensor_steps(std::span<const int64_t> counts);
  // Σp² and Σgrad² of every segment (sgd_segments' order, two each) as the last LARS step
  // summed them; empty without LARS. Waits for the device. For tests.
  std::vector<double> lars_segment_sums() const;

 private:
  SgdConfig cfg_;
  size_t size_ = 0;
  uint64_t num_segments_ = 0;
  DeviceBuffer segments_, momentum_, second_;
  uint32_t num_lars_ = 0;
  DeviceBuffer lars_, lars_sums_, segment_scale_;
  int64_t steps_ = 0;
  std::vector<ParamInfo> layout_;
  AdamStepCounts counts_;  // AdamW's and LAMB's; the segments carry each tensor's group
};

// DeviceSgd as the trainer's rt::Optimizer<float> (Backend::make_sgd of the CUDA backend): steps
// are queued on `stream`; momentum() waits for it and copies the buffer out.
class DeviceSgdOptimizer final : public Optimizer<float> {
 public:
  DeviceSgdOptimizer(const std::vector<ParamInfo>& layout, SgdConfig cfg, cudaStream_t stream)
      : sgd_(layout, cfg), stream_(stream) {}
  void step(float* params, const float* grads, double lr) override {
    sgd_.step(params, grads, lr, stream_);
  }
  std::span<const float> momentum() const override;
  int64_t steps() const override { return sgd_.steps(); }
  void restore(std::span<const float> momentum, int64_t steps) override;
  size_t size() const override { return sgd_.size(); }
  std::span<const float> second_moment() const override;
  void restore_second_moment(std::span<const float> v) override;
  std::vector<int64_t> tensor_steps() const override { return sgd_.tensor_steps(); }
  void restore_tensor_steps(std::span<const int64_t> counts) override;

 private:
  DeviceSgd sgd_;
  cudaStream_t stream_;
  mutable std::vector<float> host_, host_second_;  // momentum() and second_moment() copies
};

}  // namespace rt::cuda

// DeviceSgd: set-up (segments, momentum buffer) and the per-step launch.
#include "cuda/sgd.h"

#include <cmath>

#include "cuda/check.h"
#include "cuda/sgd_plan.h"
#include "nn/adam.h"

namespace rt::cuda {

static_assert(kAdamGroups == kAdamMaxGroups, "the kernel's groups are Adam<T>'s");

DeviceSgd::DeviceSgd(const std::vector<ParamInfo>& layout, SgdConfig cfg)
    : cfg_(cfg), layout_(layout), counts_(layout, cfg) {
  const std::vector<SgdSegment> segs = sgd_segments(layout, cfg_);
  size_ = sgd_buffer_elems(layout);
  num_segments_ = segs.size();
  segments_ = DeviceBuffer(segs.size() * sizeof(SgdSegment));
  segments_.upload(segs.data(), segs.size() * sizeof(SgdSegment));
  momentum_ = DeviceBuffer(size_ * sizeof(float));
  momentum_.zero();
  if (has_second_moment()) {
    second_ = DeviceBuffer(size_ * sizeof(float));
    second_.zero();
  }
  const std::vector<LarsTensor> lars = lars_tensors(layout, cfg_);
  if (!lars.empty()) {
    num_lars_ = uint32_t(lars.size());
    lars_ = DeviceBuffer(lars.size() * sizeof(LarsTensor));
    lars_.upload(lars.data(), lars.size() * sizeof(LarsTensor));
  }
  // LAMB's kernels sum every segment and scale each by its ratio even where no tensor takes one
  // (only BN and bias trained, and excluded): the buffers then too.
  if (!lars.empty() || (cfg_.kind == OptimizerKind::lamb && !segs.empty())) {
    lars_sums_ = DeviceBuffer(2 * segs.size() * sizeof(double));
    // Segments of tensors LARS leaves alone keep the factor 1 for good.
    const std::vector<float> ones(segs.size(), 1.0f);
    segment_scale_ = DeviceBuffer(segs.size() * sizeof(float));
    segment_scale_.upload(ones.data(), ones.size() * sizeof(float));
  }
}

void DeviceSgd::step(float* params, const float* grads, double lr, cudaStream_t stream) {
  if (!(lr >= 0) || !std::isfinite(lr))
    throw Error(str_cat("cuda sgd: learning rate must be finite and >= 0, got ", lr));
  SgdStepArgs a;
  a.params = params;
  a.grads = grads;
  a.momentum = momentum_.as<float>();
  a.segments = segments_.as<SgdSegment>();
  a.num_segments = num_segments_;
  a.lr = float(lr);
  a.lr_d = lr;
  a.momentum_coef = float(cfg_.momentum);
  a.first = steps_ == 0;
  a.nesterov = cfg_.nesterov;
  a.lars = lars_.as<LarsTensor>();
  a.num_lars = num_lars_;
  a.lars_sums = lars_sums_.as<double>();
  a.segment_scale = segment_scale_.as<float>();
  a.lars_trust = cfg_.lars_trust;
  a.lars_eps = cfg_.lars_eps;
  if (has_second_moment()) {
    a.adam = cfg_.kind == OptimizerKind::adamw ? 1 : 2;
    a.second = second_.as<float>();
    for (size_t g = 0; g < counts_.lags().size(); ++g) {  // each group's tensors from their own count
      const AdamScalars<float> s(cfg_, steps_ + 1 - counts_.lags()[g]);
      a.w1 = s.w1, a.b2 = s.b2, a.w2 = s.w2, a.eps = s.eps;
      a.bias[g] = {s.bc1, s.bc2_root, s.bc1_d};
    }
  }
  sgd_step_launch(a, stream);
  ++steps_;
}

void DeviceSgd::restore(const float* host_momentum, size_t n, int64_t steps) {
  if (n != size_)
    throw Error(str_cat("cuda sgd: restoring a momentum buffer of ", n,
                        " elements into an optimizer of ", size_));
  if (steps < 0) throw Error(str_cat("cuda sgd: restoring a negative step count ", steps));
  momentum_.upload(host_momentum, n * sizeof(float));
  steps_ = steps;
  if (has_second_moment()) restore_tensor_steps(std::vector<int64_t>(layout_.size(), steps));
}

std::vector<int64_t> DeviceSgd::tensor_steps() const {
  return has_second_moment() ? counts_.at(steps_) : std::vector<int64_t>{};
}

void DeviceSgd::restore_tensor_steps(std::span<const int64_t> counts) {
  if (!has_second_moment()) {
    if (counts.empty()) return;
    throw Error("cuda sgd: restoring per-tensor step counts into an optimizer without them (sgd)");
  }
  counts_.restore(counts, steps_);
  const std::vector<SgdSegment> segs = sgd_segments(layout_, cfg_, kSgdSegmentElems, counts_.groups());
  segments_.upload(segs.data(), segs.size() * sizeof(SgdSegment));  // the same count: the same buffer
}

void DeviceSgd::restore_second_moment(const float* host, size_t n) {
  if (!has_second_moment()) {
    if (n == 0) return;
    throw Error("cuda sgd: restoring a second moment into an optimizer without one (sgd)");
  }
  if (n != size_)
    throw Error(str_cat("cuda ", optimizer_kind_name(cfg_.kind), ": restoring a second moment of ", n,
                        " elements into an optimizer of ", size_));
  second_.upload(host, n * sizeof(float));
}

std::vector<double> DeviceSgd::lars_segment_sums() const {
  if (num_lars_ == 0) return {};
  std::vector<double> sums(2 * num_segments_);
  CUDA_CHECK(cudaDeviceSynchronize());  // the step may be queued on any stream
  lars_sums_.download(sums.data(), sums.size() * sizeof(double));
  return sums;
}

std::span<const float> DeviceSgdOptimizer::momentum() const {
  host_.resize(sgd_.size());
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  CUDA_CHECK(cudaMemcpy(host_.data(), const_cast<DeviceSgd&>(sgd_).momentum(), host_.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  return {host_.data(), host_.size()};
}

void DeviceSgdOptimizer::restore(std::span<const float> momentum, int64_t steps) {
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // no queued step may run over the restored state
  sgd_.restore(momentum.data(), momentum.size(), steps);
}


std::span<const float> DeviceSgdOptimizer::second_moment() const {
  if (!sgd_.has_second_moment()) return {};
  host_second_.resize(sgd_.size());
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  CUDA_CHECK(cudaMemcpy(host_second_.data(), const_cast<DeviceSgd&>(sgd_).second_moment(),
                        host_second_.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return {host_second_.data(), host_second_.size()};
}

void DeviceSgdOptimizer::restore_tensor_steps(std::span<const int64_t> counts) {
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // the segment list is read by queued steps
  sgd_.restore_tensor_steps(counts);
}

void DeviceSgdOptimizer::restore_second_moment(std::span<const float> v) {
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  sgd_.restore_second_moment(v.data(), v.size());
}

}  // namespace rt::cuda

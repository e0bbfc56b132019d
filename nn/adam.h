// AdamW and LAMB over the flat parameter arena, on the host: the element arithmetic the device
// optimizer (cuda/sgd.cu) repeats operation for operation.
//
// AdamW (Loshchilov & Hutter 2019), torch.optim.AdamW's update, at step t with wd the tensor's
// weight decay (0 for BN and bias unless decay_bn_and_bias):
//   p  = p · (1 − lr·wd)
//   m  = m + (1 − β1)·(g − m)              v = β2·v + (1 − β2)·g²
//   p  = p − lr / (1 − β1^t) · m / (√v / √(1 − β2^t) + eps)
// LAMB (You et al. 2020, as timm's Lamb without its built-in clipping: train.clip_grad_norm
// does that), the same moments, then per tensor
//   u  = (m / (1 − β1^t)) / (√v / √(1 − β2^t) + eps) + wd·p
//   s  = ‖p‖ / ‖u‖   (1 where a norm is 0, or for BN and bias under lars_exclude_bn_and_bias)
//   p  = p − lr · (s · u)
// Norms are summed in double per chunk in a GPU warp's order and combined in layout order, so
// results are the same for any thread count, and the device's. Scalars (1 − lr·wd, lr / (1 −
// β1^t), √(1 − β2^t)) are computed in double and rounded once to T.
#pragma once
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nn/optimizer.h"

namespace rt {

// The per-step scalars of step t (1-based), each computed in double and rounded once to T; the
// device optimizer takes the same ones.
template <class T>
struct AdamScalars {
  T w1, b2, w2;       // 1 − β1, β2, 1 − β2
  T bc1, bc2_root;    // 1 − β1^t, √(1 − β2^t)
  T eps;
  double bc1_d;       // 1 − β1^t unrounded
  AdamScalars(const SgdConfig& c, int64_t t) {
    bc1_d = 1.0 - std::pow(c.beta1, double(t));
    const double bc2_d = 1.0 - std::pow(c.beta2, double(t));
    w1 = T(1.0 - c.beta1);
    b2 = T(c.beta2);
    w2 = T(1.0 - c.beta2);
    bc1 = T(bc1_d);
    bc2_root = T(std::sqrt(bc2_d));
    eps = T(c.eps);
  }
};
// Per tensor, from its rate lr_t (the step's lr times its lr_mult, in double): AdamW's factor
// 1 − lr_t·wd and step size lr_t / (1 − β1^t), each rounded once.
template <class T>
T adamw_decay(double lr_t, T weight_decay) {
  return T(1.0 - lr_t * double(weight_decay));
}
template <class T>
T adamw_step_size(double lr_t, const AdamScalars<T>& s) {
  return T(lr_t / s.bc1_d);
}

// Bias corrections count each tensor's own updates, as torch.optim's per-parameter "step": a
// tensor trained only from some resume on (a layer unfrozen) starts its count at 1 while the
// others go on. Within a run every trained tensor is updated at every step, so each count is the
// optimizer's step count less a lag fixed at restore; the distinct lags, few, are groups whose
// scalars each step computes once (the device kernel takes them as arguments). Adam<T> and the
// device optimizer (cuda/sgd.h) both keep their counts in one of these.
constexpr size_t kAdamMaxGroups = 8;
class AdamStepCounts {
 public:
  // Every tensor of `layout` (frozen by cfg.freeze or not) at 0 updates, the optimizer at 0 steps.
  AdamStepCounts(const std::vector<ParamInfo>& layout, const SgdConfig& cfg);
  // Each tensor's update count (layout order) when the optimizer has taken `steps` steps. Throws
  // rt::Error for a count outside [0, steps] or more than kAdamMaxGroups lags.
  void restore(std::span<const int64_t> counts, int64_t steps);
  // The counts after `steps` steps: a trained tensor has gained those since the restore.
  std::vector<int64_t> at(int64_t steps) const;
  const std::vector<uint8_t>& groups() const { return group_; }  // per tensor; 0 for frozen ones
  const std::vector<int64_t>& lags() const { return lag_; }  // per group: steps not updated

 private:
  std::vector<std::string> names_;  // for messages
  std::vector<char> frozen_;
  const char* kind_;
  std::vector<int64_t> counts0_;  // at the last restore, and the optimizer's steps then
  int64_t steps0_ = 0;
  std::vector<uint8_t> group_;
  std::vector<int64_t> lag_;
};

template <class T>
class Adam final : public Optimizer<T> {
 public:
  // cfg.kind adamw or lamb; the moments are allocated here, zeroed, sized like the arena's
  // buffers. Throws rt::Error for a bad layout or config.
  Adam(std::vector<ParamInfo> layout, SgdConfig cfg);
  void step(T* params, const T* grads, double lr) override;
  std::span<const T> momentum() const override { return {m_.data(), m_.size()}; }
  std::span<const T> second_moment() const override { return {v_.data(), v_.size()}; }
  int64_t steps() const override { return steps_; }
  void restore(std::span<const T> momentum, int64_t steps) override;
  void restore_second_moment(std::span<const T> v) override;
  std::vector<int64_t> tensor_steps() const override { return counts_.at(steps_); }
  void restore_tensor_steps(std::span<const int64_t> counts) override { counts_.restore(counts, steps_); }
  size_t size() const override { return m_.size(); }
  // LAMB's trust ratio s of each tensor (layout order) in the last step; 1 elsewhere.
  std::span<const double> trust_ratios() const { return {trust_.data(), trust_.size()}; }

 private:
  std::vector<ParamInfo> layout_;
  SgdConfig cfg_;
  Buffer<T> m_, v_;
  std::vector<T> decay_;        // per tensor: wd, or 0 when excluded from decay
  std::vector<double> lr_mult_; // per tensor: its learning-rate factor
  std::vector<char> adapt_;     // per tensor: LAMB scales it by its trust ratio
  std::vector<double> trust_;
  std::vector<OptimizerChunk> chunks_;
  std::vector<double> partial_;  // LAMB: per chunk Σp², Σu²
  int64_t steps_ = 0;
  AdamStepCounts counts_;
  std::vector<AdamScalars<T>> scalars_;  // per group, this step's
};

extern template class Adam<float>;
extern template class Adam<double>;

}  // namespace rt

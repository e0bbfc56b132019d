// SGD with momentum, Nesterov, weight decay and LARS, applied in one pass over the flat arena;
// the optimizer interface and the settings AdamW and LAMB (nn/adam.h) share with it.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "nn/arena.h"
#include "nn/error.h"
#include "nn/tensor.h"

namespace rt {

// Which update: SGD (with momentum, Nesterov, LARS) here; AdamW and LAMB in nn/adam.h.
enum class OptimizerKind : uint8_t { sgd, adamw, lamb };
const char* optimizer_kind_name(OptimizerKind k);

// The optimizer's settings (the name predates AdamW and LAMB: all three read them).
struct SgdConfig {
  OptimizerKind kind = OptimizerKind::sgd;
  double momentum = 0.9;                 // μ; 0 turns the update into plain SGD
  bool nesterov = false;                 // Nesterov momentum in PyTorch's form; needs μ > 0
  double weight_decay = 1e-4;            // L2 coefficient wd, added to the gradient as wd·p
  bool decay_bn_and_bias = true;         // false: BN γ/β and biases get no weight decay
  bool lars = false;                     // layer-wise adaptive rate scaling (You et al. 2017)
  double lars_trust = 0.001;             // trust coefficient η
  double lars_eps = 1e-9;                // keeps the trust ratio finite for tiny norms
  bool lars_exclude_bn_and_bias = true;  // BN γ/β and biases use the plain global lr
  std::vector<std::string> freeze;       // names (or prefixes at a '.': "layer1" is every
                                         //   layer1.* tensor) of tensors left as they are
  // Per-tensor learning-rate factors (fine-tuning's new head at 10x, say): a name or prefix at
  // a '.', as freeze, and its factor (>= 0); the longest matching entry wins, 1 where none does.
  std::vector<std::pair<std::string, double>> lr_mult;
  double beta1 = 0.9, beta2 = 0.999;     // AdamW, LAMB: the moments' decay rates
  double eps = 1e-8;                     // AdamW, LAMB: added to the second moment's root
                                         // (LAMB's trust ratio skips BN and bias as LARS's does,
                                         //  lars_exclude_bn_and_bias)
};

// Whether one freeze entry names the tensor `name`: equal to it, or it followed by '.'.
bool freeze_entry_matches(const std::string& entry, const std::string& name);
// Whether any of cfg.freeze does. A frozen tensor gets no update, decay or momentum (its momentum
// stays 0), as PyTorch leaves a parameter with requires_grad false or out of the optimizer's groups.
bool sgd_frozen(const SgdConfig& cfg, const std::string& name);

// Throws rt::Error naming the field when a value is out of range (negative coefficients,
// Nesterov without momentum, betas outside [0, 1), LARS with AdamW or LAMB).
void sgd_validate(const SgdConfig& cfg);

// The flat arena cut into the optimizers' units of work: pieces of at most kOptimizerChunk
// elements of one tensor, in layout order, frozen tensors left out. Fixed-size (not derived from
// the thread count), so norms summed per chunk and combined in order are the same for any number
// of threads. Throws rt::Error (naming `who`) for a layout that is not sorted and disjoint.
constexpr size_t kOptimizerChunk = 4096;
struct OptimizerChunk {
  size_t tensor, begin, end;
};
std::vector<OptimizerChunk> optimizer_chunks(const std::vector<ParamInfo>& layout, const SgdConfig& cfg,
                                             const char* who);
// Elements of an optimizer buffer laid out like the arena (each tensor rounded up to 64 bytes).
size_t optimizer_buffer_elems(const std::vector<ParamInfo>& layout, size_t elem_bytes);
// A tensor's weight decay: 0 for BN and bias when decay_bn_and_bias is false.
double optimizer_weight_decay(const ParamInfo& p, const SgdConfig& cfg);
// A tensor's learning-rate factor (cfg.lr_mult; 1 where no entry names it). The step's rate for
// it is rounded once from lr · factor in double, on the host and the device alike.
double optimizer_lr_mult(const SgdConfig& cfg, const std::string& name);

// An optimizer over the flat parameter and gradient buffers, on the memory its backend keeps them
// in (Backend::make_sgd): the host here, the device for the CUDA backend.
template <class T>
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of params (in place) from grads; both laid out as the arena's layout(). lr finite
  // and >= 0 (throws rt::Error otherwise). A device optimizer only queues the work.
  virtual void step(T* params, const T* grads, double lr) = 0;
  // Momentum buffer laid out like the parameters, read on the host (checkpoints, tests); a
  // device optimizer copies it out, waiting for its queued work.
  virtual std::span<const T> momentum() const = 0;
  // Number of step() calls so far; 0 means the next step initialises the momentum buffer.
  virtual int64_t steps() const = 0;
  // Restores state saved from momentum() and steps(); throws rt::Error on a size mismatch or a
  // negative step count.
  virtual void restore(std::span<const T> momentum, int64_t steps) = 0;
  virtual size_t size() const = 0;  // elements of the momentum buffer (= the arena's buffers)
  // AdamW's and LAMB's second moment, laid out like the parameters (momentum() is their first);
  // empty for SGD. Read and restored as momentum() is.
  virtual std::span<const T> second_moment() const { return {}; }
  virtual void restore_second_moment(std::span<const T> v) {
    if (!v.empty()) throw Error("optimizer: restoring a second moment into an optimizer without one (sgd)");
  }
  // AdamW and LAMB: how many updates each tensor (layout order) has had, which their bias
  // corrections count (nn/adam.h AdamStepCounts); empty for SGD. Restored after restore(), which
  // alone gives every tensor the restored step count.
  virtual std::vector<int64_t> tensor_steps() const { return {}; }
  virtual void restore_tensor_steps(std::span<const int64_t> counts) {
    if (!counts.empty()) throw Error("optimizer: restoring per-tensor step counts into an optimizer without them (sgd)");
  }
};

// Σv[k][i]² over i < n for each of K arrays, in double, in a GPU warp's order: 32 interleaved
// sums (element i into sum i mod 32, in order), then combined pairwise, sum l with sum l + 16,
// then + 8, + 4, + 2, + 1 (a butterfly of shuffles). The order of LARS's norms (per chunk of
// ≤ 4096, lars_chunk_squares) and of Backend::sum_squares' chunks (train.clip_grad_norm), which
// the CUDA kernels reproduce; the 32 independent sums also vectorise where one running sum could
// not, and K arrays in one pass (LARS's parameters and gradients) read each chunk once.
template <class T, size_t K>
std::array<double, K> warp_order_squares(const std::array<const T*, K>& v, size_t n) {
  constexpr size_t kLanes = 32;
  double lane[K][kLanes] = {};
  for (size_t i = 0; i < n; i += kLanes)
    for (size_t l = 0; l < std::min(kLanes, n - i); ++l)
      for (size_t k = 0; k < K; ++k) lane[k][l] += double(v[k][i + l]) * double(v[k][i + l]);
  std::array<double, K> out;
  for (size_t k = 0; k < K; ++k) {
    for (size_t off = kLanes / 2; off > 0; off /= 2)
      for (size_t l = 0; l < off; ++l) lane[k][l] += lane[k][l + off];
    out[k] = lane[k][0];
  }
  return out;
}
// Σp² and Σgrad² so: what Sgd<T> sums for each chunk under LARS.
template <class T>
void lars_chunk_squares(const T* p, const T* grad, size_t n, double* w2, double* g2);

// Stochastic gradient descent over one flat parameter buffer and its gradient buffer, with
// exactly torch.optim.SGD's semantics (dampening 0). Per tensor, with wd = weight_decay unless
// the tensor is excluded from decay (then 0) and s = 1 unless LARS applies to it:
//
//   g   = (grad + wd·p) · s
//   buf = g                  on the first step,   buf = μ·buf + g   afterwards
//   g   = g + μ·buf          if nesterov,         g   = buf         otherwise
//   p  -= lr · g
//
// LARS (You, Gitman, Ginsburg 2017, as in NVIDIA's MLPerf ResNet):
//   s = η·‖p‖ / (‖grad‖ + wd·‖p‖ + eps),   or 1 when ‖p‖ or ‖grad‖ is 0.
// Norms are accumulated in double over fixed-size chunks combined in order, so results are
// bitwise identical for any number of OpenMP threads (and to the GPU optimizer's: inside a chunk
// the order is a warp's, lars_chunk_squares above).
//
// Only the elements [offset, offset + count) of each tensor are read or written: alignment
// padding in the parameter buffer (and in the momentum buffer) stays as it is, i.e. zero.
template <class T>
class Sgd final : public Optimizer<T> {
 public:
  // layout: the arena's layout() (sorted by offset, non-overlapping; throws rt::Error otherwise).
  // The momentum buffer is allocated here, zeroed, with the same size as the arena's buffers.
  Sgd(std::vector<ParamInfo> layout, SgdConfig cfg);

  // One update of params (in place) from grads; both point at buffers laid out as `layout`.
  // lr is the global learning rate for this step (finite, >= 0; throws rt::Error otherwise).
  void step(T* params, const T* grads, double lr) override;

  // Momentum buffer, laid out like the parameters (for checkpoints).
  std::span<T> momentum() { return {momentum_.data(), momentum_.size()}; }
  std::span<const T> momentum() const override { return {momentum_.data(), momentum_.size()}; }
  int64_t steps() const override { return steps_; }
  void restore(std::span<const T> momentum, int64_t steps) override;

  // LARS trust ratio s of each tensor (in layout order) in the last step; 1 where LARS did not
  // apply. For logging.
  std::span<const double> trust_ratios() const { return {trust_.data(), trust_.size()}; }

  const SgdConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& layout() const { return layout_; }
  size_t size() const override { return momentum_.size(); }

 private:
  void compute_trust_ratios(const T* params, const T* grads);

  std::vector<ParamInfo> layout_;
  SgdConfig cfg_;
  Buffer<T> momentum_;
  std::vector<T> decay_;         // per tensor: wd, or 0 when excluded from decay
  std::vector<double> lr_mult_;  // per tensor: its learning-rate factor
  std::vector<char> lars_;       // per tensor: whether LARS scales it
  std::vector<double> trust_;    // per tensor: s of the last step
  std::vector<OptimizerChunk> chunks_;
  std::vector<double> partial_;  // per chunk: Σp², Σgrad² (LARS only)
  int64_t steps_ = 0;
};

// A host optimizer over buffers the host may not dereference (in `space`): each step copies
// parameters and gradients out, updates the copies on the host and copies the parameters back.
// Two full copies per step: Backend::make_sgd's default for a backend whose arena the host cannot
// read and that brings no optimizer of its own (the CUDA backends do).
template <class T>
class StagedOptimizer final : public Optimizer<T> {
 public:
  // space must outlive the optimizer.
  StagedOptimizer(std::unique_ptr<Optimizer<T>> host, const MemorySpace& space);
  void step(T* params, const T* grads, double lr) override;
  std::span<const T> momentum() const override { return opt_->momentum(); }
  int64_t steps() const override { return opt_->steps(); }
  void restore(std::span<const T> momentum, int64_t steps) override { opt_->restore(momentum, steps); }
  size_t size() const override { return opt_->size(); }
  std::span<const T> second_moment() const override { return opt_->second_moment(); }
  void restore_second_moment(std::span<const T> v) override { opt_->restore_second_moment(v); }
  std::vector<int64_t> tensor_steps() const override { return opt_->tensor_steps(); }
  void restore_tensor_steps(std::span<const int64_t> counts) override { opt_->restore_tensor_steps(counts); }

 private:
  std::unique_ptr<Optimizer<T>> opt_;
  const MemorySpace& space_;
  std::vector<T> params_, grads_;  // host copies, allocated once
};

// The host optimizer cfg.kind names: Sgd<T>, or Adam<T> (nn/adam.h).
template <class T>
std::unique_ptr<Optimizer<T>> make_host_optimizer(std::vector<ParamInfo> layout, const SgdConfig& cfg);

extern template class Sgd<float>;
extern template class Sgd<double>;
extern template class StagedOptimizer<float>;
extern template class StagedOptimizer<double>;

}  // namespace rt

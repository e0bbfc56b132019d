// AdamW and LAMB over the flat parameter buffer, chunked for OpenMP (see adam.h for the math).
#include "nn/adam.h"

#include <algorithm>
#include <cmath>

#include "nn/error.h"

namespace rt {

namespace {

// m and v moved to g (in place); returns √v / √(1 − β2^t) + eps.
template <class T>
inline T moments(T g, T& m, T& v, const AdamScalars<T>& s) {
  m = m + s.w1 * (g - m);
  v = s.b2 * v + s.w2 * (g * g);
  return std::sqrt(v) / s.bc2_root + s.eps;
}

template <class T>
void adamw_chunk(T* p, const T* g, T* m, T* v, size_t n, T decay, T step_size, const AdamScalars<T>& s) {
  for (size_t i = 0; i < n; ++i) {
    const T q = p[i] * decay;
    T mi = m[i], vi = v[i];
    const T den = moments(g[i], mi, vi, s);
    m[i] = mi;
    v[i] = vi;
    p[i] = q - step_size * (mi / den);
  }
}

// LAMB's update direction from the moments already moved.
template <class T>
inline T lamb_direction(T p, T m, T v, T wd, const AdamScalars<T>& s) {
  return (m / s.bc1) / (std::sqrt(v) / s.bc2_root + s.eps) + wd * p;
}

}  // namespace

AdamStepCounts::AdamStepCounts(const std::vector<ParamInfo>& layout, const SgdConfig& cfg)
    : kind_(optimizer_kind_name(cfg.kind)) {
  for (const ParamInfo& p : layout) {
    names_.push_back(p.name);
    frozen_.push_back(sgd_frozen(cfg, p.name));
  }
  restore(std::vector<int64_t>(layout.size(), 0), 0);
}

void AdamStepCounts::restore(std::span<const int64_t> counts, int64_t steps) {
  if (counts.size() != names_.size())
    throw Error(str_cat(kind_, ": ", counts.size(), " per-tensor step counts for ", names_.size(), " tensors"));
  std::vector<uint8_t> group(names_.size(), 0);
  std::vector<int64_t> lag = {0};
  for (size_t t = 0; t < names_.size(); ++t) {
    if (counts[t] < 0 || counts[t] > steps)
      throw Error(str_cat(kind_, ": tensor ", names_[t], " has ", counts[t], " updates, outside [0, ", steps,
                          "] (the optimizer's steps)"));
    if (frozen_[t]) continue;
    auto it = std::find(lag.begin(), lag.end(), steps - counts[t]);
    if (it == lag.end()) {
      if (lag.size() == kAdamMaxGroups)
        throw Error(str_cat(kind_, ": the trained tensors have more than ", kAdamMaxGroups,
                            " different update counts (each resume that unfroze layers adds one)"));
      it = lag.insert(lag.end(), steps - counts[t]);
    }
    group[t] = uint8_t(it - lag.begin());
  }
  group_ = std::move(group);
  lag_ = std::move(lag);
  counts0_.assign(counts.begin(), counts.end());
  steps0_ = steps;
}

std::vector<int64_t> AdamStepCounts::at(int64_t steps) const {
  std::vector<int64_t> out(counts0_);
  for (size_t t = 0; t < out.size(); ++t)
    if (!frozen_[t]) out[t] += steps - steps0_;
  return out;
}

template <class T>
Adam<T>::Adam(std::vector<ParamInfo> layout, SgdConfig cfg)
    : layout_(std::move(layout)), cfg_(cfg), counts_(layout_, cfg_) {
  sgd_validate(cfg_);
  const char* name = optimizer_kind_name(cfg_.kind);
  if (cfg_.kind == OptimizerKind::sgd) throw Error("adam: configured as sgd (make_host_optimizer picks)");
  chunks_ = optimizer_chunks(layout_, cfg_, name);
  for (const ParamInfo& p : layout_) {
    decay_.push_back(T(optimizer_weight_decay(p, cfg_)));
    lr_mult_.push_back(optimizer_lr_mult(cfg_, p.name));
    adapt_.push_back(cfg_.kind == OptimizerKind::lamb &&
                     !(param_is_bn_or_bias(p.kind) && cfg_.lars_exclude_bn_and_bias));
  }
  const size_t n = optimizer_buffer_elems(layout_, sizeof(T));
  m_.resize(n);
  v_.resize(n);
  trust_.assign(layout_.size(), 1.0);
  if (cfg_.kind == OptimizerKind::lamb) partial_.assign(2 * chunks_.size(), 0.0);
  scalars_.reserve(kAdamMaxGroups);
}

template <class T>
void Adam<T>::step(T* params, const T* grads, double lr) {
  if (!(lr >= 0) || !std::isfinite(lr))
    throw Error(str_cat(optimizer_kind_name(cfg_.kind), ": learning rate must be finite and >= 0, got ", lr));
  std::vector<AdamScalars<T>>& scalars = scalars_;  // per group: its tensors' own step count
  scalars.clear();                                  // (reserved: no allocation in a step)
  for (const int64_t lag : counts_.lags()) scalars.emplace_back(cfg_, steps_ + 1 - lag);
  T* m = m_.data();
  T* v = v_.data();
  const int64_t nchunks = int64_t(chunks_.size());
  if (cfg_.kind == OptimizerKind::adamw) {
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (int64_t c = 0; c < nchunks; ++c) {
      const OptimizerChunk& ch = chunks_[size_t(c)];
      const AdamScalars<T>& s = scalars[counts_.groups()[ch.tensor]];
      const double lr_t = lr * lr_mult_[ch.tensor];
      adamw_chunk(params + ch.begin, grads + ch.begin, m + ch.begin, v + ch.begin, ch.end - ch.begin,
                  adamw_decay(lr_t, decay_[ch.tensor]), adamw_step_size(lr_t, s), s);
    }
    ++steps_;
    return;
  }
  // LAMB, pass 1: the moments, and per chunk Σp² and Σu² (u into a chunk-sized scratch, so that
  // the sums take the order lars_chunk_squares gives LARS's).
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const OptimizerChunk& ch = chunks_[size_t(c)];
    const size_t n = ch.end - ch.begin;
    T u[kOptimizerChunk];
    const T wd = decay_[ch.tensor];
    const AdamScalars<T>& s = scalars[counts_.groups()[ch.tensor]];
    for (size_t i = 0; i < n; ++i) {
      const size_t k = ch.begin + i;
      moments(grads[k], m[k], v[k], s);
      u[i] = lamb_direction(params[k], m[k], v[k], wd, s);
    }
    lars_chunk_squares(params + ch.begin, u, n, &partial_[2 * size_t(c)], &partial_[2 * size_t(c) + 1]);
  }
  size_t c = 0;
  for (size_t t = 0; t < layout_.size(); ++t) {
    double w2 = 0, u2 = 0;
    for (; c < chunks_.size() && chunks_[c].tensor == t; ++c) {
      w2 += partial_[2 * c];
      u2 += partial_[2 * c + 1];
    }
    const double wn = std::sqrt(w2), un = std::sqrt(u2);
    trust_[t] = adapt_[t] && wn > 0 && un > 0 ? wn / un : 1.0;
  }
  // Pass 2: the same direction from the moved moments, scaled.
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t k = 0; k < nchunks; ++k) {
    const OptimizerChunk& ch = chunks_[size_t(k)];
    const T wd = decay_[ch.tensor], ratio = T(trust_[ch.tensor]), lr_t = T(lr * lr_mult_[ch.tensor]);
    const AdamScalars<T>& s = scalars[counts_.groups()[ch.tensor]];
    for (size_t i = ch.begin; i < ch.end; ++i)
      params[i] = params[i] - lr_t * (ratio * lamb_direction(params[i], m[i], v[i], wd, s));
  }
  ++steps_;
}

template <class T>
void Adam<T>::restore(std::span<const T> momentum, int64_t steps) {
  const char* name = optimizer_kind_name(cfg_.kind);
  if (momentum.size() != m_.size())
    throw Error(str_cat(name, ": restoring a first moment of ", momentum.size(), " elements into an optimizer of ",
                        m_.size()));
  if (steps < 0) throw Error(str_cat(name, ": restoring a negative step count ", steps));
  std::copy(momentum.begin(), momentum.end(), m_.data());
  steps_ = steps;
  counts_.restore(std::vector<int64_t>(layout_.size(), steps), steps);
}

template <class T>
void Adam<T>::restore_second_moment(std::span<const T> v) {
  if (v.size() != v_.size())
    throw Error(str_cat(optimizer_kind_name(cfg_.kind), ": restoring a second moment of ", v.size(),
                        " elements into an optimizer of ", v_.size()));
  std::copy(v.begin(), v.end(), v_.data());
}

template <class T>
std::unique_ptr<Optimizer<T>> make_host_optimizer(std::vector<ParamInfo> layout, const SgdConfig& cfg) {
  if (cfg.kind == OptimizerKind::sgd) return std::make_unique<Sgd<T>>(std::move(layout), cfg);
  return std::make_unique<Adam<T>>(std::move(layout), cfg);
}

template class Adam<float>;
template class Adam<double>;
template std::unique_ptr<Optimizer<float>> make_host_optimizer<float>(std::vector<ParamInfo>, const SgdConfig&);
template std::unique_ptr<Optimizer<double>> make_host_optimizer<double>(std::vector<ParamInfo>, const SgdConfig&);

}  // namespace rt

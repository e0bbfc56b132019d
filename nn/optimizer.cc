// SGD / LARS update over the flat parameter buffer, chunked for OpenMP.
#include "nn/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "nn/error.h"

namespace rt {

namespace {

// The elementwise update on one chunk; First and Nesterov are template parameters so the inner
// loop has no branches and vectorises.
template <class T, bool First, bool Nesterov>
void sgd_update(T* p, const T* grad, T* buf, size_t n, T wd, T s, T mu, T lr) {
  for (size_t i = 0; i < n; ++i) {
    T g = (grad[i] + wd * p[i]) * s;
    T b = First ? g : mu * buf[i] + g;
    buf[i] = b;
    T d = Nesterov ? g + mu * b : b;
    p[i] -= lr * d;
  }
}

template <class T>
void sgd_update(bool first, bool nesterov, T* p, const T* grad, T* buf, size_t n, T wd, T s, T mu,
                T lr) {
  if (first) {
    if (nesterov) sgd_update<T, true, true>(p, grad, buf, n, wd, s, mu, lr);
    else sgd_update<T, true, false>(p, grad, buf, n, wd, s, mu, lr);
  } else {
    if (nesterov) sgd_update<T, false, true>(p, grad, buf, n, wd, s, mu, lr);
    else sgd_update<T, false, false>(p, grad, buf, n, wd, s, mu, lr);
  }
}

void check_non_negative(const char* field, double v) {
  if (!(v >= 0) || !std::isfinite(v))
    throw Error(str_cat("sgd: ", field, " must be finite and >= 0, got ", v));
}

}  // namespace

const char* optimizer_kind_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::lamb: return "lamb";
  }
  return "?";
}

void sgd_validate(const SgdConfig& cfg) {
  check_non_negative("momentum", cfg.momentum);
  check_non_negative("weight_decay", cfg.weight_decay);
  check_non_negative("lars_trust", cfg.lars_trust);
  check_non_negative("lars_eps", cfg.lars_eps);
  // As in PyTorch: with μ = 0 the Nesterov form silently degenerates to plain SGD.
  if (cfg.nesterov && cfg.momentum == 0)
    throw Error("sgd: nesterov requires momentum > 0");
  for (const auto& [entry, factor] : cfg.lr_mult)
    if (!(factor >= 0) || !std::isfinite(factor) || entry.empty())
      throw Error(str_cat("lr_mult: '", entry, "' must name tensors and have a finite factor >= 0, got ", factor));
  // Adam's values are checked under SGD too: a wrong one is a mistake whichever kind runs.
  const char* name = optimizer_kind_name(cfg.kind);
  for (auto [field, v] : {std::pair<const char*, double>{"beta1", cfg.beta1}, {"beta2", cfg.beta2}})
    if (!(v >= 0 && v < 1)) throw Error(str_cat(name, ": ", field, " must be in [0, 1), got ", v));
  if (!(cfg.eps > 0) || !std::isfinite(cfg.eps)) throw Error(str_cat(name, ": eps must be finite and > 0, got ", cfg.eps));
  if (cfg.kind == OptimizerKind::sgd) return;
  if (cfg.lars) throw Error(str_cat(name, ": lars is SGD's layer-wise scaling (LAMB is Adam's)"));
  if (cfg.nesterov) throw Error(str_cat(name, ": nesterov is SGD's"));
}

std::vector<OptimizerChunk> optimizer_chunks(const std::vector<ParamInfo>& layout, const SgdConfig& cfg,
                                             const char* who) {
  std::vector<OptimizerChunk> chunks;
  size_t end = 0;
  for (size_t t = 0; t < layout.size(); ++t) {
    const ParamInfo& p = layout[t];
    if (p.offset < end)
      throw Error(str_cat(who, ": parameter ", p.name, " at offset ", p.offset, " overlaps the previous one (ends at ",
                          end, "); the layout must be sorted by offset"));
    end = p.offset + p.count;
    if (sgd_frozen(cfg, p.name)) continue;  // no chunk: never read or written
    for (size_t b = p.offset; b < end; b += kOptimizerChunk)
      chunks.push_back({t, b, std::min(b + kOptimizerChunk, end)});
  }
  return chunks;
}

size_t optimizer_buffer_elems(const std::vector<ParamInfo>& layout, size_t elem_bytes) {
  size_t end = 0;
  for (const ParamInfo& p : layout) end = std::max(end, p.offset + p.count);
  // Same size as the arena's buffers: each tensor's storage is rounded up to a cache line.
  const size_t align = std::max<size_t>(1, 64 / elem_bytes);
  return (end + align - 1) / align * align;
}

double optimizer_lr_mult(const SgdConfig& cfg, const std::string& name) {
  double mult = 1;
  size_t best = 0;
  bool found = false;
  for (const auto& [entry, factor] : cfg.lr_mult)
    if (freeze_entry_matches(entry, name) && (!found || entry.size() > best)) {
      mult = factor;
      best = entry.size();
      found = true;
    }
  return mult;
}

double optimizer_weight_decay(const ParamInfo& p, const SgdConfig& cfg) {
  return param_is_bn_or_bias(p.kind) && !cfg.decay_bn_and_bias ? 0.0 : cfg.weight_decay;
}

bool freeze_entry_matches(const std::string& entry, const std::string& name) {
  return name.compare(0, entry.size(), entry) == 0 && (name.size() == entry.size() || name[entry.size()] == '.');
}

bool sgd_frozen(const SgdConfig& cfg, const std::string& name) {
  return std::any_of(cfg.freeze.begin(), cfg.freeze.end(),
                     [&](const std::string& f) { return freeze_entry_matches(f, name); });
}

// A GPU warp's order (cuda/lars.h), which makes the device optimizer's ratios these bit for bit.
template <class T>
void lars_chunk_squares(const T* p, const T* grad, size_t n, double* w2, double* g2) {
  const auto s = warp_order_squares<T, 2>({p, grad}, n);
  *w2 = s[0];
  *g2 = s[1];
}

template void lars_chunk_squares<float>(const float*, const float*, size_t, double*, double*);
template void lars_chunk_squares<double>(const double*, const double*, size_t, double*, double*);

template <class T>
Sgd<T>::Sgd(std::vector<ParamInfo> layout, SgdConfig cfg)
    : layout_(std::move(layout)), cfg_(cfg) {
  sgd_validate(cfg_);
  if (cfg_.kind != OptimizerKind::sgd)
    throw Error(str_cat("sgd: configured as ", optimizer_kind_name(cfg_.kind), " (make_host_optimizer picks)"));
  chunks_ = optimizer_chunks(layout_, cfg_, "sgd");
  for (const ParamInfo& p : layout_) {
    decay_.push_back(T(optimizer_weight_decay(p, cfg_)));
    lr_mult_.push_back(optimizer_lr_mult(cfg_, p.name));
    lars_.push_back(cfg_.lars && !(param_is_bn_or_bias(p.kind) && cfg_.lars_exclude_bn_and_bias));
  }
  momentum_.resize(optimizer_buffer_elems(layout_, sizeof(T)));
  trust_.assign(layout_.size(), 1.0);
  if (cfg_.lars) partial_.assign(2 * chunks_.size(), 0.0);
}

template <class T>
void Sgd<T>::compute_trust_ratios(const T* params, const T* grads) {
  const int64_t nchunks = int64_t(chunks_.size());
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const OptimizerChunk& ch = chunks_[c];
    if (!lars_[ch.tensor]) continue;
    lars_chunk_squares(params + ch.begin, grads + ch.begin, ch.end - ch.begin, &partial_[2 * c],
                       &partial_[2 * c + 1]);
  }
  // Chunks are in layout order, so each tensor's partials are contiguous and summed in order.
  size_t c = 0;
  for (size_t t = 0; t < layout_.size(); ++t) {
    double w2 = 0, g2 = 0;
    for (; c < chunks_.size() && chunks_[c].tensor == t; ++c) {
      w2 += partial_[2 * c];
      g2 += partial_[2 * c + 1];
    }
    if (!lars_[t]) continue;
    const double wn = std::sqrt(w2), gn = std::sqrt(g2);
    // A zero norm (fresh zero-initialised tensor, or no gradient) would give a ratio of 0 or a
    // meaningless one; such tensors take the plain global lr.
    trust_[t] = wn > 0 && gn > 0
                    ? cfg_.lars_trust * wn / (gn + double(decay_[t]) * wn + cfg_.lars_eps)
                    : 1.0;
  }
}

template <class T>
void Sgd<T>::step(T* params, const T* grads, double lr) {
  if (!(lr >= 0) || !std::isfinite(lr))
    throw Error(str_cat("sgd: learning rate must be finite and >= 0, got ", lr));
  if (cfg_.lars) compute_trust_ratios(params, grads);
  const bool first = steps_ == 0, nesterov = cfg_.nesterov;
  const T mu = T(cfg_.momentum);
  T* buf = momentum_.data();
  const int64_t nchunks = int64_t(chunks_.size());
  // Waking the thread pool costs more than a single chunk's update.
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const OptimizerChunk& ch = chunks_[c];
    sgd_update<T>(first, nesterov, params + ch.begin, grads + ch.begin, buf + ch.begin,
                  ch.end - ch.begin, decay_[ch.tensor], T(trust_[ch.tensor]), mu, T(lr * lr_mult_[ch.tensor]));
  }
  ++steps_;
}

template <class T>
void Sgd<T>::restore(std::span<const T> momentum, int64_t steps) {
  if (momentum.size() != momentum_.size())
    throw Error(str_cat("sgd: restoring a momentum buffer of ", momentum.size(),
                        " elements into an optimizer of ", momentum_.size()));
  if (steps < 0) throw Error(str_cat("sgd: restoring a negative step count ", steps));
  std::copy(momentum.begin(), momentum.end(), momentum_.data());
  steps_ = steps;
}

template <class T>
StagedOptimizer<T>::StagedOptimizer(std::unique_ptr<Optimizer<T>> host, const MemorySpace& space)
    : opt_(std::move(host)), space_(space), params_(opt_->size()), grads_(opt_->size()) {}

template <class T>
void StagedOptimizer<T>::step(T* params, const T* grads, double lr) {
  const size_t bytes = params_.size() * sizeof(T);
  space_.to_host(params_.data(), params, bytes);
  space_.to_host(grads_.data(), grads, bytes);
  opt_->step(params_.data(), grads_.data(), lr);
  space_.from_host(params, params_.data(), bytes);
}

template class Sgd<float>;
template class Sgd<double>;
template class StagedOptimizer<float>;
template class StagedOptimizer<double>;

}  // namespace rt

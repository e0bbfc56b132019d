// SGD / LARS update over the flat parameter buffer, chunked for OpenMP.
#include "nn/optimizer.h"

#include <algorithm>
#include <cmath>

#include "nn/error.h"

namespace rt {

namespace {

// Elements per work item. Fixed (not derived from the thread count) so that the order in which
// norm partial sums are combined, and therefore every result, is the same for any thread count.
constexpr size_t kChunk = 4096;

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

void sgd_validate(const SgdConfig& cfg) {
  check_non_negative("momentum", cfg.momentum);
  check_non_negative("weight_decay", cfg.weight_decay);
  check_non_negative("lars_trust", cfg.lars_trust);
  check_non_negative("lars_eps", cfg.lars_eps);
  // As in PyTorch: with μ = 0 the Nesterov form silently degenerates to plain SGD.
  if (cfg.nesterov && cfg.momentum == 0)
    throw Error("sgd: nesterov requires momentum > 0");
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
  size_t end = 0;
  for (size_t t = 0; t < layout_.size(); ++t) {
    const ParamInfo& p = layout_[t];
    if (p.offset < end)
      throw Error(str_cat("sgd: parameter ", p.name, " at offset ", p.offset,
                          " overlaps the previous one (ends at ", end,
                          "); the layout must be sorted by offset"));
    end = p.offset + p.count;
    const bool bn_or_bias = param_is_bn_or_bias(p.kind);
    decay_.push_back(bn_or_bias && !cfg_.decay_bn_and_bias ? T(0) : T(cfg_.weight_decay));
    lars_.push_back(cfg_.lars && !(bn_or_bias && cfg_.lars_exclude_bn_and_bias));
    if (sgd_frozen(cfg_, p.name)) continue;  // no chunk: never read or written
    for (size_t b = p.offset; b < end; b += kChunk)
      chunks_.push_back({t, b, std::min(b + kChunk, end)});
  }
  // Same size as the arena's buffers: each tensor's storage is rounded up to a cache line.
  constexpr size_t align = std::max<size_t>(1, 64 / sizeof(T));
  momentum_.resize((end + align - 1) / align * align);
  trust_.assign(layout_.size(), 1.0);
  if (cfg_.lars) partial_.assign(2 * chunks_.size(), 0.0);
}

template <class T>
void Sgd<T>::compute_trust_ratios(const T* params, const T* grads) {
  const int64_t nchunks = int64_t(chunks_.size());
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks_[c];
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
  const T mu = T(cfg_.momentum), tlr = T(lr);
  T* buf = momentum_.data();
  const int64_t nchunks = int64_t(chunks_.size());
  // Waking the thread pool costs more than a single chunk's update.
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks_[c];
    sgd_update<T>(first, nesterov, params + ch.begin, grads + ch.begin, buf + ch.begin,
                  ch.end - ch.begin, decay_[ch.tensor], T(trust_[ch.tensor]), mu, tlr);
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
StagedSgd<T>::StagedSgd(std::vector<ParamInfo> layout, SgdConfig cfg, const MemorySpace& space)
    : sgd_(std::move(layout), cfg), space_(space), params_(sgd_.size()), grads_(sgd_.size()) {}

template <class T>
void StagedSgd<T>::step(T* params, const T* grads, double lr) {
  const size_t bytes = params_.size() * sizeof(T);
  space_.to_host(params_.data(), params, bytes);
  space_.to_host(grads_.data(), grads, bytes);
  sgd_.step(params_.data(), grads_.data(), lr);
  space_.from_host(params, params_.data(), bytes);
}

template class Sgd<float>;
template class Sgd<double>;
template class StagedSgd<float>;
template class StagedSgd<double>;

}  // namespace rt

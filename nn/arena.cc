// Flat parameter / gradient / state buffers.
#include "nn/arena.h"

#include <numeric>

#include "nn/error.h"

namespace rt {

template <class T>
int Arena<T>::add_param(std::string name, std::vector<int64_t> dims, ParamKind kind) {
  if (finalized_) throw Error("arena: parameter " + name + " registered after finalize()");
  ParamInfo p;
  p.name = std::move(name);
  p.count = std::accumulate(dims.begin(), dims.end(), size_t{1},
                            [](size_t a, int64_t d) { return a * size_t(d); });
  p.dims = std::move(dims);
  p.kind = kind;
  count_ += p.count;
  params_info_.push_back(std::move(p));
  return int(params_info_.size()) - 1;
}

template <class T>
int Arena<T>::add_state(std::string name, size_t count, T init) {
  if (finalized_) throw Error("arena: state " + name + " registered after finalize()");
  size_t off = state_info_.empty() ? 0 : state_info_.back().offset + state_info_.back().count;
  state_info_.push_back({std::move(name), off, count});
  state_init_.insert(state_init_.end(), count, init);
  return int(state_info_.size()) - 1;
}

template <class T>
void Arena<T>::set_memory(const MemorySpace* space) {
  if (finalized_) throw Error("arena memory chosen after finalize()");
  params_ = Buffer<T>(space);
  grads_ = Buffer<T>(space);
  state_ = Buffer<T>(space);
}

template <class T>
void Arena<T>::finalize() {
  if (finalized_) return;
  constexpr size_t align = 64 / sizeof(T);  // each parameter starts on a cache line
  size_t off = 0;
  for (size_t i = params_info_.size(); i-- > 0;) {
    params_info_[i].offset = off;
    off += (params_info_[i].count + align - 1) / align * align;
  }
  size_ = off;
  layout_.assign(params_info_.rbegin(), params_info_.rend());
  params_.resize(size_);
  grads_.resize(size_);
  state_.resize(state_init_.size());
  state_.from_host(state_init_.data(), 0, state_init_.size());
  finalized_ = true;
}

template <class T>
void Arena<T>::copy_from(const Arena& src) {
  if (!finalized_ || !src.finalized_ || src.size_ != size_ || src.count_ != count_ ||
      src.state_.size() != state_.size())
    throw Error("arena: copying " + std::to_string(src.count_) + " parameters and " +
                std::to_string(src.state_.size()) + " statistics into an arena of " + std::to_string(count_) +
                " and " + std::to_string(state_.size()) + ": not the same model");
  params_.copy_from(src.params_, size_);
  state_.copy_from(src.state_, state_.size());
}

template <class T>
void Arena<T>::check_range(size_t n, size_t offset, size_t size) {
  if (offset > size || n > size - offset)
    throw Error("arena: a host copy of elements [" + std::to_string(offset) + ", " +
                std::to_string(offset + n) +
                ") of a buffer of " + std::to_string(size));
}

template <class T>
void Arena<T>::params_to_host(std::span<T> host, size_t offset) const {
  check_range(host.size(), offset, size_);
  params_.to_host(host.data(), offset, host.size());
}

template <class T>
void Arena<T>::params_from_host(std::span<const T> host, size_t offset) {
  check_range(host.size(), offset, size_);
  params_.from_host(host.data(), offset, host.size());
}

template <class T>
void Arena<T>::grads_to_host(std::span<T> host, size_t offset) const {
  check_range(host.size(), offset, size_);
  grads_.to_host(host.data(), offset, host.size());
}

template <class T>
void Arena<T>::grads_from_host(std::span<const T> host, size_t offset) {
  check_range(host.size(), offset, size_);
  grads_.from_host(host.data(), offset, host.size());
}

template <class T>
void Arena<T>::grads_zero(size_t offset, size_t n) {
  check_range(n, offset, size_);
  grads_.zero(offset, n);
}

template <class T>
void Arena<T>::state_to_host(std::span<T> host, size_t offset) const {
  check_range(host.size(), offset, state_.size());
  state_.to_host(host.data(), offset, host.size());
}

template <class T>
void Arena<T>::state_from_host(std::span<const T> host, size_t offset) {
  check_range(host.size(), offset, state_.size());
  state_.from_host(host.data(), offset, host.size());
}

template class Arena<float>;
template class Arena<double>;

}  // namespace rt

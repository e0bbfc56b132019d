// The flat arena: one contiguous buffer of parameters, one of gradients (same layout), one of
// non-trained state (BN running statistics). Layers hold views into it.
//
// Parameters are laid out in the order backward produces their gradients (the reverse of the
// order layers register them in a feed-forward build), so the gradients ready after any point of
// backward are a prefix of the gradient buffer: a communication bucket is a contiguous slice and
// the optimizer is one loop over one buffer.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nn/tensor.h"

namespace rt {

enum class ParamKind : uint8_t { conv_weight, linear_weight, bias, bn_gamma, bn_beta };

// Weight decay is conventionally skipped for these (BN affine parameters and biases).
constexpr bool param_is_bn_or_bias(ParamKind k) {
  return k == ParamKind::bias || k == ParamKind::bn_gamma || k == ParamKind::bn_beta;
}

struct ParamInfo {
  std::string name;            // torchvision-style, e.g. "layer1.0.conv1.weight"
  std::vector<int64_t> dims;   // canonical dims, e.g. {out, in, kh, kw}
  ParamKind kind = ParamKind::conv_weight;
  size_t offset = 0;           // into params()/grads(), in elements (64-byte aligned)
  size_t count = 0;
};

struct StateInfo {
  std::string name;            // e.g. "layer1.0.bn1.running_mean"
  size_t offset = 0;           // into state()
  size_t count = 0;
};

// One arena buffer as host code sees it: the buffer itself where the host may dereference it (no
// copy: the CPU backends), else a host copy taken at construction, which commit() writes back.
// For set-up, checkpoints, checks and rare paths; not for a device backend's step.
template <class T>
class HostView {
 public:
  explicit HostView(Buffer<T>& buf) : buf_(buf), copied_(!buf.host_accessible()) {
    if (copied_) {
      copy_.resize(buf.size());
      buf.to_host(copy_.data(), 0, buf.size());
    }
    data_ = copied_ ? copy_.data() : buf.data();
  }
  HostView(HostView&&) noexcept = default;  // a vector's move keeps its elements in place
  HostView(const HostView&) = delete;
  HostView& operator=(const HostView&) = delete;

  std::span<T> span() { return {data_, buf_.size()}; }
  T* data() { return data_; }
  size_t size() const { return buf_.size(); }
  T& operator[](size_t i) { return data_[i]; }
  // Makes changes made through the view the buffer's (nothing to do without a copy).
  void commit() {
    if (copied_) buf_.from_host(copy_.data(), 0, buf_.size());
  }
  bool copied() const { return copied_; }

 private:
  Buffer<T>& buf_;
  bool copied_;
  std::vector<T> copy_;
  T* data_ = nullptr;
};

template <class T>
class Arena {
 public:
  // Registration (before finalize): returns an id used with param()/grad()/state_ptr().
  int add_param(std::string name, std::vector<int64_t> dims, ParamKind kind);
  int add_state(std::string name, size_t count, T init);
  // Before finalize: where the three buffers live (nullptr: host). Any space: host code reads
  // and writes them through the copies and host views below unless host_accessible().
  void set_memory(const MemorySpace* space);
  // Lays out parameters in reverse registration order and allocates the buffers.
  void finalize();
  bool finalized() const { return finalized_; }

  T* param(int id) { return params_.data() + params_info_[id].offset; }
  T* grad(int id) { return grads_.data() + params_info_[id].offset; }
  T* state_ptr(int id) { return state_.data() + state_info_[id].offset; }
  const ParamInfo& info(int id) const { return params_info_[id]; }
  // Parameter infos by id (registration order); names, dims and counts before finalize too.
  const std::vector<ParamInfo>& registered() const { return params_info_; }

  // Parameter infos sorted by offset (i.e. in backward order).
  const std::vector<ParamInfo>& layout() const { return layout_; }
  const std::vector<StateInfo>& state_layout() const { return state_info_; }

  // The buffers in their memory space: for the backend's ops, the optimizer and the gradient
  // reducer's device hooks. Host code may dereference them only when host_accessible() (after
  // Backend::sync()); host_accessible() is true for host memory and false for a device's.
  std::span<T> params() { return {params_.data(), size_}; }
  std::span<T> grads() { return {grads_.data(), size_}; }
  std::span<T> state() { return {state_.data(), state_.size()}; }
  bool host_accessible() const { return params_.host_accessible(); }
  const MemorySpace* memory() const { return params_.space(); }

  // Synchronous copies between elements [offset, offset + host.size()) of a buffer and the host.
  void params_to_host(std::span<T> host, size_t offset = 0) const;
  void params_from_host(std::span<const T> host, size_t offset = 0);
  void grads_to_host(std::span<T> host, size_t offset = 0) const;
  void grads_from_host(std::span<const T> host, size_t offset = 0);
  void grads_zero(size_t offset, size_t n);  // in the arena's memory space (queued on a device)
  void state_to_host(std::span<T> host, size_t offset = 0) const;
  void state_from_host(std::span<const T> host, size_t offset = 0);
  // Copies of whole buffers of the arena's memory space (a moving average of the weights, for one
  // evaluation): the first size() / state().size() elements of src.
  void params_from(const Buffer<T>& src) { params_.copy_from(src, size_); }
  void state_from(const Buffer<T>& src) { state_.copy_from(src, state_.size()); }
  // Parameters and BN statistics of another arena of the same layout, in the same kind of memory
  // (the same model set up for another input size, e.g. for evaluation). src's writes must be
  // done (its backend synced); the copy is ordered like this arena's own.
  void copy_from(const Arena& src);
  // Whole buffers as the host sees them (HostView: no copy when host accessible).
  HostView<T> host_params() { return HostView<T>(params_); }
  HostView<T> host_grads() { return HostView<T>(grads_); }
  HostView<T> host_state() { return HostView<T>(state_); }
  // Number of trained scalars (excluding alignment padding); before finalize too.
  size_t param_count() const { return count_; }
  size_t size() const { return size_; }  // elements including alignment padding

 private:
  static void check_range(size_t n, size_t offset, size_t size);

  std::vector<ParamInfo> params_info_;  // by id
  std::vector<ParamInfo> layout_;       // by offset
  std::vector<StateInfo> state_info_;
  std::vector<T> state_init_;
  Buffer<T> params_, grads_, state_;
  size_t size_ = 0, count_ = 0;
  bool finalized_ = false;
};

}  // namespace rt

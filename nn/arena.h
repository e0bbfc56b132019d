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

template <class T>
class Arena {
 public:
  // Registration (before finalize): returns an id used with param()/grad()/state_ptr().
  int add_param(std::string name, std::vector<int64_t> dims, ParamKind kind);
  int add_state(std::string name, size_t count, T init);
  // Before finalize: where the three buffers live (nullptr: host). The optimizer, checkpoints
  // and the allreduce read them on the host, so the space must be host accessible.
  void set_memory(const MemorySpace* space);
  // Lays out parameters in reverse registration order and allocates the buffers.
  void finalize();
  bool finalized() const { return finalized_; }

  T* param(int id) { return params_.data() + params_info_[id].offset; }
  T* grad(int id) { return grads_.data() + params_info_[id].offset; }
  T* state_ptr(int id) { return state_.data() + state_info_[id].offset; }
  const ParamInfo& info(int id) const { return params_info_[id]; }

  // Parameter infos sorted by offset (i.e. in backward order).
  const std::vector<ParamInfo>& layout() const { return layout_; }
  const std::vector<StateInfo>& state_layout() const { return state_info_; }

  std::span<T> params() { return {params_.data(), size_}; }
  std::span<T> grads() { return {grads_.data(), size_}; }
  std::span<T> state() { return {state_.data(), state_.size()}; }
  // Number of trained scalars (excluding alignment padding).
  size_t param_count() const { return count_; }
  size_t size() const { return size_; }  // elements including alignment padding

 private:
  std::vector<ParamInfo> params_info_;  // by id
  std::vector<ParamInfo> layout_;       // by offset
  std::vector<StateInfo> state_info_;
  std::vector<T> state_init_;
  Buffer<T> params_, grads_, state_;
  size_t size_ = 0, count_ = 0;
  bool finalized_ = false;
};

}  // namespace rt

// What a convolution's algorithm choice is remembered by: cuDNN's choice depends only on the
// descriptors (shape, format, type, math) and the context's configuration, so a model's layers of
// one shape share it. ResNet-50 has 53 convolutions of 23 distinct shapes; with timed choice
// (cudnnFind*, every candidate run on the layer's full batch) the set-up time is that of the
// distinct shapes, as PyTorch's cudnn.benchmark cache.
#pragma once
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace rt::cuda {

struct ConvAlgos {
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  // The math type each direction's descriptor is set to for its algorithm.
  cudnnMathType_t fwd_math{}, bwd_data_math{}, bwd_filter_math{};
  size_t workspace = 0;  // bytes: the largest of the three
};

// One context's choices (its device and ContextConfig are fixed), keyed by conv_algo_key. Used at
// set-up on the thread that builds the model, as the context's other set-up calls.
class ConvAlgoCache {
 public:
  // The choice made earlier for key (counted in reused()), or nullptr.
  const ConvAlgos* find(const std::string& key) {
    const auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    ++reused_;
    return &it->second;
  }
  void add(const std::string& key, const ConvAlgos& a) { map_.emplace(key, a); }
  int64_t shapes() const { return int64_t(map_.size()); }  // choices made
  int64_t reused() const { return reused_; }                // layers that took one made earlier

 private:
  std::map<std::string, ConvAlgos> map_;
  int64_t reused_ = 0;
};

}  // namespace rt::cuda

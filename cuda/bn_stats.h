// The per-channel fp32 vectors our batch norms keep on the device between their calls (the
// 16-bit backends' and the fp32 backends' synchronised one), in one allocation.
#pragma once
#include <cstdint>

#include "cuda/lowp_kernels.h"  // BnStatsArgs
#include "cuda/memory.h"
#include "nn/ops.h"

namespace rt::cuda {

class BnChannelStats {
 public:
  // sum_g, sum_gxhat: backward's sums over the group (model.bn_group), adjacent.
  enum Vec { mean, var_sum, invstd, scale, beta, eval_scale, sum_g, sum_gxhat, kVecs };
  explicit BnChannelStats(int64_t channels)
      : c_(channels), buf_(size_t(kVecs * channels) * sizeof(float)) {}
  float* operator[](Vec v) const { return buf_.as<float>() + int64_t(v) * c_; }

  // bn_train_stats' arguments: the batch's mean and var_sum over m values per channel into
  // invstd, scale and the saved beta here, and the running statistics.
  BnStatsArgs train_args(const BatchNormDesc& d, int64_t m, const float* gamma, const float* beta_in,
                         float* running_mean, float* running_var) const {
    BnStatsArgs st;
    st.channels = c_;
    st.m = m;
    st.eps = d.eps;
    st.momentum = d.momentum;
    st.gamma = gamma;
    st.beta = beta_in;
    st.mean = (*this)[mean];
    st.var_sum = (*this)[var_sum];
    st.invstd = (*this)[invstd];
    st.scale = (*this)[scale];
    st.beta_saved = (*this)[beta];
    st.running_mean = running_mean;
    st.running_var = running_var;
    return st;
  }

 private:
  int64_t c_;
  DeviceBuffer buf_;
};

}  // namespace rt::cuda

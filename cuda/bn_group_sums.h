// model.bn_group on the device: a batch norm's per-channel fp32 sums, downloaded to a page-locked
// buffer of the layer's, added over the group through BnSync in double (as the CPU backends add
// theirs) and uploaded back. The host waits for the stream at each sum: the kernels after it need
// the group's figures.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "nn/ops.h"

namespace rt::cuda {

class BnGroupSums {
 public:
  // Up to two sums of `channels` values per add() (and a count); allocates at set-up only.
  BnGroupSums(BnSync& sync, int64_t channels, cudaStream_t stream);
  ~BnGroupSums();
  BnGroupSums(const BnGroupSums&) = delete;
  BnGroupSums& operator=(const BnGroupSums&) = delete;

  // Forward's two passes, as the CPU backends take them: sum_x(out) queues this rank's
  // per-channel sum of x into `mean`, sq_dev(mean, out) its sum of squared deviations from the
  // group's mean into `var_sum`; each is added over the group and replaced by the group's figure
  // (the mean, the sum of squared deviations). Returns the group's values per channel, given this
  // rank's `rows`.
  template <class SumX, class SqDev>
  int64_t mean_and_var_sum(int64_t rows, float* mean, float* var_sum, SumX&& sum_x, SqDev&& sq_dev) {
    sum_x(mean);
    const int64_t count = add({mean}, rows);
    upload(mean, c_, 1.0 / double(count));
    sq_dev(static_cast<const float*>(mean), var_sum);
    add({var_sum});
    upload(var_sum, c_, 1.0);
    return count;
  }
  // Backward: dx's two sums, this rank's dbeta and dgamma, over the group into `to` (2 channels
  // floats: the group's sum of g, then of g xhat).
  void dx_sums(const float* dbeta, const float* dgamma, float* to) {
    add({dbeta, dgamma});
    upload(to, 2 * c_, 1.0);
  }

 private:
  // Adds `parts` (one or two device vectors of `channels` floats) over the group into sums_, one
  // after the other, and `rows` after them where rows > 0; returns the group's rows (else 0).
  int64_t add(std::initializer_list<const float*> parts, int64_t rows = 0);
  // sums_[0, n) times k, rounded to fp32, to `to` (device) on the stream. The page-locked buffer
  // it goes through is written again only after the next add()'s wait.
  void upload(float* to, int64_t n, double k);

  BnSync& sync_;
  int64_t c_;
  cudaStream_t stream_;
  float* host_ = nullptr;     // 2 c_ floats, page-locked
  std::vector<double> sums_;  // 2 c_ + 1
};

}  // namespace rt::cuda

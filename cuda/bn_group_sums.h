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

  // Adds `parts` (one or two device vectors of `channels` floats) over the group into sums(),
  // one after the other, and `rows` (this rank's values per channel) after them where rows > 0;
  // returns the group's count of rows then (else 0).
  int64_t add(std::initializer_list<const float*> parts, int64_t rows = 0);
  // sums()[0, n) times k, rounded to fp32, to `to` (device) on the stream. The page-locked
  // buffer it goes through is written again only after the next add()'s wait.
  void upload(float* to, int64_t n, double k);

 private:
  BnSync& sync_;
  int64_t c_;
  cudaStream_t stream_;
  float* host_ = nullptr;     // 2 c_ floats, page-locked
  std::vector<double> sums_;  // 2 c_ + 1
};

}  // namespace rt::cuda

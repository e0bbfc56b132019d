#include "cuda/bn_group_sums.h"

#include "cuda/check.h"
#include "cuda/memory.h"

namespace rt::cuda {

BnGroupSums::BnGroupSums(BnSync& sync, int64_t channels, cudaStream_t stream)
    : sync_(sync), c_(channels), stream_(stream), sums_(size_t(2 * channels + 1)) {
  host_ = static_cast<float*>(pinned_malloc(size_t(2 * c_) * sizeof(float)));
}

BnGroupSums::~BnGroupSums() { pinned_free(host_, size_t(2 * c_) * sizeof(float)); }

int64_t BnGroupSums::add(std::initializer_list<const float*> parts, int64_t rows) {
  if (parts.size() > 2) throw Error("BnGroupSums::add: at most two sums at once");
  size_t n = 0;
  for (const float* p : parts) {
    CUDA_CHECK(cudaMemcpyAsync(host_ + n, p, size_t(c_) * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    n += size_t(c_);
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < n; ++i) sums_[i] = host_[i];
  if (rows > 0) sums_[n++] = double(rows);
  sync_.sum(sums_.data(), n);
  return rows > 0 ? int64_t(sums_[n - 1]) : 0;
}

void BnGroupSums::upload(float* to, int64_t n, double k) {
  for (size_t i = 0; i < size_t(n); ++i) host_[i] = float(sums_[i] * k);
  CUDA_CHECK(cudaMemcpyAsync(to, host_, size_t(n) * sizeof(float), cudaMemcpyHostToDevice, stream_));
}

}  // namespace rt::cuda

// Shared by the GPU tests: skip (saying why) without a device; host <-> device vector copies;
// seeded test data.
#pragma once
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/memory.h"
#include "nn/ops.h"
#include "nn/tensor.h"

// Skips the current test when no CUDA device can be used, with the runtime's reason.
#define RT_REQUIRE_GPU()                                                        \
  do {                                                                          \
    std::string rt_why_;                                                        \
    if (::rt::cuda::device_count(&rt_why_) == 0)                                \
      GTEST_SKIP() << "no CUDA device: " << rt_why_;                            \
  } while (0)

namespace rt::cuda::test {

// A stream and enough queued work on it (repeated passes over 64 MiB) that a copy or a wait
// which does not order itself behind that work would see it unfinished. The emulator runs queued
// work only when waited for, so there any amount is unfinished and a little keeps it quick.
#ifdef RT_CUDA_EMULATOR
constexpr size_t kBusyBytes = size_t{64} << 10;
#else
constexpr size_t kBusyBytes = size_t{64} << 20;
#endif
struct SlowStream {
  SlowStream() : busy(kBusyBytes) { CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~SlowStream() { cudaStreamDestroy(s); }
  SlowStream(const SlowStream&) = delete;
  SlowStream& operator=(const SlowStream&) = delete;
  void queue_slow_work(int passes = 200) {
    for (int i = 0; i < passes; ++i) scale(Elem::f32, busy.get(), busy.bytes() / 4, 1.0f, s);
    CUDA_CHECK_LAUNCH();
  }
  cudaStream_t s = nullptr;
  DeviceBuffer busy;
};

// n uniform values in [lo, hi).
inline std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -2, float hi = 2) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

// Small integers, exact in every type tested: many ties and zeros for the max pool and ReLU rules.
inline std::vector<float> tie_vec(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> u(-2, 2);
  std::vector<float> v(n);
  for (auto& x : v) x = float(u(g));
  return v;
}

template <class T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <class T>
std::vector<T> to_host(const DeviceBuffer& b, size_t n, size_t offset_elems = 0) {
  std::vector<T> v(n);
  b.download(v.data(), n * sizeof(T), offset_elems * sizeof(T));
  return v;
}

// The reference backend's batch norm of d on host data: training from running statistics rm, rv
// (y, dx, dgamma, dbeta, the running statistics after it), and evaluation with rm, rv (eval_y).
struct RefBatchNorm {
  std::vector<float> y, dx, dgamma, dbeta, running_mean, running_var, eval_y;
};
inline RefBatchNorm ref_batchnorm(Backend<float>& ref, const BatchNormDesc& d, const std::vector<float>& x,
                                  const std::vector<float>& gamma, const std::vector<float>& beta,
                                  const std::vector<float>& dy, const std::vector<float>& rm,
                                  const std::vector<float>& rv) {
  const size_t n = size_t(d.in.numel()), c = size_t(d.in.c);
  RefBatchNorm r{std::vector<float>(n), std::vector<float>(n), std::vector<float>(c), std::vector<float>(c), rm, rv,
                 std::vector<float>(n)};
  auto op = ref.make_batchnorm(d);
  op->forward_train(x.data(), gamma.data(), beta.data(), r.y.data(), r.running_mean.data(), r.running_var.data());
  op->backward(x.data(), gamma.data(), r.y.data(), dy.data(), r.dx.data(), r.dgamma.data(), r.dbeta.data());
  op->forward_eval(x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), r.eval_y.data());
  return r;
}

// model.bn_group's transport for one process: a group of three ranks that hold the same batch,
// each sum coming back three times over. The group's statistics are then the batch's over three
// times the values, so a batch norm that took any count or sum as its rank's alone is seen against
// the reference backend's with the same group. Records the sizes it was asked to sum.
class TripledSync final : public BnSync {
 public:
  void sum(double* v, size_t n) override {
    for (size_t i = 0; i < n; ++i) v[i] *= 3;
    sizes.push_back(n);
  }
  int ranks() const override { return 3; }
  std::vector<size_t> sizes;
};

}  // namespace rt::cuda::test

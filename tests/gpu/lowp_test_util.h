// Shared by the 16-bit backends' op tests (gpu_lowp_ops.cc, gpu_lowp_batchnorm.cc; one suite,
// GpuLowpOps, for cuda-bf16 and cuda-fp16): the two storage types, inputs already rounded to
// them, the normalised error the tolerances are written in, and the backend beside the reference.
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "cuda/lowp_backend.h"
#include "gpu_test_util.h"
#include "nn/ops.h"

namespace rt::cuda::test {

// The two storage types: the backend, the host rounding and the unit roundoff.
struct Kind {
  DType dtype;
  const char* backend;
  float (*round)(float);
  double unit;
};
// gtest names the parameter by its backend.
inline void PrintTo(const Kind& k, std::ostream* os) { *os << k.backend; }
inline const Kind kBf16{DType::bf16, "cuda-bf16", bf16_round, 0x1p-8};
inline const Kind kFp16{DType::f16, "cuda-fp16", f16_round, 0x1p-11};

// A bound written in bf16 units, for the type k.
inline double tol(const Kind& k, double bf16_bound) { return bf16_bound * (k.unit / 0x1p-8); }

inline std::vector<float> rounded(const Kind& k, std::vector<float> v) {
  for (auto& x : v) x = k.round(x);
  return v;
}

// Uniform values already representable in the type (so the import rounds nothing).
inline std::vector<float> lowp_vec(const Kind& k, size_t n, uint32_t seed, float lo = -2, float hi = 2) {
  return rounded(k, random_vec(n, seed, lo, hi));
}

inline double normalised_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::abs(double(got[i]) - double(ref[i])));
    den = std::max(den, std::abs(double(ref[i])));
  }
  return den > 0 ? num / den : num;
}

inline void expect_normalised(const std::vector<float>& got, const std::vector<float>& ref, double tol,
                       const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (float v : got) ASSERT_TRUE(std::isfinite(v)) << what;
  EXPECT_LE(normalised_error(got, ref), tol) << what;
}

inline void expect_equal(const std::vector<float>& got, const std::vector<float>& ref,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_EQ(got[i], ref[i]) << what << " at " << i;
}

// The 16-bit backend and the reference, with activation helpers that go through act_import and
// act_export (NCHW fp32 on the host, 16-bit NHWC on the device).
struct Backends {
  explicit Backends(DType t) : gpu(make_cuda_lowp_backend(t)) {}
  std::unique_ptr<Backend<float>> gpu;
  std::unique_ptr<Backend<float>> ref = make_backend<float>("reference");

  DeviceBuffer act(const Shape& s) const { return DeviceBuffer(gpu->act_size(s) * sizeof(float)); }
  DeviceBuffer import(const std::vector<float>& nchw, const Shape& s) const {
    DeviceBuffer b = act(s);
    gpu->act_import(nchw.data(), s, b.as<float>());
    return b;
  }
  std::vector<float> export_act(const DeviceBuffer& b, const Shape& s) const {
    std::vector<float> v(size_t(s.numel()));
    gpu->act_export(b.as<float>(), s, v.data());
    return v;
  }
  // fp32 device results (weights' gradients, statistics): after the stream is done.
  std::vector<float> fp32(const DeviceBuffer& b, size_t n) const {
    gpu->sync();
    return to_host<float>(b, n);
  }
};

class GpuLowpOps : public ::testing::TestWithParam<Kind> {};
// A parameterised test's name suffix: bf16 or fp16.
inline std::string kind_name(const ::testing::TestParamInfo<Kind>& i) {
  return i.param.dtype == DType::bf16 ? "bf16" : "fp16";
}

}  // namespace rt::cuda::test

// Instantiates GpuLowpOps for both types, named bf16 and fp16, in the including test program.
#define RT_INSTANTIATE_GPU_LOWP_OPS()                                                        \
  INSTANTIATE_TEST_SUITE_P(Types, GpuLowpOps, ::testing::Values(test::kBf16, test::kFp16), \
                           test::kind_name)

// CPU reduce kernels: AVX2 f32 add (memory-bound, so unrolled loads and stores matter more than
// arithmetic) with a scalar fallback, and bf16 add/scale through fp32.
#include <immintrin.h>

#include <cstring>

#include "comm/mpi_check.h"
#include "comm/reduce.h"

namespace rt::comm {

void reduce_add_f32_scalar(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

namespace {

__attribute__((target("avx2"))) void reduce_add_f32_avx2(float* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 a0 = _mm256_loadu_ps(dst + i), b0 = _mm256_loadu_ps(src + i);
    __m256 a1 = _mm256_loadu_ps(dst + i + 8), b1 = _mm256_loadu_ps(src + i + 8);
    __m256 a2 = _mm256_loadu_ps(dst + i + 16), b2 = _mm256_loadu_ps(src + i + 16);
    __m256 a3 = _mm256_loadu_ps(dst + i + 24), b3 = _mm256_loadu_ps(src + i + 24);
    _mm256_storeu_ps(dst + i, _mm256_add_ps(a0, b0));
    _mm256_storeu_ps(dst + i + 8, _mm256_add_ps(a1, b1));
    _mm256_storeu_ps(dst + i + 16, _mm256_add_ps(a2, b2));
    _mm256_storeu_ps(dst + i + 24, _mm256_add_ps(a3, b3));
  }
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
  for (; i < n; ++i) dst[i] += src[i];
}

__attribute__((target("avx2"))) void scale_f32_avx2(float* buf, size_t n, float s) {
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(buf + i, _mm256_mul_ps(_mm256_loadu_ps(buf + i), vs));
  for (; i < n; ++i) buf[i] *= s;
}

void scale_f32_scalar(float* buf, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) buf[i] *= s;
}

class CpuReduceKernels final : public ReduceKernels {
 public:
  CpuReduceKernels() : avx2_(__builtin_cpu_supports("avx2")) {}

  void reduce_add(DType t, void* dst, const void* src, size_t n) const override {
    switch (t) {
      case DType::f32:
        if (avx2_)
          reduce_add_f32_avx2(static_cast<float*>(dst), static_cast<const float*>(src), n);
        else
          reduce_add_f32_scalar(static_cast<float*>(dst), static_cast<const float*>(src), n);
        return;
      case DType::bf16: {
        auto* d = static_cast<bf16_t*>(dst);
        auto* s = static_cast<const bf16_t*>(src);
        for (size_t i = 0; i < n; ++i) d[i] = to_bf16(from_bf16(d[i]) + from_bf16(s[i]));
        return;
      }
      case DType::f16:
        break;
    }
    throw CommError(str_cat("CPU reduce kernels: element type ", dtype_name(t), " not supported"));
  }

  void scale(DType t, void* buf, size_t n, float s) const override {
    switch (t) {
      case DType::f32:
        if (avx2_)
          scale_f32_avx2(static_cast<float*>(buf), n, s);
        else
          scale_f32_scalar(static_cast<float*>(buf), n, s);
        return;
      case DType::bf16: {
        auto* b = static_cast<bf16_t*>(buf);
        for (size_t i = 0; i < n; ++i) b[i] = to_bf16(from_bf16(b[i]) * s);
        return;
      }
      case DType::f16:
        break;
    }
    throw CommError(str_cat("CPU reduce kernels: element type ", dtype_name(t), " not supported"));
  }

  bool supports(DType t) const override { return t == DType::f32 || t == DType::bf16; }

 private:
  bool avx2_;
};

}  // namespace

const ReduceKernels& cpu_reduce_kernels() {
  static const CpuReduceKernels kernels;
  return kernels;
}

}  // namespace rt::comm

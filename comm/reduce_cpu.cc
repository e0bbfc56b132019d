// CPU reduce kernels: AVX2 f32 add (memory-bound, so unrolled loads and stores matter more than
// arithmetic) with a scalar fallback, bf16/f16 add and scale through fp32, and the f32 ↔ 16-bit
// conversions of gradient compression (AVX2, F16C).
#include <cpuid.h>
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

// The storage types through fp32 (nn/tensor.h's roundings, the reference for the vector paths).
inline float load(float v) { return v; }
inline float load(bf16_t v) { return from_bf16(v); }
inline float load(f16_t v) { return from_f16(v); }
template <class T> T store(float f);
template <> float store<float>(float f) { return f; }
template <> bf16_t store<bf16_t>(float f) { return to_bf16(f); }
template <> f16_t store<f16_t>(float f) { return to_f16(f); }

template <class T>
void reduce_add_16(void* dst, const void* src, size_t n) {
  auto* d = static_cast<T*>(dst);
  auto* s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = store<T>(load(d[i]) + load(s[i]));
}
template <class T>
void scale_16(void* buf, size_t n, float s) {
  auto* b = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) b[i] = store<T>(load(b[i]) * s);
}
template <class To, class From>
void convert_scalar(void* dst, const void* src, size_t n, float s) {
  auto* d = static_cast<To*>(dst);
  auto* x = static_cast<const From*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = store<To>(load(x[i]) * s);
}

// Eight 16-bit values at a time through fp32 registers. Every AVX2 processor has F16C, so one
// flag (vec16_) enables both types' vector paths.
#define RT_VEC16 __attribute__((target("avx2,f16c")))
struct Bf16x8 {
  using T = bf16_t;
  RT_VEC16 static __m256 load(const T* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // to_bf16's bit arithmetic: round to nearest even, a NaN kept quiet.
  RT_VEC16 static void store(T* p, __m256 x) {
    const __m256i u = _mm256_castps_si256(x), hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                                   _mm256_and_si256(hi, _mm256_set1_epi32(1))),
                                  16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    // 32 → 16 bits: packus works within 128-bit lanes, the permute restores the order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
};
// F16C rounds as to_f16 (nearest even, inf from 65520 up, subnormals); a NaN keeps its payload's
// top bits instead of becoming 0x7e00, still a quiet NaN of the same sign.
struct F16x8 {
  using T = f16_t;
  RT_VEC16 static __m256 load(const T* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  RT_VEC16 static void store(T* p, __m256 x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

// The loops: vectors of eight, then the scalar tail with the host roundings.
template <class V>
RT_VEC16 void reduce_add_vec(void* dst, const void* src, size_t n) {
  auto* d = static_cast<typename V::T*>(dst);
  auto* x = static_cast<const typename V::T*>(src);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) V::store(d + i, _mm256_add_ps(V::load(d + i), V::load(x + i)));
  for (; i < n; ++i) d[i] = store<typename V::T>(load(d[i]) + load(x[i]));
}
template <class V>
RT_VEC16 void scale_vec(void* buf, size_t n, float s) {
  auto* b = static_cast<typename V::T*>(buf);
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) V::store(b + i, _mm256_mul_ps(V::load(b + i), vs));
  for (; i < n; ++i) b[i] = store<typename V::T>(load(b[i]) * s);
}
template <class V>
RT_VEC16 void narrow_vec(void* dst, const void* src, size_t n, float s) {  // f32 → T
  auto* d = static_cast<typename V::T*>(dst);
  auto* x = static_cast<const float*>(src);
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) V::store(d + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
  for (; i < n; ++i) d[i] = store<typename V::T>(x[i] * s);
}
template <class V>
RT_VEC16 void widen_vec(void* dst, const void* src, size_t n, float s) {  // T → f32
  auto* d = static_cast<float*>(dst);
  auto* x = static_cast<const typename V::T*>(src);
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_mul_ps(V::load(x + i), vs));
  for (; i < n; ++i) d[i] = load(x[i]) * s;
}
#undef RT_VEC16

// F16C from CPUID leaf 1 (ECX bit 29): clang before 15 knows no "f16c" for __builtin_cpu_supports.
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

class CpuReduceKernels final : public ReduceKernels {
 public:
  CpuReduceKernels() : avx2_(__builtin_cpu_supports("avx2")), vec16_(avx2_ && cpu_has_f16c()) {}

  void reduce_add(DType t, void* dst, const void* src, size_t n) const override {
    switch (t) {
      case DType::f32:
        if (avx2_)
          reduce_add_f32_avx2(static_cast<float*>(dst), static_cast<const float*>(src), n);
        else
          reduce_add_f32_scalar(static_cast<float*>(dst), static_cast<const float*>(src), n);
        return;
      case DType::bf16:
        return vec16_ ? reduce_add_vec<Bf16x8>(dst, src, n) : reduce_add_16<bf16_t>(dst, src, n);
      case DType::f16:
        return vec16_ ? reduce_add_vec<F16x8>(dst, src, n) : reduce_add_16<f16_t>(dst, src, n);
    }
    throw CommError(str_cat("CPU reduce kernels: unknown element type ", int(t)));
  }

  void scale(DType t, void* buf, size_t n, float s) const override {
    switch (t) {
      case DType::f32:
        if (avx2_)
          scale_f32_avx2(static_cast<float*>(buf), n, s);
        else
          scale_f32_scalar(static_cast<float*>(buf), n, s);
        return;
      case DType::bf16: return vec16_ ? scale_vec<Bf16x8>(buf, n, s) : scale_16<bf16_t>(buf, n, s);
      case DType::f16: return vec16_ ? scale_vec<F16x8>(buf, n, s) : scale_16<f16_t>(buf, n, s);
    }
    throw CommError(str_cat("CPU reduce kernels: unknown element type ", int(t)));
  }

  void convert(DType to, void* dst, DType from, const void* src, size_t n, float s) const override {
    using F = DType;
    if (from == F::f32 && to == F::bf16)
      return vec16_ ? narrow_vec<Bf16x8>(dst, src, n, s) : convert_scalar<bf16_t, float>(dst, src, n, s);
    if (from == F::f32 && to == F::f16)
      return vec16_ ? narrow_vec<F16x8>(dst, src, n, s) : convert_scalar<f16_t, float>(dst, src, n, s);
    if (from == F::bf16 && to == F::f32)
      return vec16_ ? widen_vec<Bf16x8>(dst, src, n, s) : convert_scalar<float, bf16_t>(dst, src, n, s);
    if (from == F::f16 && to == F::f32)
      return vec16_ ? widen_vec<F16x8>(dst, src, n, s) : convert_scalar<float, f16_t>(dst, src, n, s);
    if (from == F::f32 && to == F::f32) return convert_scalar<float, float>(dst, src, n, s);
    throw CommError(str_cat("CPU reduce kernels: no conversion from ", dtype_name(from), " to ",
                            dtype_name(to)));
  }

  bool supports(DType) const override { return true; }

 private:
  bool avx2_, vec16_;
};

}  // namespace

const ReduceKernels& cpu_reduce_kernels() {
  static const CpuReduceKernels kernels;
  return kernels;
}

}  // namespace rt::comm

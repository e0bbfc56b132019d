// Element access by run-time type for the emulated libraries: float, IEEE half and bfloat16
// stored in device buffers, read as float and written rounded to nearest even; the libraries'
// alpha/beta blend.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>
#include <library_types.h>

#include <cstdint>
#include <stdexcept>

namespace rt_emu {

enum class Type { f32, f16, bf16 };

inline Type type_of(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return Type::f32;
    case CUDNN_DATA_HALF: return Type::f16;
    case CUDNN_DATA_BFLOAT16: return Type::bf16;
    default: throw std::invalid_argument("emulated cuDNN: unsupported data type");
  }
}
inline Type type_of(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return Type::f32;
    case CUDA_R_16F: return Type::f16;
    case CUDA_R_16BF: return Type::bf16;
    default: throw std::invalid_argument("emulated cuBLAS: unsupported data type");
  }
}

inline float load(Type t, const void* p, int64_t i) {
  switch (t) {
    case Type::f32: return static_cast<const float*>(p)[i];
    case Type::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case Type::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
  return 0;
}
inline void store(Type t, void* p, int64_t i, float v) {
  switch (t) {
    case Type::f32: static_cast<float*>(p)[i] = v; break;
    case Type::f16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case Type::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
  }
}
template <class D>
float load(D t, const void* p, int64_t i) { return load(type_of(t), p, i); }
template <class D>
void store(D t, void* p, int64_t i, float v) { store(type_of(t), p, i, v); }

// out[i] = alpha * v + beta * out[i], rounded once to the type; out[i] is not read when beta is
// 0, as cuDNN and cuBLAS document.
template <class D>
void blend(D t, void* out, int64_t i, double v, float alpha, float beta) {
  double r = double(alpha) * v;
  if (beta != 0) r += double(beta) * double(load(t, out, i));
  store(t, out, i, float(r));
}

}  // namespace rt_emu

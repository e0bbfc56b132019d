// The cuBLAS calls the backend makes, emulated on the host by direct loops in double, in cuBLAS's
// column-major convention with host-side alpha and beta (the default pointer mode): SGEMM, GemmEx
// (float, half, bfloat16 operands; fp32 compute), SGEMV, SGER. As cuBLAS, C is not read when beta
// is 0. Scalars are read at the call, the work is queued on the handle's stream
// (tests/cuda_emu/streams.h). Not reproduced: cuBLAS's summation order, fp32 accumulation and speed.
#include <cublas_v2.h>

#include <vector>

#include "tests/cuda_emu/elements.h"
#include "tests/cuda_emu/streams.h"

// A handle: the stream its work is queued on (0 until cublasSetStream, as cuBLAS's).
struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

using rt_emu::Type;

// op(X)[i][j] of a column-major matrix with leading dimension ld.
double at(Type t, const void* p, int ld, cublasOperation_t op, int i, int j) {
  return op == CUBLAS_OP_N ? rt_emu::load(t, p, int64_t(j) * ld + i)
                           : rt_emu::load(t, p, int64_t(i) * ld + j);
}

// C (m x n) = alpha op(A) (m x k) op(B) (k x n) + beta C, queued on h's stream.
cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                    Type a_t, const void* a, int lda, Type b_t, const void* b, int ldb, float beta,
                    Type c_t, void* c, int ldc) {
  if (!h || m < 0 || n < 0 || k < 0 || ldc < std::max(1, m) ||
      lda < std::max(1, ta == CUBLAS_OP_N ? m : k) || ldb < std::max(1, tb == CUBLAS_OP_N ? k : n))
    return CUBLAS_STATUS_INVALID_VALUE;
  rt_emu::enqueue(h->stream, [=] {
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        double s = 0;
        for (int p = 0; p < k; ++p) s += at(a_t, a, lda, ta, i, p) * at(b_t, b, ldb, tb, p, j);
        rt_emu::blend(c_t, c, int64_t(j) * ldc + i, s, alpha, beta);
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusName(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INVALID_VALUE";
}
const char* cublasGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success" : "invalid value (emulated cuBLAS)";
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                              int m, int n, int k, const float* alpha, const float* a, int lda,
                              const float* b, int ldb, const float* beta, float* c, int ldc) {
  return gemm(h, ta, tb, m, n, k, *alpha, Type::f32, a, lda, Type::f32, b, ldb, *beta, Type::f32, c,
              ldc);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void* alpha, const void* a, cudaDataType a_t,
                            int lda, const void* b, cudaDataType b_t, int ldb, const void* beta,
                            void* c, cudaDataType c_t, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
  // fp32 compute takes float alpha and beta.
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a_t != b_t) return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm(h, ta, tb, m, n, k, *static_cast<const float*>(alpha), rt_emu::type_of(a_t), a, lda,
              rt_emu::type_of(b_t), b, ldb, *static_cast<const float*>(beta),
              rt_emu::type_of(c_t), c, ldc);
}

// y = alpha op(A) x + beta y, A m x n.
cublasStatus_t cublasSgemv_v2(cublasHandle_t h, cublasOperation_t t, int m, int n,
                              const float* alpha, const float* a, int lda, const float* x,
                              int incx, const float* beta, float* y, int incy) {
  if (!h || m < 0 || n < 0 || lda < std::max(1, m) || incx == 0 || incy == 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  const int rows = t == CUBLAS_OP_N ? m : n, cols = t == CUBLAS_OP_N ? n : m;
  rt_emu::enqueue(h->stream, [=, al = *alpha, be = *beta] {
    for (int i = 0; i < rows; ++i) {
      double s = 0;
      for (int j = 0; j < cols; ++j)
        s += at(Type::f32, a, lda, t, i, j) * x[int64_t(j) * incx];
      rt_emu::blend(Type::f32, y, int64_t(i) * incy, s, al, be);
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

// A += alpha x y^T, A m x n.
cublasStatus_t cublasSger_v2(cublasHandle_t h, int m, int n, const float* alpha, const float* x,
                             int incx, const float* y, int incy, float* a, int lda) {
  if (!h || m < 0 || n < 0 || lda < std::max(1, m) || incx == 0 || incy == 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  rt_emu::enqueue(h->stream, [=, al = *alpha] {
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i)
        a[int64_t(j) * lda + i] = float(a[int64_t(j) * lda + i] +
                                        double(al) * x[int64_t(i) * incx] * y[int64_t(j) * incy]);
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

// CublasLinear: row-major products expressed as cuBLAS's column-major GEMMs.
//
// A row-major matrix M (r x c) is, to cuBLAS, the column-major M^T (c x r) with leading
// dimension c. So, with X (N x I), W (O x I), Y and dY (N x O) all row-major:
//   Y  = X W^T   is  Y^T  (O x N) = op_T(W^T) X^T    : gemm(T, N, O, N, I, W, I, X, I, Y, O)
//   dX = dY W    is  dX^T (I x N) = W^T dY^T          : gemm(N, N, I, N, O, W, I, dY, O, dX, I)
//   dW = dY^T X  is  dW^T (I x O) = X^T op_T(dY^T)    : gemm(N, T, I, O, N, X, I, dY, O, dW, I)
// and the bias: Y^T += b 1^T (a rank-1 update), db = dY^T 1 (a matrix-vector product).
#include "cuda/cublas_linear.h"

#include <vector>

#include "cuda/check.h"

namespace rt::cuda {

CublasLinear::CublasLinear(const LinearDesc& d, CudaContext& ctx) : d_(d), ctx_(ctx) {
  d_.validate();
  n_ = lib_int(d_.in.n, d_, "cuBLAS", 1);
  in_ = lib_int(d_.in.chw(), d_, "cuBLAS", 1);
  out_ = lib_int(d_.out_features, d_, "cuBLAS", 1);
  if (d_.bias) {
    ones_ = DeviceBuffer(size_t(n_) * sizeof(float));
    const std::vector<float> ones(size_t(n_), 1.0f);
    ones_.upload(ones.data(), ones.size() * sizeof(float));
  }
}

void CublasLinear::forward(const float* x, const float* w, const float* b, float* y) {
  const float one = 1, zero = 0;
  cublasHandle_t h = ctx_.cublas();
  CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, out_, n_, in_, &one, w, in_, x, in_, &zero,
                           y, out_));
  if (d_.bias)
    CUBLAS_CHECK(cublasSger(h, out_, n_, &one, b, 1, ones_.as<float>(), 1, y, out_));
}

void CublasLinear::backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                            float* db) {
  const float one = 1, zero = 0;
  cublasHandle_t h = ctx_.cublas();
  if (dx)
    CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, in_, n_, out_, &one, w, in_, dy, out_,
                             &zero, dx, in_));
  CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, in_, out_, n_, &one, x, in_, dy, out_,
                           &zero, dw, in_));
  if (d_.bias)
    CUBLAS_CHECK(cublasSgemv(h, CUBLAS_OP_N, out_, n_, &one, dy, out_, ones_.as<float>(), 1,
                             &zero, db, 1));
}

}  // namespace rt::cuda

// Fully connected layer for the 16-bit backends: row-major products as cuBLAS column-major GEMMs
// (see cuda/cublas_linear.cc for the derivation), T = bf16 or f16 operands (Lowp<T>::blas), fp32
// accumulation (CUBLAS_COMPUTE_32F).
//
// The input is NHWC, so sample n's features are in (h, w, c) order; the private 16-bit weight
// copy is reordered to match ([out][h][w][c], the OHWI map of cuda/lowp_layout.h), and the fp32
// weight gradient is reordered back to the arena's [out][c][h][w]. With h = w = 1 (after global
// pooling) both orders are the same.
#include <climits>

#include "cuda/check.h"
#include "cuda/lowp_kernels.h"
#include "cuda/lowp_ops.h"
#include "cuda/cublas_linear.h"
#include "cuda/memory.h"

namespace rt::cuda {
namespace {

template <class T>
class LowpLinear final : public LinearOp<float> {
 public:
  LowpLinear(const LinearDesc& d, CudaContext& ctx) : d_(d), ctx_(ctx) {
    d_.validate();
    n_ = lib_int(d_.in.n, d_, "cuBLAS", 1);
    in_ = lib_int(d_.in.chw(), d_, "cuBLAS", 1);
    out_ = lib_int(d_.out_features, d_, "cuBLAS", 1);
    wg_ = {d_.out_features, d_.in.c, d_.in.h, d_.in.w};
    w16_ = DeviceBuffer(size_t(out_) * size_t(in_) * sizeof(T));
    dw32_ = DeviceBuffer(size_t(out_) * size_t(in_) * sizeof(float));
    y32_ = DeviceBuffer(size_t(n_) * size_t(out_) * sizeof(float));
    if (d_.bias) {
      bias_geom_ = channel_reduce_geom(n_, out_);
      bias_partial_ =
          DeviceBuffer(size_t(2 * bias_geom_.chunks * bias_geom_.channels) * sizeof(float));
    }
  }

  // Y^T (O x N) = op_T(W) X^T in fp32, then y = T(Y + b).
  void forward(const float* x, const float* w, const float* b, float* y) override {
    const float one = 1, zero = 0;
    weight_to_ohwi_lowp(w, w16_.as<T>(), wg_, ctx_.stream());
    CUBLAS_CHECK(cublasGemmEx(ctx_.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out_, n_, in_, &one,
                              w16_.get(), kType, in_, x, kType, in_, &zero,
                              y32_.get(), CUDA_R_32F, out_, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    f32_bias_to_lowp(y32_.as<float>(), d_.bias ? b : nullptr, reinterpret_cast<T*>(y), n_,
                     out_, ctx_.stream());
  }

  // dX^T (I x N) = W^T dY^T in T; dW^T (I x O) = X^T op_T(dY^T) in fp32; db = sums of dY.
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db) override {
    const float one = 1, zero = 0;
    cublasHandle_t h = ctx_.cublas();
    if (dx) {
      weight_to_ohwi_lowp(w, w16_.as<T>(), wg_, ctx_.stream());
      CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, in_, n_, out_, &one, w16_.get(),
                                kType, in_, dy, kType, out_, &zero, dx, kType,
                                in_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, in_, out_, n_, &one, x, kType,
                              in_, dy, kType, out_, &zero, dw32_.get(), CUDA_R_32F, in_,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    weight_grad_to_oihw(dw32_.as<float>(), dw, wg_, ctx_.stream());
    if (d_.bias) bias_grad<T>(dy, bias_partial_.as<float>(), bias_geom_, db, ctx_.stream());
  }

 private:
  static constexpr cudaDataType_t kType = Lowp<T>::blas;
  LinearDesc d_;
  CudaContext& ctx_;
  int n_ = 0, in_ = 0, out_ = 0;
  WeightGeom wg_;
  DeviceBuffer w16_, dw32_, y32_;
  ChannelReduceGeom bias_geom_;
  DeviceBuffer bias_partial_;
};

}  // namespace

template <class T>
std::unique_ptr<LinearOp<float>> make_lowp_linear(const LinearDesc& d, CudaContext& ctx) {
  return std::make_unique<LowpLinear<T>>(d, ctx);
}
template std::unique_ptr<LinearOp<float>> make_lowp_linear<bf16>(const LinearDesc&, CudaContext&);
template std::unique_ptr<LinearOp<float>> make_lowp_linear<f16>(const LinearDesc&, CudaContext&);

}  // namespace rt::cuda

// The device ReduceKernels: dispatch on DType, launch, wait for the stream.
#include "cuda/reduce_device.h"

#include "cuda/check.h"

namespace rt::cuda {

static_assert(int(Elem::f32) == int(DType::f32) && int(Elem::bf16) == int(DType::bf16) &&
              int(Elem::f16) == int(DType::f16));

Elem elem_of(DType t) { return Elem(t); }

namespace {

class DeviceReduceKernels final : public comm::ReduceKernels {
 public:
  explicit DeviceReduceKernels(cudaStream_t stream) : stream_(stream) {}

  void reduce_add(DType t, void* dst, const void* src, size_t n) const override {
    cuda::reduce_add(elem_of(t), dst, src, n, stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void scale(DType t, void* buf, size_t n, float s) const override {
    cuda::scale(elem_of(t), buf, n, s, stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void convert(DType to, void* dst, DType from, const void* src, size_t n,
               float s) const override {
    cuda::convert(elem_of(to), dst, elem_of(from), src, n, s, stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  bool supports(DType) const override { return true; }

 private:
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<comm::ReduceKernels> make_device_reduce_kernels(cudaStream_t stream) {
  return std::make_unique<DeviceReduceKernels>(stream);
}

}  // namespace rt::cuda

// The device ReduceKernels: dispatch on DType, launch, wait for the stream.
#include "cuda/reduce_device.h"

#include "cuda/check.h"
#include "cuda/memory.h"  // bind_device

namespace rt::cuda {

static_assert(int(Elem::f32) == int(DType::f32) && int(Elem::bf16) == int(DType::bf16) &&
              int(Elem::f16) == int(DType::f16));

Elem elem_of(DType t) { return Elem(t); }

namespace {

class DeviceReduceKernels final : public comm::ReduceKernels {
 public:
  // The stream's device is the one current here; each call binds it first, as the calls come from
  // the communication thread, which starts on device 0 whatever the rank's.
  explicit DeviceReduceKernels(cudaStream_t stream) : stream_(stream) {
    CUDA_CHECK(cudaGetDevice(&device_));
  }

  void reduce_add(DType t, void* dst, const void* src, size_t n) const override {
    bind_device(device_);
    cuda::reduce_add(elem_of(t), dst, src, n, stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void scale(DType t, void* buf, size_t n, float s) const override {
    bind_device(device_);
    cuda::scale(elem_of(t), buf, n, s, stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void convert(DType to, void* dst, DType from, const void* src, size_t n,
               float s) const override {
    bind_device(device_);
    cuda::convert(elem_of(to), dst, elem_of(from), src, n, s, stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  bool supports(DType) const override { return true; }

 private:
  cudaStream_t stream_;
  int device_ = 0;
};

}  // namespace

std::unique_ptr<comm::ReduceKernels> make_device_reduce_kernels(cudaStream_t stream) {
  return std::make_unique<DeviceReduceKernels>(stream);
}

}  // namespace rt::cuda

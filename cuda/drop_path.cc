// DeviceDropPath: the factors' buffers at set-up, their upload and the launches per step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/drop_path.h"
#include "cuda/memory.h"

namespace rt::cuda {
namespace {

template <class T>
class DeviceDropPath final : public DropPathOp<float> {
 public:
  DeviceDropPath(const DropPathDesc& d, int64_t per_sample, CudaContext& ctx)
      : n_(d.in.n), per_sample_(per_sample), stream_(ctx.stream()),
        scales_(size_t(d.in.n) * sizeof(float)), bytes_(size_t(d.in.n) * sizeof(float)) {
    host_ = static_cast<float*>(pinned_malloc(bytes_));
    CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
  }
  ~DeviceDropPath() override {
    try {
      cudaEventSynchronize(uploaded_);  // the last upload reads the page-locked mirror
      CUDA_CHECK(cudaEventDestroy(uploaded_));
      pinned_free(host_, bytes_);
    } catch (const Error&) {  // a dead context at exit: nothing left to free
    }
  }
  DeviceDropPath(const DeviceDropPath&) = delete;
  DeviceDropPath& operator=(const DeviceDropPath&) = delete;

  void forward(const float* x, const float* scales, float* y) override {
    // The mirror is refilled once the last upload from it is done (at once in a step that synced).
    CUDA_CHECK(cudaEventSynchronize(uploaded_));
    if (scales) std::copy(scales, scales + n_, host_);
    else std::fill(host_, host_ + n_, 1.0f);
    CUDA_CHECK(cudaMemcpyAsync(scales_.get(), host_, bytes_, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(uploaded_, stream_));
    drop_path_launch(reinterpret_cast<const T*>(x), scales_.as<float>(), reinterpret_cast<T*>(y), n_, per_sample_,
                     stream_);
  }
  void backward(const float* dy, float* dx) override {
    drop_path_launch(reinterpret_cast<const T*>(dy), scales_.as<float>(), reinterpret_cast<T*>(dx), n_,
                     per_sample_, stream_);
  }

 private:
  int64_t n_, per_sample_;
  cudaStream_t stream_;
  DeviceBuffer scales_;  // the last forward's, on the device
  size_t bytes_;
  float* host_ = nullptr;
  cudaEvent_t uploaded_ = nullptr;
};

}  // namespace

template <class T>
std::unique_ptr<DropPathOp<float>> make_device_drop_path(const DropPathDesc& d, int64_t per_sample,
                                                         CudaContext& ctx) {
  d.validate();
  return std::make_unique<DeviceDropPath<T>>(d, per_sample, ctx);
}

template std::unique_ptr<DropPathOp<float>> make_device_drop_path<float>(const DropPathDesc&, int64_t, CudaContext&);
template std::unique_ptr<DropPathOp<float>> make_device_drop_path<__nv_bfloat16>(const DropPathDesc&, int64_t,
                                                                                 CudaContext&);
template std::unique_ptr<DropPathOp<float>> make_device_drop_path<__half>(const DropPathDesc&, int64_t, CudaContext&);

}  // namespace rt::cuda

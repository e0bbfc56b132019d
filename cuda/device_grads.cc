// CUDA gradient hooks: event fences, pinned-mirror staging on copy streams (compressed to 16 bits
// on the device when asked), direct-path kernels.
#include "cuda/device_grads.h"

#include <vector>

#include "cuda/check.h"
#include "cuda/memory.h"
#include "cuda/reduce_device.h"

namespace rt::cuda {
namespace {

using comm::DevicePath;

// The direct path's receive scratch: device memory through the counted allocator. Each call is
// done when it returns (the legacy stream, synchronized): the reduce stream and the MPI library's
// own streams do not wait for the legacy stream.
class ScratchSpace final : public MemorySpace {
 public:
  std::string name() const override { return "cuda device (allreduce scratch)"; }
  void* allocate(size_t bytes) const override {
    void* p = device_malloc(bytes);
    try {
      zero(p, bytes);
    } catch (...) {
      deallocate(p, bytes);
      throw;
    }
    return p;
  }
  void deallocate(void* p, size_t bytes) const noexcept override {
    try {
      device_free(p, bytes);
    } catch (const Error&) {  // a dead context at exit: nothing left to free
    }
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    finish_legacy_stream();
  }
  void zero(void* p, size_t bytes) const override {
    CUDA_CHECK(cudaMemset(p, 0, bytes));
    finish_legacy_stream();
  }
  void to_host(void* host_dst, const void* src, size_t bytes) const override {
    CUDA_CHECK(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  void from_host(void* dst, const void* host_src, size_t bytes) const override {
    CUDA_CHECK(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
    finish_legacy_stream();
  }
  bool host_accessible() const override { return false; }
};

// A ring of events, one per fence or download a step makes. Reusing a slot re-records its event;
// a wait on the old token then waits for the newer, later point of the same stream, which is
// later than needed but never too early, so even more uses per step than slots stay correct.
class EventRing {
 public:
  void create(size_t n) {
    events_.assign(n, nullptr);
    for (cudaEvent_t& e : events_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  void destroy() noexcept {
    for (cudaEvent_t e : events_)
      if (e) cudaEventDestroy(e);
    events_.clear();
  }
  cudaEvent_t at(uint64_t token) const { return events_[token % events_.size()]; }

 private:
  std::vector<cudaEvent_t> events_;
};

class CudaDeviceGrads final : public comm::DeviceGrads {
 public:
  CudaDeviceGrads(cudaStream_t compute, DevicePath path) : compute_(compute), path_(path) {
    CUDA_CHECK(cudaGetDevice(&gpu_));  // the backend's device: made current where it was built
  }
  ~CudaDeviceGrads() override { release(); }

  DevicePath path() const override { return path_; }

  bool stage_as(DType wire, float scale) override {
    if (path_ != DevicePath::staged || set_up_) return false;
    wire_ = wire;
    scale_ = scale;
    return true;
  }

  void setup(void* device, size_t bytes, size_t per_step) override {
    if (set_up_) throw Error("cuda device grads: set up twice (one GradientReducer per hooks)");
    set_up_ = true;
    device_ = static_cast<char*>(device);
    bytes_ = bytes;
    const size_t slots = per_step > 0 ? per_step : 1;
    fences_.create(slots);
    if (path_ == DevicePath::staged) {
      mirror_bytes_ = staged_bytes(bytes);
      mirror_ = static_cast<char*>(pinned_malloc(mirror_bytes_));
      // Compressed: the 16-bit values on the device too, converted there on the copy streams.
      if (wire_ != DType::f32) wire_dev_ = static_cast<char*>(device_malloc(mirror_bytes_));
      // Downloads and uploads on separate streams: the copy engines of each direction run at
      // once, so the upload of one bucket does not hold up the download of the next.
      CUDA_CHECK(cudaStreamCreateWithFlags(&down_, cudaStreamNonBlocking));
      CUDA_CHECK(cudaStreamCreateWithFlags(&up_, cudaStreamNonBlocking));
      downloads_.create(slots);
    } else {
      // Not the compute stream: each reduce kernel waits for its stream, which must not mean
      // waiting for the rest of backward.
      CUDA_CHECK(cudaStreamCreateWithFlags(&reduce_, cudaStreamNonBlocking));
      kernels_ = make_device_reduce_kernels(reduce_);
    }
  }

  uint64_t record() override {
    if (!set_up_) throw Error("cuda device grads: record() before setup()");
    CUDA_CHECK(cudaEventRecord(fences_.at(recorded_), compute_));
    return recorded_++;
  }
  void wait(uint64_t token) override {
    bind();
    CUDA_CHECK(cudaEventSynchronize(fences_.at(token)));
  }

  const comm::ReduceKernels& kernels() const override {
    if (!kernels_) throw Error("cuda device grads: kernels() belong to the direct path");
    return *kernels_;
  }
  const MemorySpace* scratch_space() const override { return &scratch_; }

  char* host() override { return mirror_; }

  uint64_t download(size_t offset, size_t bytes, uint64_t after) override {
    check_range("download", offset, bytes);
    // Ordered behind the fence on the device: the host does not wait for backward here.
    CUDA_CHECK(cudaStreamWaitEvent(down_, fences_.at(after), 0));
    if (wire_dev_) {
      const size_t at = staged_bytes(offset), n = bytes / sizeof(float);
      convert(elem_of(wire_), wire_dev_ + at, Elem::f32, device_ + offset, n, scale_, down_);
      CUDA_CHECK(cudaMemcpyAsync(mirror_ + at, wire_dev_ + at, staged_bytes(bytes), cudaMemcpyDeviceToHost, down_));
    } else {
      CUDA_CHECK(cudaMemcpyAsync(mirror_ + offset, device_ + offset, bytes, cudaMemcpyDeviceToHost, down_));
    }
    CUDA_CHECK(cudaEventRecord(downloads_.at(downloaded_), down_));
    return downloaded_++;
  }
  void download_wait(uint64_t ticket) override {
    bind();
    CUDA_CHECK(cudaEventSynchronize(downloads_.at(ticket)));
  }
  void upload(size_t offset, size_t bytes) override {
    bind();
    check_range("upload", offset, bytes);
    if (wire_dev_) {
      const size_t at = staged_bytes(offset), n = bytes / sizeof(float);
      CUDA_CHECK(cudaMemcpyAsync(wire_dev_ + at, mirror_ + at, staged_bytes(bytes), cudaMemcpyHostToDevice, up_));
      convert(Elem::f32, device_ + offset, elem_of(wire_), wire_dev_ + at, n, 1.0f, up_);
    } else {
      CUDA_CHECK(cudaMemcpyAsync(device_ + offset, mirror_ + offset, bytes, cudaMemcpyHostToDevice, up_));
    }
  }
  void upload_wait() override {
    bind();
    CUDA_CHECK(cudaStreamSynchronize(up_));
  }

 private:
  // The current device is per thread: the communication thread starts on device 0, and the
  // direct path's kernels must launch on the device their stream belongs to.
  void bind() const { bind_device(gpu_); }
  // The staged copy of `bytes` of the fp32 buffer: as long, or half as long in a 16-bit wire type.
  size_t staged_bytes(size_t bytes) const { return bytes / sizeof(float) * dtype_size(wire_); }
  void check_range(const char* what, size_t offset, size_t bytes) const {
    if (!mirror_ || offset > bytes_ || bytes > bytes_ - offset)
      throw Error(str_cat("cuda device grads: ", what, " of ", bytes, " bytes at ", offset,
                          mirror_ ? " outside the buffer of " : " without staging set up; buffer ",
                          bytes_));
  }
  // Never throws (destructor): failures while tearing down (a dead context at exit) are dropped.
  void release() noexcept {
    for (cudaStream_t s : {down_, up_, reduce_}) {
      if (!s) continue;
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
    down_ = up_ = reduce_ = nullptr;
    kernels_.reset();
    fences_.destroy();
    downloads_.destroy();
    try {
      pinned_free(mirror_, mirror_bytes_);
    } catch (const Error&) {
    }
    try {
      device_free(wire_dev_, mirror_bytes_);
    } catch (const Error&) {
    }
    mirror_ = wire_dev_ = nullptr;
  }

  cudaStream_t compute_;
  int gpu_ = 0;
  DevicePath path_;
  bool set_up_ = false;
  char* device_ = nullptr;
  size_t bytes_ = 0;
  EventRing fences_;           // recorded on compute_
  uint64_t recorded_ = 0;      // fences so far (the reporting thread's)
  // staged
  char* mirror_ = nullptr;     // pinned, mirror_bytes_ long: fp32 values, or wire_ values
  size_t mirror_bytes_ = 0;
  DType wire_ = DType::f32;    // stage_as: the 16-bit type the copies carry ...
  float scale_ = 1;            // ... and the factor applied before rounding to it
  char* wire_dev_ = nullptr;   // compressed: the wire_ values on the device, mirror_bytes_ long
  cudaStream_t down_ = nullptr, up_ = nullptr;
  EventRing downloads_;        // recorded on down_ after each download
  uint64_t downloaded_ = 0;    // downloads so far (the reporting thread's)
  // direct
  cudaStream_t reduce_ = nullptr;
  std::unique_ptr<comm::ReduceKernels> kernels_;
  ScratchSpace scratch_;
};

}  // namespace

std::unique_ptr<comm::DeviceGrads> make_device_grads(cudaStream_t compute, comm::DevicePath path) {
  return std::make_unique<CudaDeviceGrads>(compute, path);
}

}  // namespace rt::cuda

// DeviceBackend: the CUDA backends' shared optimizer and gradient pass (see device_backend.h).
#include "cuda/device_backend.h"

#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/sgd.h"

namespace rt::cuda {

DeviceBackend::~DeviceBackend() {
  cudaStreamSynchronize(ctx_.stream());
  for (cudaEvent_t e : marks_)
    if (e) cudaEventDestroy(e);
}

void DeviceBackend::mark_compute(int which) {
  if (which != 0 && which != 1) throw Error(str_cat("mark_compute: mark 0 or 1, got ", which));
  if (!marks_[which]) CUDA_CHECK(cudaEventCreate(&marks_[which]));  // with timing
  CUDA_CHECK(cudaEventRecord(marks_[which], ctx_.stream()));
  marked_[which] = true;
  if (which == 0) marked_[1] = false;
}

double DeviceBackend::compute_seconds() const {
  if (!marked_[0] || !marked_[1]) return -1;
  float ms = 0;
  if (cudaEventElapsedTime(&ms, marks_[0], marks_[1]) != cudaSuccess) {
    cudaGetLastError();  // not done yet (no sync since): no figure rather than a wrong one
    return -1;
  }
  return ms / 1e3;
}

// The input copy too: its host bytes are free once sync() returns (Backend::stage_input).
std::string DeviceBackend::setup_note() const {
  const ContextConfig& c = ctx_.config();
  return str_cat("cuDNN convolution algorithms ", c.benchmark_algos ? "timed" : "by heuristics",
                 c.deterministic ? " (deterministic only)" : "", ": ", ctx_.conv_algos().summary());
}

void DeviceBackend::sync() const {
  CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  input_.sync();
}

std::unique_ptr<Optimizer<float>> DeviceBackend::make_sgd(std::vector<ParamInfo> layout, SgdConfig cfg) {
  return std::make_unique<DeviceSgdOptimizer>(layout, cfg, ctx_.stream());
}

size_t DeviceBackend::scale_count_nonfinite(float* v, size_t n, float s, bool count) {
  if (!count) {
    if (s != 1.0f) scale(Elem::f32, v, n, s, ctx_.stream());
    return 0;
  }
  CUDA_CHECK(cudaMemsetAsync(flag_.get(), 0, sizeof(int), ctx_.stream()));
  if (s != 1.0f) unscale_check(Elem::f32, v, n, s, flag_.as<int>(), ctx_.stream());
  else nonfinite_check(Elem::f32, v, n, flag_.as<int>(), ctx_.stream());
  int flagged = 0;
  CUDA_CHECK(cudaMemcpyAsync(&flagged, flag_.get(), sizeof(int), cudaMemcpyDeviceToHost, ctx_.stream()));
  CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  return flagged ? Backend<float>::scale_count_nonfinite(v, n, 1.0f, true) : 0;  // counts on a host copy
}

double DeviceBackend::sum_squares(const float* v, size_t n) const {
  const size_t chunks = (n + kSquaresChunk - 1) / kSquaresChunk;
  if (chunks == 0) return 0;
  if (squares_.bytes() < chunks * sizeof(double)) {  // the arena's size: allocates once
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));  // the old buffer may still be written
    squares_ = DeviceBuffer();
    squares_ = DeviceBuffer(chunks * sizeof(double));
  }
  squares_host_.resize(chunks);
  cuda::chunk_squares(v, n, uint32_t(kSquaresChunk), squares_.as<double>(), ctx_.stream());
  CUDA_CHECK(cudaMemcpyAsync(squares_host_.data(), squares_.get(), chunks * sizeof(double),
                             cudaMemcpyDeviceToHost, ctx_.stream()));
  CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  double sum = 0;  // in order, as Backend::sum_squares_host
  for (size_t c = 0; c < chunks; ++c) sum += squares_host_[c];
  return sum;
}

void DeviceBackend::import_u8(const uint8_t* nhwc, const Shape& s, const NormParams& p, Elem out,
                              void* dst) const {
  RT_SHAPE_CHECK(s.c == 3, "8-bit input needs 3 channels (RGB), got shape ", s.str());
  const size_t bytes = size_t(s.numel());
  NormalizeParams np;
  for (int c = 0; c < 3; ++c) np.scale[c] = p.scale[c], np.shift[c] = p.shift[c];
  np.nchw = out == Elem::f32;  // the 16-bit backends keep activations NHWC
  auto run = [&](const void* dev) {
    normalize_u8(out, static_cast<const uint8_t*>(dev), dst, s.n, s.h, s.w, np, ctx_.stream());
  };
  if (input_.consume(nhwc, bytes, run)) return;
  if (u8_upload_.bytes() < bytes) {
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));  // the old buffer may still be read
    u8_upload_ = DeviceBuffer();
    u8_upload_ = DeviceBuffer(bytes);
  }
  CUDA_CHECK(cudaMemcpyAsync(u8_upload_.get(), nhwc, bytes, cudaMemcpyHostToDevice, ctx_.stream()));
  run(u8_upload_.get());
  // The caller may reuse its buffer on return: wait only where CUDA reads it later.
  if (is_page_locked(nhwc)) CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
}

}  // namespace rt::cuda

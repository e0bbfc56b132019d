// DeviceSoftmaxXent: buffers at set-up, launches and the loss read-back per step.
#include "cuda/softmax_xent.h"

#include <algorithm>

#include "cuda/check.h"
#include "cuda/softmax_xent_kernel.h"

namespace rt::cuda {

DeviceSoftmaxXent::DeviceSoftmaxXent(const SoftmaxXentDesc& d, cudaStream_t stream)
    : d_(d), stream_(stream) {
  d_.validate();
  const size_t n = size_t(d_.in.n);
  prob_ = DeviceBuffer(n * size_t(d_.in.c) * sizeof(float));
  row_loss_ = DeviceBuffer(n * sizeof(float));
  labels_ = DeviceBuffer(n * sizeof(int32_t));
  result_ = DeviceBuffer(sizeof(Result));
  pinned_bytes_ = sizeof(Result) + n * sizeof(int32_t);
  void* pinned = pinned_malloc(pinned_bytes_);
  host_result_ = static_cast<Result*>(pinned);
  host_labels_ = reinterpret_cast<int32_t*>(static_cast<char*>(pinned) + sizeof(Result));
  *host_result_ = Result{0.0, -1};
  CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

DeviceSoftmaxXent::~DeviceSoftmaxXent() {
  try {
    if (done_) {
      cudaEventSynchronize(done_);  // the last forward's copy into the page-locked block
      CUDA_CHECK(cudaEventDestroy(done_));
    }
    pinned_free(host_result_, pinned_bytes_);
  } catch (const Error&) {  // a dead context at exit: nothing left to free
  }
}

void DeviceSoftmaxXent::forward(const float* logits, const int32_t* labels) {
  // The last forward's copies read and write the mirror: done before it is refilled (at once,
  // in a step that synced since).
  CUDA_CHECK(cudaEventSynchronize(done_));
  const size_t n = size_t(d_.in.n);
  std::copy(labels, labels + n, host_labels_);
  CUDA_CHECK(cudaMemcpyAsync(labels_.get(), host_labels_, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  XentArgs a;
  a.n = d_.in.n;
  a.k = d_.in.c;
  a.label_smoothing = float(d_.label_smoothing);
  a.logits = logits;
  a.labels = labels_.as<int32_t>();
  a.prob = prob_.as<float>();
  a.row_loss = row_loss_.as<float>();
  Result* dev = result_.as<Result>();
  a.mean_loss = &dev->mean_loss;
  a.bad_row = &dev->bad_row;
  CUDA_CHECK(cudaMemsetAsync(a.bad_row, 0xff, sizeof(int), stream_));  // -1: no bad row
  xent_forward_launch(a, stream_);
  CUDA_CHECK(cudaMemcpyAsync(host_result_, dev, sizeof(Result), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaEventRecord(done_, stream_));
}

double DeviceSoftmaxXent::loss() {
  CUDA_CHECK(cudaEventSynchronize(done_));
  const int bad = host_result_->bad_row;
  if (bad >= 0)
    throw Error(str_cat(d_.name, ": label ", host_labels_[bad], " of sample ", bad, " is outside [0, ",
                        d_.in.c, ") for logits ", d_.in.str()));
  return host_result_->mean_loss;
}

void DeviceSoftmaxXent::backward(const int32_t*, float* dlogits, double scale) {
  XentArgs a;
  a.n = d_.in.n;
  a.k = d_.in.c;
  a.label_smoothing = float(d_.label_smoothing);
  a.labels = labels_.as<int32_t>();
  a.prob = prob_.as<float>();
  xent_backward_launch(a, dlogits, float(scale), stream_);
}

}  // namespace rt::cuda

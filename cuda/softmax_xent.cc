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
  labels_ = DeviceBuffer(2 * n * sizeof(int32_t));  // a blend's second labels after the first
  result_ = DeviceBuffer(sizeof(Result));
  pinned_bytes_ = sizeof(Result) + 2 * n * sizeof(int32_t);
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

XentArgs DeviceSoftmaxXent::args() const {
  XentArgs a;
  a.n = d_.in.n;
  a.k = d_.in.c;
  a.label_smoothing = float(d_.loss.label_smoothing);
  a.bce = d_.loss.kind == LossKind::bce;
  a.bce_threshold = float(d_.loss.bce_threshold);
  a.labels = labels_.as<int32_t>();
  a.mixed = mixed_ ? a.labels + d_.in.n : a.labels;  // not blended: the labels with themselves
  a.mix = mixed_ ? mix_ : 1.0f;
  a.prob = prob_.as<float>();
  return a;
}

void DeviceSoftmaxXent::forward(const float* logits, const Targets& t) {
  d_.check_mix(t);
  // The last forward's copies read and write the mirror: done before it is refilled (at once,
  // in a step that synced since).
  CUDA_CHECK(cudaEventSynchronize(done_));
  const size_t n = size_t(d_.in.n);
  std::copy(t.labels, t.labels + n, host_labels_);
  if (t.mixed) std::copy(t.mixed, t.mixed + n, host_labels_ + n);
  mixed_ = t.mixed != nullptr;
  mix_ = float(t.mix);
  CUDA_CHECK(cudaMemcpyAsync(labels_.get(), host_labels_, (mixed_ ? 2 : 1) * n * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream_));
  XentArgs a = args();
  a.logits = logits;
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
  if (bad >= 0) {
    const int32_t label = host_labels_[bad], k = int32_t(d_.in.c);
    const bool first = label >= 0 && label < k;  // else the mixed-in label is the bad one
    throw Error(str_cat(d_.name, ": ", first ? "mixed-in label " : "label ", first ? host_labels_[d_.in.n + bad] : label,
                        " of sample ", bad, " is outside [0, ", k, ") for logits ", d_.in.str()));
  }
  return host_result_->mean_loss;
}

void DeviceSoftmaxXent::backward(const Targets&, float* dlogits, double scale) {
  xent_backward_launch(args(), dlogits, float(scale), stream_);
}

}  // namespace rt::cuda

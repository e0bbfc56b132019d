// DeviceSoftmaxXent: buffers at set-up, launches and the loss read-back per step.
#include "cuda/softmax_xent.h"

#include "cuda/check.h"
#include "cuda/softmax_xent_kernel.h"

namespace rt::cuda {

DeviceSoftmaxXent::DeviceSoftmaxXent(const SoftmaxXentDesc& d, cudaStream_t stream)
    : d_(d), stream_(stream) {
  d_.validate();
  prob_ = DeviceBuffer(size_t(d_.in.n * d_.in.c) * sizeof(float));
  row_loss_ = DeviceBuffer(size_t(d_.in.n) * sizeof(float));
  result_ = DeviceBuffer(sizeof(Result));
  host_result_ = static_cast<Result*>(pinned_malloc(sizeof(Result)));
}

DeviceSoftmaxXent::~DeviceSoftmaxXent() {
  try {
    pinned_free(host_result_, sizeof(Result));
  } catch (const Error&) {  // a dead context at exit: nothing left to free
  }
}

double DeviceSoftmaxXent::forward(const float* logits, const int32_t* labels) {
  XentArgs a;
  a.n = d_.in.n;
  a.k = d_.in.c;
  a.label_smoothing = float(d_.label_smoothing);
  a.logits = logits;
  a.labels = labels;
  a.prob = prob_.as<float>();
  a.row_loss = row_loss_.as<float>();
  Result* dev = result_.as<Result>();
  a.mean_loss = &dev->mean_loss;
  a.bad_row = &dev->bad_row;
  CUDA_CHECK(cudaMemsetAsync(a.bad_row, 0xff, sizeof(int), stream_));  // -1: no bad row
  xent_forward_launch(a, stream_);
  CUDA_CHECK(cudaMemcpyAsync(host_result_, dev, sizeof(Result), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  const double mean = host_result_->mean_loss;
  const int bad = host_result_->bad_row;
  if (bad >= 0) {
    int32_t label = 0;
    CUDA_CHECK(cudaMemcpy(&label, labels + bad, sizeof label, cudaMemcpyDeviceToHost));
    throw Error(str_cat(d_.name, ": label ", label, " of sample ", bad, " is outside [0, ",
                        d_.in.c, ") for logits ", d_.in.str()));
  }
  return mean;
}

void DeviceSoftmaxXent::backward(const int32_t* labels, float* dlogits, double scale) {
  XentArgs a;
  a.n = d_.in.n;
  a.k = d_.in.c;
  a.label_smoothing = float(d_.label_smoothing);
  a.labels = labels;
  a.prob = prob_.as<float>();
  xent_backward_launch(a, dlogits, float(scale), stream_);
}

}  // namespace rt::cuda

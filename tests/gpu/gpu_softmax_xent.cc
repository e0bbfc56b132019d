// Device softmax cross-entropy against the reference backend (double inside).
#include <cmath>
#include <random>

#include "cuda/check.h"
#include "cuda/softmax_xent.h"
#include "tests/gpu/gpu_test_util.h"

namespace rt::cuda {
namespace {

using test::to_device;
using test::to_host;

// mix >= 0: mixup targets (the labels reversed as the partners) of that weight. threshold < -1:
// softmax cross-entropy, else BCE with that target threshold.
void compare(int64_t n, int64_t k, double eps, double scale, double mix = -1, double threshold = -2) {
  const LossKind kind = threshold < -1 ? LossKind::softmax : LossKind::bce;
  SoftmaxXentDesc d{"loss", Shape{n, k, 1, 1}, {kind, eps, threshold < -1 ? -1 : threshold}};
  std::mt19937 g(uint32_t(n * 131 + k));
  std::normal_distribution<float> z(0, 4);
  std::vector<float> logits(size_t(n * k));
  for (float& x : logits) x = z(g);
  logits[0] = 80;  // large logits: the max subtraction (softmax) and the softplus's form (BCE)
  logits[1] = -80; //   keep exp finite
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int32_t& l : labels) l = int32_t(g() % uint32_t(k));
  std::vector<int32_t> mixed(labels.rbegin(), labels.rend());
  const Targets t = mix >= 0 ? Targets(labels.data(), mixed.data(), mix) : Targets(labels.data());
  auto ref = make_backend<float>("reference")->make_softmax_xent(d);
  const double want = forward_loss(*ref, logits.data(), t);
  std::vector<float> want_grad(logits.size());
  ref->backward(t, want_grad.data(), scale);

  DeviceBuffer dl = to_device(logits), dgrad(logits.size() * 4);
  DeviceSoftmaxXent op(d, nullptr);
  op.forward(dl.as<float>(), t);
  // The host's labels may change at once: forward took a copy of them, backward uses it.
  for (int32_t& l : labels) l = int32_t((l + 1) % k);
  for (int32_t& l : mixed) l = int32_t((l + 2) % k);
  op.backward(t, dgrad.as<float>(), scale);
  const double got = op.loss();
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::string at = str_cat(n, "x", k, " eps ", eps, " mix ", mix, " ", loss_kind_name(kind), " ", threshold);
  EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want))) << at;
  const auto grad = to_host<float>(dgrad, logits.size());
  for (size_t i = 0; i < grad.size(); ++i)
    ASSERT_NEAR(grad[i], want_grad[i], 1e-7 * scale + 1e-4 * std::abs(want_grad[i])) << at << " at " << i;
}

TEST(GpuSoftmaxXent, MatchesReference) {
  RT_REQUIRE_GPU();
  for (double eps : {0.0, 0.1}) {
    compare(5, 10, eps, 1.0);
    compare(32, 1000, eps, 1.0);   // ImageNet classes: more than one thread per class
    compare(3, 1, eps, 1.0);       // a single class: loss 0
    compare(256, 100, eps, 1024);  // loss scaling
    compare(33, 1000, eps, 1.0, 0.3);  // mixup (the middle row mixed with itself)
    compare(8, 10, eps, 4.0, 1.0);
  }
}

// BCE: soft, blended and thresholded targets; logits to +-80 (no overflow in the softplus).
TEST(GpuSoftmaxXent, BceMatchesReference) {
  RT_REQUIRE_GPU();
  for (double eps : {0.0, 0.1})
    for (double threshold : {-1.0, 0.2}) {
      compare(5, 10, eps, 1.0, -1, threshold);
      compare(32, 1000, eps, 1.0, -1, threshold);
      compare(3, 1, eps, 1.0, -1, threshold);
      compare(256, 100, eps, 1024, -1, threshold);
      compare(33, 1000, eps, 1.0, 0.3, threshold);
    }
}

// A bad mixed-in label is named as such; the first label's are checked too.
TEST(GpuSoftmaxXent, BadMixedInLabelIsNamed) {
  RT_REQUIRE_GPU();
  SoftmaxXentDesc d{"loss", Shape{4, 10, 1, 1}};
  std::vector<float> logits(4 * 10, 0.0f);
  const std::vector<int32_t> labels = {1, 2, 3, 4}, mixed = {4, 12, 2, 1};
  DeviceBuffer dl = to_device(logits);
  DeviceSoftmaxXent op(d, nullptr);
  try {
    op.forward(dl.as<float>(), Targets(labels.data(), mixed.data(), 0.5));
    op.loss();
    FAIL() << "no error for mixed-in label 12 of 10 classes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mixed-in label 12 of sample 1"), std::string::npos) << e.what();
  }
}

// The first bad sample is named, whichever row's block finishes first on the device (blocks run
// in any order there; the emulator runs them in order, so only a GPU can catch a race here).
TEST(GpuSoftmaxXent, BadLabelNamesTheSample) {
  RT_REQUIRE_GPU();
  SoftmaxXentDesc d{"loss", Shape{1024, 10, 1, 1}};
  std::vector<float> logits(1024 * 10, 0.0f);
  std::vector<int32_t> labels(1024, 3);
  labels[2] = 10;
  for (size_t i = 100; i < labels.size(); i += 7) labels[i] = -1;
  DeviceBuffer dl = to_device(logits);
  DeviceSoftmaxXent op(d, nullptr);
  try {
    op.forward(dl.as<float>(), labels.data());
    labels[2] = 1;  // the message names the label forward saw
    op.loss();
    FAIL() << "no error for label 10 of 10 classes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 10 of sample 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rt::cuda

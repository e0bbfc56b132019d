// A small ResNet overfits one fixed batch: the loss falls toward zero in a few dozen SGD steps,
// on the reference backend and on oneDNN; an SE-ResNet and an ECA-ResNet too.
#include <gtest/gtest.h>

#include <random>

#include "nn/optimizer.h"
#include "nn/resnet.h"

namespace rt {
namespace {

// resnet20 at width 0.5: 8/16/32 channels, quick on the reference backend too.
// eval: also classify the batch in evaluation mode (running statistics).
void expect_overfits(const std::string& backend, const std::string& model = "resnet20", double width = 0.5,
                     int64_t size = 16, bool eval = true) {
  ResNetConfig c;
  c.name = model;
  c.width = width;
  c.num_classes = 5;
  c.image_size = size;
  c.batch = 10;
  c.seed = 1;
  auto net = build_resnet<float>(c, make_backend<float>(backend));
  SgdConfig sc;
  sc.weight_decay = 0;
  Sgd<float> opt(net->arena().layout(), sc);
  std::mt19937_64 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> x(net->shape(0).numel());
  for (auto& v : x) v = nd(rng);
  std::vector<int32_t> y(c.batch);
  for (int i = 0; i < c.batch; ++i) y[i] = i % 5;
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    last = net->forward(x.data(), y.data(), true);
    if (step == 0) first = last;
    net->backward();
    opt.step(net->arena().params().data(), net->arena().grads().data(), 0.05);
  }
  EXPECT_NEAR(first, std::log(5.0), 0.5) << backend << " " << model;  // starts near chance
  EXPECT_LT(last, 0.05) << backend << " " << model << ": loss " << first << " -> " << last;
  if (!eval) return;
  // Evaluation mode (running statistics) classifies the memorised batch too.
  net->forward(x.data(), y.data(), false);
  std::vector<float> logits(c.batch * 5);
  net->export_tensor(net->logits(), logits.data());
  int correct = 0;
  for (int i = 0; i < c.batch; ++i)
    correct += std::max_element(&logits[i * 5], &logits[i * 5 + 5]) - &logits[i * 5] == y[i];
  EXPECT_GE(correct, 8) << backend << " " << model;
}

TEST(Overfit, ReferenceBackend) { expect_overfits("reference"); }
TEST(Overfit, OnednnBackend) { expect_overfits("onednn"); }
// Squeeze-and-excitation: every block's branch scaled by its gate, which learns too.
TEST(Overfit, SeResNetOnBothBackends) {
  for (const char* backend : {"reference", "onednn"}) expect_overfits(backend, "seresnet18", 0.125, 32);
}
// ECA on a ResNet-T: the tiered stem, pooled shortcuts and each block's channel convolution learn.
// Training mode only: a bottleneck net at 32 pixels has 1x1 maps in layer4, 10 values per
// channel, whose batch norms' running statistics still lag after 40 steps (resnet50 there
// classifies 2 of the 10 in evaluation mode as well).
TEST(Overfit, EcaResNetOnBothBackends) {
  for (const char* backend : {"reference", "onednn"}) expect_overfits(backend, "ecaresnet26t", 0.125, 32, false);
}

}  // namespace
}  // namespace rt

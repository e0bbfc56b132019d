// ECA-ResNets and ResNet-Ts (timm's ecaresnet*, resnet26t/50t): parameter counts, names, kernel
// sizes and the tiered stem equal to timm's, the gradient of whole networks against finite
// differences (the channel convolution op alone: test_ref_gradcheck.cc and test_ref_layers.cc;
// against PyTorch's logits: tests/tools/test_torch_weights_se.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "nn/resnet.h"

namespace rt {
namespace {

template <class T = float>
std::unique_ptr<Net<T>> build(const std::string& name, bool layout_only, int64_t size = 64, double width = 1.0,
                              int64_t classes = 1000, int64_t batch = 1) {
  ResNetConfig c;
  c.name = name;
  c.num_classes = classes;
  c.image_size = size;
  c.batch = batch;
  c.width = width;
  c.layout_only = layout_only;
  c.seed = 3;
  return build_resnet<T>(c, make_backend<T>("reference"));
}

std::vector<int64_t> dims(const Net<float>& net, const std::string& name) {
  for (const ParamInfo& p : net.arena().registered())
    if (p.name == name) return p.dims;
  return {};
}

TEST(EcaResNet, ParameterCountsEqualTimms) {
  // sum(p.numel() for p in model.parameters()) of timm's models (25,576,350 for ecaresnet50d:
  // resnet50d's and one kernel of 5 or 7 weights a block), as tools/torch_se_models.py builds them.
  const std::pair<const char*, size_t> counts[] = {
      {"ecaresnet26t", 16011916},   {"ecaresnet50d", 25576350},  {"ecaresnet50t", 25573814},
      {"ecaresnet101d", 44568563},  {"ecaresnetlight", 30162046}, {"resnet26t", 16011872},
      {"resnet50t", 25573728}};
  for (auto [name, n] : counts) EXPECT_EQ(build(name, true)->arena().param_count(), n) << name;
}

TEST(EcaResNet, TimmsNamesKernelsAndStems) {
  using D = std::vector<int64_t>;
  auto net = build("ecaresnet50t", true);
  // timm's EcaModule is the block's `se`: its Conv1d(1, 1, k), k = 5 on 256 to 1024 channels, 7 on
  // 2048 (t = int(|log2 c + 1| / 2), made odd).
  EXPECT_EQ(dims(*net, "layer1.0.se.conv.weight"), (D{1, 1, 5}));
  EXPECT_EQ(dims(*net, "layer3.5.se.conv.weight"), (D{1, 1, 5}));
  EXPECT_EQ(dims(*net, "layer4.2.se.conv.weight"), (D{1, 1, 7}));
  // The tiered stem: 24, 32 and 64 channels.
  EXPECT_EQ(dims(*net, "conv1.0.weight"), (D{24, 3, 3, 3}));
  EXPECT_EQ(dims(*net, "conv1.3.weight"), (D{32, 24, 3, 3}));
  EXPECT_EQ(dims(*net, "conv1.6.weight"), (D{64, 32, 3, 3}));
  EXPECT_EQ(dims(*net, "layer2.0.downsample.1.weight"), (D{512, 256, 1, 1}));
  // ecaresnetlight: the 7x7 stem, pooled shortcuts.
  auto light = build("ecaresnetlight", true);
  EXPECT_EQ(dims(*light, "conv1.weight"), (D{64, 3, 7, 7}));
  EXPECT_EQ(dims(*light, "layer3.10.se.conv.weight"), (D{1, 1, 5}));
  EXPECT_EQ(dims(*light, "layer2.0.downsample.1.weight"), (D{512, 256, 1, 1}));
  // At another width the kernel follows the channels: 0.125 gives 32 to 256 channels: 3 and 5.
  auto narrow = build("ecaresnet26t", true, 64, 0.125);
  EXPECT_EQ(dims(*narrow, "layer1.0.se.conv.weight"), (D{1, 1, 3}));
  EXPECT_EQ(dims(*narrow, "layer4.1.se.conv.weight"), (D{1, 1, 5}));
}

TEST(EcaResNet, ZeroInitResidualReachesTheLastBatchNormThroughTheGate) {
  ResNetConfig c;
  c.name = "ecaresnet26t";
  c.image_size = 32;
  c.width = 0.125;
  c.zero_init_residual = true;
  auto net = build_resnet<float>(c, make_backend<float>("reference"));
  auto& a = net->arena();
  auto params = a.params();
  int zeroed = 0;
  for (const ParamInfo& p : a.registered()) {
    if (p.name.find(".bn3.weight") == std::string::npos) continue;
    EXPECT_TRUE(std::all_of(params.begin() + p.offset, params.begin() + p.offset + p.count,
                            [](float v) { return v == 0; }))
        << p.name;
    ++zeroed;
  }
  EXPECT_EQ(zeroed, 8);
}

// The whole network in double against central differences of its loss, on the channel
// convolutions' weights (their gradient through the gate and the squeeze), the tiered stem and the
// layers before the first ECA block, whose gradient passes all of them.
TEST(EcaResNet, WholeNetworkGradientMatchesFiniteDifferences) {
  auto net = build<double>("ecaresnet26t", false, 72, 0.125, 5, 4);
  std::vector<int32_t> y = {1, 3, 0, 4};
  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd;
  std::vector<double> x(size_t(net->shape(0).numel()));
  for (auto& v : x) v = nd(rng);
  net->forward(x.data(), y.data(), true);
  net->backward();
  auto& a = net->arena();
  std::vector<double> grads(a.grads().begin(), a.grads().end());
  int checked = 0;
  for (int id = 0; id < int(a.registered().size()); ++id) {
    const ParamInfo& p = a.info(id);
    const bool pick = p.name.find(".se.conv.") != std::string::npos || p.name == "conv1.0.weight" ||
                      p.name == "layer1.0.conv1.weight" || p.name == "layer4.1.bn3.weight";
    if (!pick) continue;
    double* w = a.param(id);
    for (size_t i = 0; i < p.count; i += std::max<size_t>(1, p.count / 3)) {
      // A step of 1e-7: at 1e-6 a ReLU or max-pool input crosses its kink (test_resnet_d.cc).
      const double saved = w[i], h = 1e-7;
      w[i] = saved + h;
      const double lp = net->forward(x.data(), y.data(), true);
      w[i] = saved - h;
      const double lm = net->forward(x.data(), y.data(), true);
      w[i] = saved;
      const double numeric = (lp - lm) / (2 * h), analytic = grads[p.offset + i];
      EXPECT_NEAR(analytic, numeric, 1e-5 * std::max({std::fabs(analytic), std::fabs(numeric), 1e-2}))
          << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
}

}  // namespace
}  // namespace rt

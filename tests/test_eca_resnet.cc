// ECA-ResNets and ResNet-Ts (timm's ecaresnet*, resnet26t/50t): parameter counts, names, kernel
// sizes and the tiered stem equal to timm's, the gradient of whole networks against finite
// differences (the channel convolution op alone: test_ref_gradcheck.cc and test_ref_layers.cc;
// against PyTorch's logits: tests/tools/test_torch_weights_se.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "model_test_util.h"
#include "nn/resnet.h"

namespace rt {
namespace {

using test::build_model;
using test::param_dims;

TEST(EcaResNet, ParameterCountsEqualTimms) {
  // sum(p.numel() for p in model.parameters()) of timm's models (25,576,350 for ecaresnet50d:
  // resnet50d's and one kernel of 5 or 7 weights a block), as tools/torch_se_models.py builds them.
  const std::pair<const char*, size_t> counts[] = {
      {"ecaresnet26t", 16011916},   {"ecaresnet50d", 25576350},  {"ecaresnet50t", 25573814},
      {"ecaresnet101d", 44568563},  {"ecaresnetlight", 30162046}, {"resnet26t", 16011872},
      {"resnet50t", 25573728}};
  for (auto [name, n] : counts) EXPECT_EQ(build_model(name, true)->arena().param_count(), n) << name;
}

TEST(EcaResNet, TimmsNamesKernelsAndStems) {
  using D = std::vector<int64_t>;
  auto net = build_model("ecaresnet50t", true);
  // timm's EcaModule is the block's `se`: its Conv1d(1, 1, k), k = 5 on 256 to 1024 channels, 7 on
  // 2048 (t = int(|log2 c + 1| / 2), made odd).
  EXPECT_EQ(param_dims(*net, "layer1.0.se.conv.weight"), (D{1, 1, 5}));
  EXPECT_EQ(param_dims(*net, "layer3.5.se.conv.weight"), (D{1, 1, 5}));
  EXPECT_EQ(param_dims(*net, "layer4.2.se.conv.weight"), (D{1, 1, 7}));
  // The tiered stem: 24, 32 and 64 channels.
  EXPECT_EQ(param_dims(*net, "conv1.0.weight"), (D{24, 3, 3, 3}));
  EXPECT_EQ(param_dims(*net, "conv1.3.weight"), (D{32, 24, 3, 3}));
  EXPECT_EQ(param_dims(*net, "conv1.6.weight"), (D{64, 32, 3, 3}));
  EXPECT_EQ(param_dims(*net, "layer2.0.downsample.1.weight"), (D{512, 256, 1, 1}));
  // ecaresnetlight: the 7x7 stem, pooled shortcuts.
  auto light = build_model("ecaresnetlight", true);
  EXPECT_EQ(param_dims(*light, "conv1.weight"), (D{64, 3, 7, 7}));
  EXPECT_EQ(param_dims(*light, "layer3.10.se.conv.weight"), (D{1, 1, 5}));
  EXPECT_EQ(param_dims(*light, "layer2.0.downsample.1.weight"), (D{512, 256, 1, 1}));
  // At another width the kernel follows the channels: 0.125 gives 32 to 256 channels: 3 and 5.
  auto narrow = build_model("ecaresnet26t", true, 64, 0.125);
  EXPECT_EQ(param_dims(*narrow, "layer1.0.se.conv.weight"), (D{1, 1, 3}));
  EXPECT_EQ(param_dims(*narrow, "layer4.1.se.conv.weight"), (D{1, 1, 5}));
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
  auto net = build_model<double>("ecaresnet26t", false, 72, 0.125, 5, 4);
  // A step of 1e-7: at 1e-6 a ReLU or max-pool input crosses its kink (test_resnet_d.cc).
  const int checked = test::expect_whole_net_gradient(
      *net, test::normal_input(*net, 7), {1, 3, 0, 4},
      [](const ParamInfo& p) {
        return p.name.find(".se.conv.") != std::string::npos || p.name == "conv1.0.weight" ||
               p.name == "layer1.0.conv1.weight" || p.name == "layer4.1.bn3.weight";
      },
      3, 1e-7);
  EXPECT_GT(checked, 30);
}

}  // namespace
}  // namespace rt

// ResNet-D (timm's resnet*d): parameter counts, names and shapes equal to timm's, the pooled
// shortcut on odd sides, the gradient of whole networks against finite differences, a backend
// without average pooling refused by name (against PyTorch's logits: tests/tools/
// test_torch_weights_se.py; oneDNN against the reference: test_onednn_vs_ref.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>

#include "forwarding_backend.h"
#include "model_test_util.h"
#include "nn/resnet.h"

namespace rt {
namespace {

using test::build_model;
using test::param_dims;

// The output shape of the node of this name; rank 0 where there is none.
template <class T>
Shape node_out(const Net<T>& net, const std::string& name) {
  for (size_t i = 0; i < net.num_nodes(); ++i)
    if (net.node(i).name == name) return net.shape(net.node(i).output);
  return {};
}

TEST(ResNetD, ParameterCountsEqualTimms) {
  // sum(p.numel() for p in model.parameters()) of timm's models (25,576,264 for resnet50d), as
  // tools/torch_se_models.py builds them.
  const std::pair<const char*, size_t> counts[] = {
      {"resnet18d", 11708744},         {"resnet26d", 16014408},  {"resnet34d", 21816904},
      {"resnet50d", 25576264},         {"resnet101d", 44568392}, {"resnet152d", 60212040},
      {"resnext50d_32x4d", 25048136},  {"seresnext26d_32x4d", 16809512}};
  for (auto [name, n] : counts) EXPECT_EQ(build_model(name, true)->arena().param_count(), n) << name;
}

TEST(ResNetD, TimmsNamesAndShapes) {
  using D = std::vector<int64_t>;
  auto net = build_model("resnet50d", true);
  // The deep stem: conv1 is timm's nn.Sequential, its ReLUs (conv1.2, conv1.5) without tensors.
  EXPECT_EQ(param_dims(*net, "conv1.0.weight"), (D{32, 3, 3, 3}));
  EXPECT_EQ(param_dims(*net, "conv1.1.weight"), (D{32}));
  EXPECT_EQ(param_dims(*net, "conv1.3.weight"), (D{32, 32, 3, 3}));
  EXPECT_EQ(param_dims(*net, "conv1.4.running_var"), D{});  // state, not a parameter
  EXPECT_EQ(param_dims(*net, "conv1.6.weight"), (D{64, 32, 3, 3}));
  EXPECT_EQ(param_dims(*net, "bn1.weight"), (D{64}));
  EXPECT_EQ(param_dims(*net, "conv1.weight"), D{});
  // downsample.0 is the pool (the identity in layer1, which does not stride): no tensors.
  EXPECT_EQ(param_dims(*net, "layer1.0.downsample.1.weight"), (D{256, 64, 1, 1}));
  EXPECT_EQ(param_dims(*net, "layer2.0.downsample.1.weight"), (D{512, 256, 1, 1}));
  EXPECT_EQ(param_dims(*net, "layer2.0.downsample.2.bias"), (D{512}));
  EXPECT_EQ(param_dims(*net, "layer2.0.downsample.0.weight"), D{});
  EXPECT_EQ(node_out(*net, "layer1.0.downsample.0").str(), Shape{}.str());
  EXPECT_EQ(node_out(*net, "layer2.0.downsample.0").str(), Shape({1, 256, 8, 8}).str());
}

TEST(ResNetD, PooledShortcutKeepsTheLastRowOfOddSides) {
  // 72 pixels: 36 after the stem, 18 after its pool; layer2 gives 9, layer3 5, layer4 3. The
  // strided 3x3 rounds up, and so must the 2x2 average (ceil_mode): a floor would give 4 and 2,
  // and no network. 40 pixels: layer3 5 -> 3, layer4 3 -> 2.
  for (auto [size, l3, l4] : {std::tuple<int64_t, int64_t, int64_t>{72, 5, 3}, {40, 3, 2}}) {
    SCOPED_TRACE(size);
    auto net = build_model("resnet18d", false, size, 0.125, 10, 2);
    EXPECT_EQ(node_out(*net, "layer3.0.downsample.0").str(), Shape({2, 16, l3, l3}).str());
    EXPECT_EQ(node_out(*net, "layer3.0.conv1").str(), Shape({2, 32, l3, l3}).str());
    EXPECT_EQ(node_out(*net, "layer4.0.downsample.0").str(), Shape({2, 32, l4, l4}).str());
  }
}

class NoAvgPoolBackend final : public test::ForwardingBackend<float> {
 public:
  std::string name() const override { return "noavg"; }
  std::unique_ptr<AvgPoolOp<float>> make_avgpool(const AvgPoolDesc& d) override {
    return Backend<float>::make_avgpool(d);
  }
};

TEST(ResNetD, BackendWithoutAveragePoolingIsRefusedByName) {
  ResNetConfig c;
  c.name = "resnet18d";
  c.image_size = 32;
  try {
    build_resnet<float>(c, std::make_unique<NoAvgPoolBackend>());
    FAIL() << "built a ResNet-D on a backend without average pooling";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("noavg"), std::string::npos) << m;
    EXPECT_NE(m.find("layer2.0.downsample.0"), std::string::npos) << m;
    EXPECT_NE(m.find("ResNet-D"), std::string::npos) << m;
  }
  c.name = "resnet18";
  EXPECT_NO_THROW(build_resnet<float>(c, std::make_unique<NoAvgPoolBackend>()));
}

// Whole networks in double against central differences of the loss, on odd sides (72 pixels):
// the stem's convolutions and the projections behind the pools, whose gradient comes back
// through the clipped windows, and the first layers, whose gradient passes every pool.
TEST(ResNetD, WholeNetworkGradientMatchesFiniteDifferences) {
  for (const char* model : {"resnet18d", "seresnext26d_32x4d"}) {
    SCOPED_TRACE(model);
    auto net = build_model<double>(model, false, 72, 0.125, 5, 4);
    // A step of 1e-7: the stem's weights move every activation, and at 1e-6 some ReLU or
    // max-pool input of the SE-ResNeXt crosses its kink.
    const int checked = test::expect_whole_net_gradient(
        *net, test::normal_input(*net, 7), {1, 3, 0, 4},
        [](const ParamInfo& p) {
          return (p.name.rfind("conv1.", 0) == 0 || p.name.find(".downsample.") != std::string::npos) &&
                 p.kind != ParamKind::bn_beta;
        },
        2, 1e-7);
    EXPECT_GT(checked, 20);
  }
}

}  // namespace
}  // namespace rt

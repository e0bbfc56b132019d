// Squeeze-and-excitation ResNets: timm's parameter counts, names and hidden widths, the gradient
// of a whole SE network against finite differences, zero-init-residual through the gate, a
// backend without the gate refused by name (overfitting one batch: test_overfit.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "forwarding_backend.h"
#include "model_test_util.h"
#include "nn/resnet.h"

namespace rt {
namespace {

// test::build_model with the width first: the SE tests vary it most.
template <class T = float>
std::unique_ptr<Net<T>> build(const std::string& name, bool layout_only, double width = 1.0,
                              bool zero_init = false, int64_t size = 64, int64_t classes = 1000,
                              int64_t batch = 1) {
  return test::build_model<T>(name, layout_only, size, width, classes, batch, zero_init);
}

const ParamInfo* find(const Net<float>& net, const std::string& name) {
  for (const ParamInfo& p : net.arena().registered())
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<int64_t> dims(const Net<float>& net, const std::string& name) {
  const ParamInfo* p = find(net, name);
  return p ? p->dims : std::vector<int64_t>{};
}

TEST(SeResNet, ParameterCountsEqualTimms) {
  // sum(p.numel() for p in model.parameters()) of the same modules built in PyTorch: timm's
  // ResNet with block_args=dict(attn_layer='se') (27,559,896 for seresnext50_32x4d).
  const std::pair<const char*, size_t> counts[] = {
      {"seresnet18", 11779624},          {"seresnet34", 21960416},
      {"seresnet50", 28088024},          {"seresnet101", 49326872},
      {"seresnet152", 66821848},         {"seresnext50_32x4d", 27559896},
      {"seresnext101_32x4d", 48955416},  {"seresnext101_32x8d", 93569048},
      {"seresnext101_64x4d", 88232984},  {"resnext101_32x4d", 44177704}};
  for (auto [name, n] : counts) EXPECT_EQ(build(name, true)->arena().param_count(), n) << name;
}

TEST(SeResNet, TimmsNamesAndShapes) {
  using D = std::vector<int64_t>;
  auto net = build("seresnext50_32x4d", true);
  EXPECT_EQ(dims(*net, "layer1.0.se.fc1.weight"), (D{16, 256, 1, 1}));
  EXPECT_EQ(dims(*net, "layer1.0.se.fc1.bias"), (D{16}));
  EXPECT_EQ(dims(*net, "layer1.0.se.fc2.weight"), (D{256, 16, 1, 1}));
  EXPECT_EQ(dims(*net, "layer1.0.se.fc2.bias"), (D{256}));
  EXPECT_EQ(dims(*net, "layer4.2.se.fc1.weight"), (D{128, 2048, 1, 1}));
  EXPECT_EQ(dims(*net, "layer4.2.se.fc2.weight"), (D{2048, 128, 1, 1}));
  EXPECT_EQ(dims(*net, "layer1.0.conv2.weight"), (D{128, 4, 3, 3}));  // ResNeXt's groups kept
  // Basic blocks: after bn2, on the block's 64 channels: 64 / 16 = 4 rounds up to 8.
  auto basic = build("seresnet18", true);
  EXPECT_EQ(dims(*basic, "layer1.1.se.fc1.weight"), (D{8, 64, 1, 1}));
  EXPECT_EQ(dims(*basic, "layer4.1.se.fc2.weight"), (D{512, 32, 1, 1}));
  // No SE in the plain models.
  EXPECT_EQ(find(*build("resnext50_32x4d", true), "layer1.0.se.fc1.weight"), nullptr);
}

TEST(SeResNet, HiddenWidthFollowsTimmsRounding) {
  // make_divisible(c / 16, 8, round_limit=0): width 0.375 gives stages of 96, 192, 384 and 768
  // channels: 6 -> 8, 12 -> 16 (a half rounds up), 24, 48.
  auto net = build("seresnet50", true, 0.375);
  EXPECT_EQ(dims(*net, "layer1.0.se.fc1.weight")[0], 8);
  EXPECT_EQ(dims(*net, "layer2.0.se.fc1.weight")[0], 16);
  EXPECT_EQ(dims(*net, "layer3.0.se.fc1.weight")[0], 24);
  EXPECT_EQ(dims(*net, "layer4.0.se.fc1.weight")[0], 48);
  // 0.3125: 80 channels, 5 -> 8 (the minimum); 160: 10 -> 8 (rounds down); 320: 20 -> 24.
  auto narrow = build("seresnet50", true, 0.3125);
  EXPECT_EQ(dims(*narrow, "layer1.0.se.fc1.weight")[0], 8);
  EXPECT_EQ(dims(*narrow, "layer2.0.se.fc1.weight")[0], 8);
  EXPECT_EQ(dims(*narrow, "layer3.0.se.fc1.weight")[0], 24);
}

TEST(SeResNet, ZeroInitResidualReachesTheLastBatchNormThroughTheGate) {
  auto net = build("seresnext50_32x4d", false, 0.125, /*zero_init=*/true, 32);
  auto& a = net->arena();
  int zeroed = 0, ones = 0;
  for (int id = 0; id < int(a.registered().size()); ++id) {
    const ParamInfo& p = a.info(id);
    if (p.kind != ParamKind::bn_gamma) continue;
    const float* w = a.param(id);
    const bool last = p.name.find(".bn3.") != std::string::npos;
    const bool all = std::all_of(w, w + p.count, [&](float v) { return v == (last ? 0.f : 1.f); });
    EXPECT_TRUE(all) << p.name;
    (last ? zeroed : ones)++;
  }
  EXPECT_EQ(zeroed, 16);  // one per block
  EXPECT_GT(ones, 16);
  // The SE layers are drawn as convolutions with bias (PyTorch's default bias init).
  const ParamInfo* b = find(*net, "layer1.0.se.fc1.bias");
  ASSERT_NE(b, nullptr);
  EXPECT_NE(net->arena().params()[b->offset], 0.f);
}

// The reference backend, fusing a batch norm with the residual add that alone reads it.
class FusingReference final : public test::ForwardingBackend<float> {
 public:
  bool fuses_bn_add() const override { return true; }
};

// The SE blocks' last batch norms (read by the squeeze and the gate too) stay unfused, the
// projections' fuse as before, and the network computes what the unfused one does.
TEST(SeResNet, GatedBatchNormsAreNotFusedWithTheAdd) {
  ResNetConfig c;
  c.width = 0.125;
  c.image_size = 32;
  c.batch = 2;
  c.num_classes = 3;
  auto fused = [&](const std::string& model) {
    c.name = model;
    auto net = build_resnet<float>(c, std::make_unique<FusingReference>());
    int n = 0;
    for (size_t i = 0; i < net->num_nodes(); ++i) n += net->node(i).name.ends_with("+add");
    return n;
  };
  EXPECT_EQ(fused("resnet18"), 8);
  EXPECT_EQ(fused("seresnet18"), 0);
  c.name = "seresnet18";
  auto a = build_resnet<float>(c, std::make_unique<FusingReference>());
  auto b = build_resnet<float>(c, make_backend<float>("reference"));
  std::vector<float> x(size_t(a->shape(0).numel()));
  std::mt19937_64 rng(4);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  const std::vector<int32_t> y = {0, 2};
  EXPECT_EQ(a->forward(x.data(), y.data(), true), b->forward(x.data(), y.data(), true));
  a->backward();
  b->backward();
  EXPECT_TRUE(std::equal(a->arena().grads().begin(), a->arena().grads().end(), b->arena().grads().begin()));
}

// A backend without the gate (the default make_channel_gate) refuses an SE model at build,
// naming the model, the backend and the layer.
class NoGateBackend : public test::ForwardingBackend<float> {
 public:
  std::string name() const override { return "nogate"; }
  std::unique_ptr<ChannelGateOp<float>> make_channel_gate(const ChannelGateDesc& d) override {
    return Backend<float>::make_channel_gate(d);
  }
};

TEST(SeResNet, BackendWithoutTheGateIsRefusedByName) {
  ResNetConfig c;
  c.name = "seresnet18";
  c.image_size = 32;
  try {
    build_resnet<float>(c, std::make_unique<NoGateBackend>());
    FAIL() << "built an SE model on a backend without the gate";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("seresnet18"), std::string::npos) << m;
    EXPECT_NE(m.find("nogate"), std::string::npos) << m;
    EXPECT_NE(m.find("layer1.0.se.gate"), std::string::npos) << m;
  }
  c.name = "resnet18";  // no SE: builds
  EXPECT_NO_THROW(build_resnet<float>(c, std::make_unique<NoGateBackend>()));
}

// The whole network in double against central differences of its loss, on parameters the SE
// blocks own and on ones whose gradient arrives through both the squeeze and the gate (the batch
// norm and convolution before it): checks the graph's wiring, not only the op.
TEST(SeResNet, WholeNetworkGradientMatchesFiniteDifferences) {
  for (const char* model : {"seresnet18", "seresnext50_32x4d"}) {
    SCOPED_TRACE(model);
    // Batch 4: at batch 2 the last stage's batch norms see 8 values each, and a step of the
    // difference moves enough ReLU inputs across zero to spoil it.
    auto net = build<double>(model, false, 0.125, false, 64, 5, 4);
    const std::string last = std::string(model) == "seresnet18" ? ".bn2.weight" : ".bn3.weight";
    const int checked = test::expect_whole_net_gradient(
        *net, test::normal_input(*net, 7), {1, 3, 0, 4},
        [&](const ParamInfo& p) {
          return p.name.find(".se.") != std::string::npos || p.name.find("conv2") != std::string::npos ||
                 p.name == "layer1.0" + last || p.name == "layer4.1" + last || p.name == "layer1.0.conv1.weight";
        },
        2, 1e-6);
    EXPECT_GT(checked, 40);
  }
}

}  // namespace
}  // namespace rt

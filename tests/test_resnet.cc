// ResNet builders: parameter counts equal torchvision's, names, initialisation, bad input.
#include "nn/resnet.h"

#include <gtest/gtest.h>

#include <cmath>

namespace rt {
namespace {

std::unique_ptr<Net<float>> build(const std::string& name, int64_t classes = 1000, int64_t size = 64,
                                  bool zero_init = false, std::string shortcut = "A", bool layout_only = false,
                                  double drop_path = 0) {
  ResNetConfig c;
  c.name = name;
  c.num_classes = classes;
  c.image_size = size;
  c.batch = 1;
  c.zero_init_residual = zero_init;
  c.cifar_shortcut = shortcut;
  c.layout_only = layout_only;
  c.drop_path = drop_path;
  return build_resnet<float>(c, make_backend<float>("reference"));
}

// Names and shapes only (ResNetConfig::layout_only): the counts of models up to 127M parameters
// without allocating or drawing them.
std::unique_ptr<Net<float>> layout(const std::string& name) { return build(name, 1000, 64, false, "A", true); }

TEST(ResNet, ParameterCountsEqualTorchvision) {
  // torchvision.models.resnetXX(num_classes=1000): sum(p.numel() for p in model.parameters()).
  EXPECT_EQ(layout("resnet18")->arena().param_count(), 11689512u);
  EXPECT_EQ(layout("resnet34")->arena().param_count(), 21797672u);
  EXPECT_EQ(layout("resnet50")->arena().param_count(), 25557032u);
  EXPECT_EQ(layout("resnet101")->arena().param_count(), 44549160u);
  EXPECT_EQ(layout("resnet152")->arena().param_count(), 60192808u);
  EXPECT_EQ(layout("resnext50_32x4d")->arena().param_count(), 25028904u);
  EXPECT_EQ(layout("resnext101_32x8d")->arena().param_count(), 88791336u);
  EXPECT_EQ(layout("resnext101_64x4d")->arena().param_count(), 83455272u);
  EXPECT_EQ(layout("wide_resnet50_2")->arena().param_count(), 68883240u);
  EXPECT_EQ(layout("wide_resnet101_2")->arena().param_count(), 126886696u);
}

TEST(ResNet, LayoutOnlyHasTheFullNetworksParameters) {
  // The same names, shapes and count as the network built in full; nothing allocated.
  auto shape = layout("resnet18");
  auto full = build("resnet18");
  EXPECT_EQ(shape->arena().size(), 0u);
  EXPECT_EQ(shape->arena().param_count(), full->arena().param_count());
  ASSERT_EQ(shape->arena().registered().size(), full->arena().registered().size());
  for (size_t i = 0; i < full->arena().registered().size(); ++i) {
    EXPECT_EQ(shape->arena().registered()[i].name, full->arena().registered()[i].name);
    EXPECT_EQ(shape->arena().registered()[i].dims, full->arena().registered()[i].dims);
  }
}

TEST(ResNet, ResNeXtAndWideBottlenecksHaveTorchvisionsShapes) {
  // torchvision: layer1.0.conv2.weight is [128, 4, 3, 3] in resnext50_32x4d, [256, 8, 3, 3] in
  // resnext101_32x8d, [128, 128, 3, 3] in wide_resnet50_2; conv3 maps back to 256.
  auto dims = [](const std::string& model, const std::string& tensor) {
    auto net = layout(model);
    for (const ParamInfo& p : net->arena().registered())
      if (p.name == tensor) return p.dims;
    return std::vector<int64_t>{};
  };
  using D = std::vector<int64_t>;
  EXPECT_EQ(dims("resnext50_32x4d", "layer1.0.conv2.weight"), (D{128, 4, 3, 3}));
  EXPECT_EQ(dims("resnext50_32x4d", "layer1.0.conv3.weight"), (D{256, 128, 1, 1}));
  EXPECT_EQ(dims("resnext50_32x4d", "layer4.2.conv2.weight"), (D{1024, 32, 3, 3}));
  EXPECT_EQ(dims("resnext101_32x8d", "layer1.0.conv2.weight"), (D{256, 8, 3, 3}));
  EXPECT_EQ(dims("wide_resnet50_2", "layer1.0.conv2.weight"), (D{128, 128, 3, 3}));
  EXPECT_EQ(dims("wide_resnet50_2", "layer4.0.conv1.weight"), (D{1024, 1024, 1, 1}));
}

TEST(ResNet, CifarParameterCounts) {
  // He et al. 2016: ResNet-20 0.27M, ResNet-110 1.7M (counts from the PyTorch definition).
  EXPECT_EQ(build("resnet20", 10, 32)->arena().param_count(), 269722u);
  EXPECT_EQ(build("resnet20", 10, 32, false, "B")->arena().param_count(), 272474u);
  EXPECT_EQ(build("resnet110", 10, 32)->arena().param_count(), 1727962u);
}

TEST(ResNet, TorchvisionNamesAndBackwardOrder) {
  auto net = build("resnet50");
  const auto& layout = net->arena().layout();
  EXPECT_EQ(layout.front().name, "fc.bias");  // produced first by backward
  EXPECT_EQ(layout[1].name, "fc.weight");
  EXPECT_EQ(layout.back().name, "conv1.weight");
  bool found = false;
  for (auto& p : layout) found |= p.name == "layer1.0.downsample.0.weight";
  EXPECT_TRUE(found);
  EXPECT_EQ(net->arena().state_layout().front().name, "bn1.running_mean");
  EXPECT_EQ(net->shape(net->logits()), (Shape{1, 1000, 1, 1}));
}

TEST(ResNet, AnyClassCountSizeAndWidth) {
  ResNetConfig c;
  c.name = "resnet18";
  c.num_classes = 7;
  c.image_size = 96;
  c.batch = 2;
  c.width = 0.5;
  auto net = build_resnet<float>(c, make_backend<float>("reference"));
  EXPECT_EQ(net->shape(net->logits()), (Shape{2, 7, 1, 1}));
  EXPECT_EQ(net->arena().layout()[1].dims, (std::vector<int64_t>{7, 256}));
}

TEST(ResNet, TorchvisionInitialisation) {
  auto net = build("resnet50", 1000, 64, /*zero_init=*/true);
  auto& a = net->arena();
  for (int id = 0; id < int(a.layout().size()); ++id) {
    const ParamInfo& p = a.info(id);
    const float* w = a.param(id);
    if (p.name == "layer3.0.conv2.weight") {  // 256 x 256 x 3 x 3: std sqrt(2 / (256 * 9))
      double s2 = 0;
      for (size_t i = 0; i < p.count; ++i) s2 += double(w[i]) * w[i];
      EXPECT_NEAR(std::sqrt(s2 / p.count), std::sqrt(2.0 / (256 * 9)), 0.002);
    }
    if (p.name == "fc.weight") {
      float mx = 0;
      for (size_t i = 0; i < p.count; ++i) mx = std::max(mx, std::fabs(w[i]));
      EXPECT_LE(mx, 1.0f / std::sqrt(2048.0f));
      EXPECT_GT(mx, 0.9f / std::sqrt(2048.0f));
    }
    if (p.kind == ParamKind::bn_gamma) {
      bool last = p.name.find(".bn3.") != std::string::npos;
      EXPECT_EQ(w[0], last ? 0.0f : 1.0f) << p.name;
    }
    if (p.kind == ParamKind::bn_beta) {
      EXPECT_EQ(w[0], 0.0f) << p.name;
    }
  }
  // Same seed, same values: every rank can initialise identically.
  auto again = build("resnet50", 1000, 64, true);
  EXPECT_TRUE(std::equal(a.params().begin(), a.params().end(), again->arena().params().begin()));
}

// zero_init_residual with stochastic depth (ResNet strikes back's A1 has both): each branch's last
// BN is found through its drop-path node, in every block, not only the first (whose rate is 0).
TEST(ResNet, ZeroInitResidualThroughStochasticDepth) {
  for (const char* model : {"resnet50", "resnet20"}) {
    auto net = build(model, 10, 32, /*zero_init=*/true, "A", false, /*drop_path=*/0.1);
    const std::string last = std::string(model) == "resnet50" ? ".bn3." : ".bn2.";
    int zeroed = 0;
    for (int id = 0; id < int(net->arena().layout().size()); ++id) {
      const ParamInfo& p = net->arena().info(id);
      if (p.kind != ParamKind::bn_gamma) continue;
      const bool is_last = p.name.find(last) != std::string::npos;
      EXPECT_EQ(net->arena().param(id)[0], is_last ? 0.0f : 1.0f) << model << " " << p.name;
      zeroed += is_last;
    }
    EXPECT_EQ(zeroed, std::string(model) == "resnet50" ? 16 : 9) << model;
  }
}

TEST(ResNet, BadInputNamesTheProblem) {
  try {
    build("resnet51");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resnet51"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("resnet50"), std::string::npos);  // lists the known ones
  }
  try {
    build("resnet18", 0);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("class count"), std::string::npos);
  }
  EXPECT_THROW(build("resnet18", 10, 0), ShapeError);
  // A kernel larger than its padded input names the layer and the shapes.
  Net<float> net(make_backend<float>("reference"), Shape{2, 3, 3, 3});
  try {
    net.conv(net.input(), "stem", 8, 5, 1, 0);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("stem"), std::string::npos) << m;
    EXPECT_NE(m.find("[2,3,3,3]"), std::string::npos) << m;
  }
  EXPECT_THROW(make_backend<float>("tpu"), Error);
}

}  // namespace
}  // namespace rt

// ResNet builders and torchvision-compatible initialisation.
#include "nn/resnet.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

namespace rt {
namespace {

// The attention after each branch's last batch norm (timm's attn_layer): squeeze-and-excitation
// or efficient channel attention.
enum class Attn { none, se, eca };
// The stem (timm's stem_type): a 7x7 convolution, or three 3x3 ones of 32, 32 and 64 channels
// ('deep') or 24, 32 and 64 ('deep_tiered').
enum class Stem { plain, deep, tiered };

struct Arch {
  bool cifar;
  bool bottleneck;
  std::vector<int> blocks;
  // Bottlenecks' 3x3 convolution: `groups` groups of width_per_group channels per 64 planes
  // (torchvision's groups and width_per_group: ResNeXt, wide ResNets); 1 and 64 for ResNet.
  int64_t groups = 1, width_per_group = 64;
  Attn attn = Attn::none;
  Stem stem = Stem::plain;
  // ResNet-D's projection shortcut (He et al. 2019, "Bag of Tricks"; timm's avg_down=True): a 2x2
  // average before a stride-1 1x1 convolution, instead of the strided 1x1 skipping 3 pixels in 4.
  bool avg_down = false;
};

const std::map<std::string, Arch>& archs() {
  using enum Attn;
  using enum Stem;
  static const std::map<std::string, Arch> m = {
      {"resnet18", {false, false, {2, 2, 2, 2}}},   {"resnet34", {false, false, {3, 4, 6, 3}}},
      {"resnet50", {false, true, {3, 4, 6, 3}}},    {"resnet101", {false, true, {3, 4, 23, 3}}},
      {"resnet152", {false, true, {3, 8, 36, 3}}},  {"resnet20", {true, false, {3, 3, 3}}},
      {"resnet32", {true, false, {5, 5, 5}}},       {"resnet44", {true, false, {7, 7, 7}}},
      {"resnet56", {true, false, {9, 9, 9}}},       {"resnet110", {true, false, {18, 18, 18}}},
      {"resnext50_32x4d", {false, true, {3, 4, 6, 3}, 32, 4}},
      {"resnext101_32x8d", {false, true, {3, 4, 23, 3}, 32, 8}},
      {"resnext101_64x4d", {false, true, {3, 4, 23, 3}, 64, 4}},
      {"resnext101_32x4d", {false, true, {3, 4, 23, 3}, 32, 4}},
      {"wide_resnet50_2", {false, true, {3, 4, 6, 3}, 1, 128}},
      {"wide_resnet101_2", {false, true, {3, 4, 23, 3}, 1, 128}},
      // timm's SE-ResNets and SE-ResNeXts (NVIDIA's se-resnext101-32x4d is the 101-layer 32x4d).
      {"seresnet18", {false, false, {2, 2, 2, 2}, 1, 64, se}},
      {"seresnet34", {false, false, {3, 4, 6, 3}, 1, 64, se}},
      {"seresnet50", {false, true, {3, 4, 6, 3}, 1, 64, se}},
      {"seresnet101", {false, true, {3, 4, 23, 3}, 1, 64, se}},
      {"seresnet152", {false, true, {3, 8, 36, 3}, 1, 64, se}},
      {"seresnext50_32x4d", {false, true, {3, 4, 6, 3}, 32, 4, se}},
      {"seresnext101_32x4d", {false, true, {3, 4, 23, 3}, 32, 4, se}},
      {"seresnext101_32x8d", {false, true, {3, 4, 23, 3}, 32, 8, se}},
      {"seresnext101_64x4d", {false, true, {3, 4, 23, 3}, 64, 4, se}},
      // timm's ResNet-Ds (deep stem, average-pooled shortcuts) and -Ts (the tiered deep stem).
      {"resnet18d", {false, false, {2, 2, 2, 2}, 1, 64, none, deep, true}},
      {"resnet26d", {false, true, {2, 2, 2, 2}, 1, 64, none, deep, true}},
      {"resnet34d", {false, false, {3, 4, 6, 3}, 1, 64, none, deep, true}},
      {"resnet50d", {false, true, {3, 4, 6, 3}, 1, 64, none, deep, true}},
      {"resnet101d", {false, true, {3, 4, 23, 3}, 1, 64, none, deep, true}},
      {"resnet152d", {false, true, {3, 8, 36, 3}, 1, 64, none, deep, true}},
      {"resnext50d_32x4d", {false, true, {3, 4, 6, 3}, 32, 4, none, deep, true}},
      {"seresnext26d_32x4d", {false, true, {2, 2, 2, 2}, 32, 4, se, deep, true}},
      {"resnet26t", {false, true, {2, 2, 2, 2}, 1, 64, none, tiered, true}},
      {"resnet50t", {false, true, {3, 4, 6, 3}, 1, 64, none, tiered, true}},
      // timm's ECA-ResNets (ecaresnetlight: the 7x7 stem, pooled shortcuts, 1-1-11-3 blocks).
      {"ecaresnet26t", {false, true, {2, 2, 2, 2}, 1, 64, eca, tiered, true}},
      {"ecaresnet50d", {false, true, {3, 4, 6, 3}, 1, 64, eca, deep, true}},
      {"ecaresnet50t", {false, true, {3, 4, 6, 3}, 1, 64, eca, tiered, true}},
      {"ecaresnet101d", {false, true, {3, 4, 23, 3}, 1, 64, eca, deep, true}},
      {"ecaresnetlight", {false, true, {1, 1, 11, 3}, 1, 64, eca, plain, true}},
  };
  return m;
}

int64_t scaled(int64_t c, double width) {
  return std::max<int64_t>(1, int64_t(std::lround(double(c) * width)));
}

// ResNet-D's (avg_down): a 2x2 average (PyTorch's ceil_mode, padding not counted: odd sides keep
// their last row) where the block strides, then a stride-1 1x1 convolution; timm's names, where
// the pool is downsample.0 even when it is the identity.
template <class T>
int shortcut_projection(Net<T>& net, int x, const std::string& p, int64_t out_c, int64_t stride, bool avg_down) {
  if (!avg_down) {
    int s = net.conv(x, p + ".downsample.0", out_c, 1, stride, 0);
    return net.batchnorm(s, p + ".downsample.1", false);
  }
  if (stride != 1) x = net.avgpool(x, p + ".downsample.0", 2, stride, 0, true);
  int s = net.conv(x, p + ".downsample.1", out_c, 1, 1, 0);
  return net.batchnorm(s, p + ".downsample.2", false);
}

// The hidden width of an SE block on c channels: timm's SEModule rule,
// make_divisible(c / 16, 8, round_limit=0): c / 16 rounded to the nearest multiple of 8 (halves
// up), at least 8. (c / 16 itself for every c of the standard models, which are multiples of 128.)
int64_t se_channels(int64_t c) { return std::max<int64_t>(8, int64_t(double(c) / 16.0 + 4.0) / 8 * 8); }

// Squeeze-and-excitation on a branch's last batch norm output y (timm's SEModule, its names):
// y * sigmoid(fc2(relu(fc1(mean over h, w of y)))), fc1 and fc2 1x1 convolutions with bias.
// Efficient channel attention (Wang et al. 2020; timm's EcaModule, its names): y * sigmoid(conv of
// the channel means of y), the convolution one kernel across the channels, its size from theirs:
// t = int(|log2(c) + 1| / 2), the odd one of t and t + 1, at least 3 (5 for 256-1024 channels).
int64_t eca_kernel(int64_t c) {
  const int64_t t = int64_t(std::fabs(std::log2(double(c)) + 1.0) / 2.0);
  return std::max<int64_t>(3, t % 2 ? t : t + 1);
}

// The attention on a branch's last batch norm output y, under timm's name `se` whichever it is.
template <class T>
int attention(Net<T>& net, int y, const std::string& p, Attn attn, const std::string& model) {
  if (attn == Attn::none) return y;
  const int64_t c = net.shape(y).c;
  try {
    int s = net.global_avgpool(y, p + ".se.pool");
    if (attn == Attn::se) {
      s = net.conv(s, p + ".se.fc1", se_channels(c), 1, 1, 0, true);
      s = net.relu(s, p + ".se.act");
      s = net.conv(s, p + ".se.fc2", c, 1, 1, 0, true);
    } else {
      s = net.channel_conv(s, p + ".se.conv", eca_kernel(c));
    }
    return net.channel_gate(y, s, p + ".se.gate");
  } catch (const ShapeError&) {
    throw;
  } catch (const Error& e) {  // a backend without the gate or the channel convolution: say which model asked
    throw Error(str_cat("model ", model, ": ", e.what()));
  }
}

// The residual branch y, with stochastic depth at `drop` (none at 0), added to the shortcut.
template <class T>
int residual(Net<T>& net, int y, int sc, const std::string& p, double drop) {
  if (drop > 0) y = net.drop_path(y, p + ".drop_path", drop);
  return net.add(y, sc, p + ".add", true);
}

template <class T>
int basic_block(Net<T>& net, int x, const std::string& p, int64_t planes, int64_t stride, bool pad_a, double drop,
                const Arch& a, const std::string& model) {
  int64_t in_c = net.shape(x).c;
  int y = net.conv(x, p + ".conv1", planes, 3, stride, 1);
  y = net.batchnorm(y, p + ".bn1", true);
  y = net.conv(y, p + ".conv2", planes, 3, 1, 1);
  y = net.batchnorm(y, p + ".bn2", false);
  y = attention(net, y, p, a.attn, model);
  int sc = x;
  if (stride != 1 || in_c != planes)
    sc = pad_a ? net.pad_shortcut(x, p + ".shortcut", planes, stride)
               : shortcut_projection(net, x, p, planes, stride, a.avg_down);
  return residual(net, y, sc, p, drop);
}

template <class T>
int bottleneck_block(Net<T>& net, int x, const std::string& p, int64_t planes, int64_t stride,
                     const Arch& a, double drop, const std::string& model) {
  int64_t in_c = net.shape(x).c, out_c = planes * 4;
  // torchvision's int(planes * (base_width / 64.0)) * groups; at least one channel a group
  // where a small model.width would leave none.
  const int64_t width =
      std::max<int64_t>(1, int64_t(double(planes) * double(a.width_per_group) / 64.0)) * a.groups;
  int y = net.conv(x, p + ".conv1", width, 1, 1, 0);
  y = net.batchnorm(y, p + ".bn1", true);
  y = net.conv(y, p + ".conv2", width, 3, stride, 1, false, a.groups);  // v1.5: stride on the 3x3
  y = net.batchnorm(y, p + ".bn2", true);
  y = net.conv(y, p + ".conv3", out_c, 1, 1, 0);
  y = net.batchnorm(y, p + ".bn3", false);
  y = attention(net, y, p, a.attn, model);
  int sc = (stride != 1 || in_c != out_c) ? shortcut_projection(net, x, p, out_c, stride, a.avg_down) : x;
  return residual(net, y, sc, p, drop);
}

}  // namespace

bool is_resnet_name(const std::string& name) { return archs().count(name) > 0; }
bool is_cifar_resnet(const std::string& name) {
  const auto it = archs().find(name);
  return it != archs().end() && it->second.cifar;
}

template <class T>
std::unique_ptr<Net<T>> build_resnet(const ResNetConfig& cfg, std::unique_ptr<Backend<T>> backend) {
  auto it = archs().find(cfg.name);
  if (it == archs().end()) {
    std::string known;
    for (auto& [k, v] : archs()) known += (known.empty() ? "" : ", ") + k;
    throw Error("unknown model '" + cfg.name + "' (known: " + known + ")");
  }
  if (cfg.num_classes <= 0)
    throw ShapeError(str_cat("model ", cfg.name, ": class count must be positive, got ", cfg.num_classes));
  if (cfg.batch <= 0 || cfg.image_size <= 0 || !(cfg.width > 0))
    throw ShapeError(str_cat("model ", cfg.name, ": batch (", cfg.batch, "), image size (", cfg.image_size,
                             ") and width (", cfg.width, ") must be positive"));
  if (cfg.cifar_shortcut != "A" && cfg.cifar_shortcut != "B")
    throw Error("model " + cfg.name + ": cifar_shortcut must be A or B, got '" + cfg.cifar_shortcut + "'");
  if (!(cfg.drop_path >= 0 && cfg.drop_path < 1))
    throw Error(str_cat("model ", cfg.name, ": drop path rate must be in [0, 1), got ", cfg.drop_path));
  const Arch& a = it->second;
  // timm's schedule: block k of K drops at rate * k / (K - 1), none in the first block; a
  // forward-only network has none at all.
  int total = 0, block = 0;
  for (int b : a.blocks) total += b;
  auto drop = [&] {
    const double r = cfg.inference_only || total < 2 ? 0.0 : cfg.drop_path * double(block) / double(total - 1);
    ++block;
    return r;
  };
  auto net = std::make_unique<Net<T>>(std::move(backend), Shape{cfg.batch, 3, cfg.image_size, cfg.image_size});
  net->set_bn_sync(cfg.bn_sync);
  int x = net->input();
  if (a.cifar) {
    x = net->conv(x, "conv1", scaled(16, cfg.width), 3, 1, 1);
    x = net->batchnorm(x, "bn1", true);
    const int64_t planes[3] = {16, 32, 64};
    for (int s = 0; s < 3; ++s)
      for (int b = 0; b < a.blocks[s]; ++b)
        x = basic_block(*net, x, "layer" + std::to_string(s + 1) + "." + std::to_string(b),
                        scaled(planes[s], cfg.width), (s > 0 && b == 0) ? 2 : 1, cfg.cifar_shortcut == "A", drop(),
                        a, cfg.name);
  } else {
    if (a.stem != Stem::plain) {  // timm's names: conv1 is a sequence whose ReLUs count as members
      x = net->conv(x, "conv1.0", scaled(a.stem == Stem::tiered ? 24 : 32, cfg.width), 3, 2, 1);
      x = net->batchnorm(x, "conv1.1", true);
      x = net->conv(x, "conv1.3", scaled(32, cfg.width), 3, 1, 1);
      x = net->batchnorm(x, "conv1.4", true);
      x = net->conv(x, "conv1.6", scaled(64, cfg.width), 3, 1, 1);
    } else {
      x = net->conv(x, "conv1", scaled(64, cfg.width), 7, 2, 3);
    }
    x = net->batchnorm(x, "bn1", true);
    x = net->maxpool(x, "maxpool", 3, 2, 1);
    const int64_t planes[4] = {64, 128, 256, 512};
    for (int s = 0; s < 4; ++s)
      for (int b = 0; b < a.blocks[s]; ++b) {
        std::string p = "layer" + std::to_string(s + 1) + "." + std::to_string(b);
        int64_t stride = (s > 0 && b == 0) ? 2 : 1;
        const double d = drop();
        x = a.bottleneck ? bottleneck_block(*net, x, p, scaled(planes[s], cfg.width), stride, a, d, cfg.name)
                         : basic_block(*net, x, p, scaled(planes[s], cfg.width), stride, false, d, a, cfg.name);
      }
  }
  x = net->global_avgpool(x, "avgpool");
  x = net->linear(x, "fc", cfg.num_classes, true);
  net->loss(x, cfg.loss);
  if (cfg.inference_only) net->set_inference_only();
  if (cfg.layout_only) return net;
  net->finalize();
  init_resnet(*net, cfg.seed, cfg.zero_init_residual);
  return net;
}

template <class T>
void init_resnet(Net<T>& net, uint64_t seed, bool zero_init_residual) {
  Arena<T>& a = net.arena();
  std::mt19937_64 rng(seed);
  // The last BN of a residual branch is the BN feeding an add node's first input, through the
  // branch's stochastic depth and squeeze-and-excitation gate where it has them (nodes without
  // parameters whose first input is the branch), or the one fused with its add (a two-input node
  // with parameters: Net::fuse_bn_add).
  const auto producer = [&](int tensor) -> const Node<T>* {
    for (size_t j = 0; j < net.num_nodes(); ++j)
      if (net.node(j).output == tensor) return &net.node(j);
    return nullptr;
  };
  std::vector<std::string> last_bn;
  for (size_t i = 0; i < net.num_nodes(); ++i) {
    const Node<T>& n = net.node(i);
    if (n.inputs.size() != 2) continue;
    if (!n.params.empty()) {
      last_bn.push_back(a.info(n.params[0]).name);
      continue;
    }
    const Node<T>* p = producer(n.inputs[0]);
    while (p && p->params.empty() && !p->inputs.empty()) p = producer(p->inputs[0]);
    if (p && !p->params.empty() && a.info(p->params[0]).kind == ParamKind::bn_gamma)
      last_bn.push_back(a.info(p->params[0]).name);
  }
  // Drawn on the host (a device arena through a copy), in registration (forward) order so that
  // the values do not depend on the arena layout.
  HostView<T> params = a.host_params();
  for (int id = 0; id < int(a.layout().size()); ++id) {
    const ParamInfo& p = a.info(id);
    T* w = params.data() + p.offset;
    switch (p.kind) {
      case ParamKind::conv_weight: {
        if (p.dims.size() == 3) {  // ECA's Conv1d, which timm leaves at PyTorch's uniform(+-1/sqrt(fan_in))
          const double bound = 1.0 / std::sqrt(double(p.dims[1] * p.dims[2]));
          std::uniform_real_distribution<double> d(-bound, bound);
          for (size_t i = 0; i < p.count; ++i) w[i] = T(d(rng));
          break;
        }
        double fan_out = double(p.dims[0] * p.dims[2] * p.dims[3]);
        std::normal_distribution<double> d(0.0, std::sqrt(2.0 / fan_out));
        for (size_t i = 0; i < p.count; ++i) w[i] = T(d(rng));
        break;
      }
      case ParamKind::linear_weight:
      case ParamKind::bias: {
        // nn.Linear: kaiming_uniform(a=sqrt(5)) gives bound 1/sqrt(fan_in) for weight and bias.
        // A bias follows its weight in registration order and shares its fan-in.
        const ParamInfo& wi = p.kind == ParamKind::bias ? a.info(id - 1) : p;
        int64_t fan_in = 1;
        for (size_t k = 1; k < wi.dims.size(); ++k) fan_in *= wi.dims[k];
        std::uniform_real_distribution<double> d(-1.0 / std::sqrt(double(fan_in)), 1.0 / std::sqrt(double(fan_in)));
        for (size_t i = 0; i < p.count; ++i) w[i] = T(d(rng));
        break;
      }
      case ParamKind::bn_gamma: {
        bool zero = zero_init_residual && std::find(last_bn.begin(), last_bn.end(), p.name) != last_bn.end();
        for (size_t i = 0; i < p.count; ++i) w[i] = zero ? T(0) : T(1);
        break;
      }
      case ParamKind::bn_beta:
        for (size_t i = 0; i < p.count; ++i) w[i] = T(0);
        break;
    }
  }
  params.commit();
  HostView<T> st = a.host_state();
  for (const StateInfo& s : a.state_layout()) {
    bool var = s.name.size() > 4 && s.name.compare(s.name.size() - 4, 4, "_var") == 0;
    for (size_t i = 0; i < s.count; ++i) st[s.offset + i] = var ? T(1) : T(0);
  }
  st.commit();
}

template std::unique_ptr<Net<float>> build_resnet(const ResNetConfig&, std::unique_ptr<Backend<float>>);
template std::unique_ptr<Net<double>> build_resnet(const ResNetConfig&, std::unique_ptr<Backend<double>>);
template void init_resnet(Net<float>&, uint64_t, bool);
template void init_resnet(Net<double>&, uint64_t, bool);

}  // namespace rt

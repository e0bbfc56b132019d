// Whole networks: finite-difference check of residual blocks in double, gradient readiness in
// backward order (with an accumulated addend), and the oneDNN backend against the reference on a full ResNet step.
#include "nn/net.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "nn/resnet.h"

namespace rt {
namespace {

template <class T>
std::vector<T> random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = T(d(g));
  return v;
}

// Two residual blocks (projection shortcut, then identity), a zero-padded shortcut, pooling,
// classifier and a label-smoothed loss: every node type and both gradient-sharing paths. With
// drop > 0 both blocks' branches go through stochastic depth at that rate; their outputs' ids are
// written to drops.
std::unique_ptr<Net<double>> residual_net(double drop = 0, std::vector<int>* drops = nullptr) {
  auto net = std::make_unique<Net<double>>(make_backend<double>("reference"), Shape{2, 3, 6, 6});
  int x = net->input();
  int y = net->conv(x, "b1.conv1", 4, 3, 1, 1);
  y = net->batchnorm(y, "b1.bn1", true);
  y = net->conv(y, "b1.conv2", 4, 3, 1, 1, /*bias=*/true);
  y = net->batchnorm(y, "b1.bn2", false);
  int s = net->conv(x, "b1.downsample.0", 4, 1, 1, 0);
  s = net->batchnorm(s, "b1.downsample.1", false);
  auto branch = [&](int b, const std::string& name) {
    if (drop == 0) return b;
    const int id = net->drop_path(b, name, drop);
    if (drops) drops->push_back(id);
    return id;
  };
  x = net->add(branch(y, "b1.drop_path"), s, "b1.add", true);
  y = net->conv(x, "b2.conv1", 4, 3, 1, 1);
  y = net->batchnorm(y, "b2.bn1", true);
  y = net->conv(y, "b2.conv2", 4, 3, 1, 1);
  y = net->batchnorm(y, "b2.bn2", false);
  x = net->add(branch(y, "b2.drop_path"), x, "b2.add", true);
  y = net->conv(x, "b3.conv1", 6, 3, 2, 1);
  y = net->batchnorm(y, "b3.bn1", true);
  s = net->pad_shortcut(x, "b3.shortcut", 6, 2);
  x = net->add(y, s, "b3.add", false);
  x = net->relu(x, "b3.relu");
  x = net->maxpool(x, "pool", 2, 1, 0);
  x = net->global_avgpool(x, "gap");
  x = net->linear(x, "fc", 3);
  net->loss(x, {.label_smoothing = 0.1});
  net->finalize();
  init_resnet(*net, 7, false);
  // Non-trivial BN affine parameters so that their gradients are exercised.
  for (int id = 0; id < int(net->arena().layout().size()); ++id) {
    const ParamInfo& p = net->arena().info(id);
    if (p.kind == ParamKind::bn_gamma || p.kind == ParamKind::bn_beta) {
      auto r = random_vec<double>(p.count, 100 + id, 0.3);
      for (size_t i = 0; i < p.count; ++i) net->arena().param(id)[i] += r[i];
    }
  }
  return net;
}

// Which samples of tensor `id` (after a forward) are all zero.
std::vector<bool> zero_samples(const Net<double>& net, int id) {
  const Shape s = net.shape(id);
  std::vector<double> v(size_t(s.numel()));
  net.export_tensor(id, v.data());
  std::vector<bool> zero(size_t(s.n), true);
  for (size_t i = 0; i < v.size(); ++i) zero[i / size_t(s.chw())] = zero[i / size_t(s.chw())] && v[i] == 0;
  return zero;
}

void expect_gradients_match_differences(Net<double>& net, std::vector<double>& input, std::vector<int32_t>& labels);

void check_finite_differences(double drop) {
  std::vector<int> drops;
  auto net = residual_net(drop, &drops);
  auto input = random_vec<double>(net->shape(0).numel(), 1);
  std::vector<int32_t> labels = {2, 0};
  if (drop > 0) {
    // A key under which each block keeps one sample's branch and drops the other's: the check
    // then covers the kept branch's gradient (scaled by 1 / keep) and the dropped one's (zero).
    bool mixed = false;
    for (uint64_t key = 1; key < 1000 && !mixed; ++key) {
      net->set_noise_key(key);
      net->forward(input.data(), labels.data(), true);
      mixed = true;
      for (int id : drops) mixed = mixed && zero_samples(*net, id) != std::vector<bool>{false, false} &&
                                   zero_samples(*net, id) != std::vector<bool>{true, true};
    }
    ASSERT_TRUE(mixed) << "no key keeps one sample and drops the other in both blocks";
  }
  expect_gradients_match_differences(*net, input, labels);
}

// Every parameter's analytic gradient (6 entries each) against central differences of the loss.
void expect_gradients_match_differences(Net<double>& n, std::vector<double>& input, std::vector<int32_t>& labels) {
  Net<double>* net = &n;
  net->forward(input.data(), labels.data(), true);
  net->backward();
  auto& a = net->arena();
  std::vector<double> analytic(a.grads().begin(), a.grads().end());
  const double h = 1e-6;
  std::mt19937_64 pick(3);
  int checked = 0;
  for (const ParamInfo& p : a.layout()) {
    for (int k = 0; k < 6; ++k) {
      size_t i = p.offset + pick() % p.count;
      double* w = &a.params()[i];
      double w0 = *w;
      *w = w0 + h;
      double lp = net->forward(input.data(), labels.data(), true);
      *w = w0 - h;
      double lm = net->forward(input.data(), labels.data(), true);
      *w = w0;
      double numeric = (lp - lm) / (2 * h);
      double an = analytic[i];
      EXPECT_LE(std::fabs(an - numeric), 1e-6 * std::max({std::fabs(an), std::fabs(numeric), 1.0}))
          << p.name << "[" << i - p.offset << "] analytic " << an << " numeric " << numeric;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6 * int(a.layout().size()));
}

TEST(Net, ResidualBlocksMatchFiniteDifferencesInDouble) { check_finite_differences(0); }

// A layer nobody reads has no gradient for backward: refused when the network is finished.
TEST(Net, ALayerWhoseOutputNobodyReadsIsRefused) {
  Net<double> net(make_backend<double>("reference"), Shape{2, 3, 5, 5});
  const int a = net.conv(net.input(), "c1", 4, 3, 1, 1);
  net.conv(a, "orphan", 4, 3, 1, 1);
  net.loss(net.linear(net.global_avgpool(a, "gap"), "fc", 3), {});
  try {
    net.finalize();
    ADD_FAILURE() << "finalize() accepted a layer whose output nobody reads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the output of layer 'orphan' is read by no other layer"), std::string::npos)
        << e.what();
  }
}

// A ReLU add whose output meets one of its own inputs again in a later add: the add's in-place
// ReLU mask must not reach that input's gradient, which shared the buffer.
TEST(Net, AReluAddsMaskStaysOffAGradientItShares) {
  auto net = std::make_unique<Net<double>>(make_backend<double>("reference"), Shape{2, 3, 5, 5});
  const int a = net->conv(net->input(), "c1", 4, 3, 1, 1, /*bias=*/true);
  const int b = net->conv(a, "c2", 4, 3, 1, 1, /*bias=*/true);
  const int z = net->add(b, a, "add1", /*relu=*/true);
  int o = net->add(z, a, "add2", false);
  o = net->global_avgpool(o, "gap");
  o = net->linear(o, "fc", 3);
  net->loss(o, {});
  net->finalize();
  init_resnet(*net, 11, false);
  auto input = random_vec<double>(net->shape(0).numel(), 2);
  std::vector<int32_t> labels = {1, 2};
  expect_gradients_match_differences(*net, input, labels);
}
TEST(Net, StochasticDepthMatchesFiniteDifferencesInDouble) { check_finite_differences(0.5); }

// Stochastic depth's forward: a training sample's branch is all zero or exactly the branch times
// 1 / keep; the same key draws the same masks, another key others, about `rate` of the samples
// dropped; evaluation passes the branch as it is.
TEST(Net, StochasticDepthDropsWholeSamples) {
  const double rate = 0.25;
  Net<double> net(make_backend<double>("reference"), Shape{64, 2, 3, 3});
  const int c = net.conv(net.input(), "conv", 3, 3, 1, 1);
  const int d = net.drop_path(c, "drop_path", rate);
  net.loss(net.linear(net.global_avgpool(d, "gap"), "fc", 2), {});
  net.finalize();
  init_resnet(net, 3, false);
  const auto input = random_vec<double>(net.shape(0).numel(), 2);
  const std::vector<int32_t> labels(64, 1);
  const size_t n = size_t(net.shape(c).numel()), per = size_t(net.shape(c).chw());
  std::vector<double> branch(n), out(n), first(n);
  const double scale = double(float(1 / (1 - rate)));  // the factors are floats for every backend
  int dropped = 0;
  for (uint64_t key = 0; key < 8; ++key) {
    net.set_noise_key(key);
    net.forward(input.data(), labels.data(), true);
    net.export_tensor(c, branch.data());
    net.export_tensor(d, out.data());
    for (size_t s = 0; s < 64; ++s) {
      const bool drop = out[s * per] == 0;
      dropped += drop;
      for (size_t i = s * per; i < (s + 1) * per; ++i)
        ASSERT_EQ(out[i], drop ? 0.0 : branch[i] * scale) << "key " << key << " sample " << s;
    }
    if (key == 0) first = out;
    if (key == 1) {
      EXPECT_NE(out, first) << "keys 0 and 1 draw the same masks";
    }
  }
  EXPECT_GT(dropped, 64 * 8 * rate * 0.6);  // 128 expected of 512; 77 to 179 is far beyond 4 sigma
  EXPECT_LT(dropped, 64 * 8 * rate * 1.4);
  net.set_noise_key(0);
  net.forward(input.data(), labels.data(), true);
  net.export_tensor(d, out.data());
  EXPECT_EQ(out, first) << "the same key must draw the same masks";
  net.forward(input.data(), labels.data(), false);
  net.export_tensor(c, branch.data());
  net.export_tensor(d, out.data());
  EXPECT_EQ(out, branch) << "evaluation scales nothing";
}

// Frozen statistics: a batch norm before backward_from normalizes with its running statistics in
// training (its output is the evaluation's) and keeps them; elsewhere, or on another layer, refused.
TEST(Net, FrozenStatisticsKeepRunningValues) {
  auto net = residual_net();
  auto index = [&](const std::string& name) {
    for (size_t i = 0; i < net->num_nodes(); ++i)
      if (net->node(i).name == name) return i;
    ADD_FAILURE() << "no node " << name;
    return size_t(0);
  };
  const size_t bn = index("b1.bn1"), later = index("b2.bn1");
  net->set_backward_from(index("b2.conv1"));
  EXPECT_THROW(net->freeze_statistics(index("b1.conv1")), Error);  // not a batch norm
  EXPECT_THROW(net->freeze_statistics(later), Error);              // its backward runs
  net->freeze_statistics(bn);
  EXPECT_THROW(net->set_backward_from(0), Error);  // would run the frozen layer's backward
  auto state = net->arena().state();
  const std::vector<double> before(state.begin(), state.end());
  const auto input = random_vec<double>(net->shape(0).numel(), 4);
  const std::vector<int32_t> labels = {1, 2};
  const int out = net->node(bn).output;
  std::vector<double> eval(size_t(net->shape(out).numel())), train(eval.size());
  net->forward(input.data(), labels.data(), false);
  net->export_tensor(out, eval.data());
  net->forward(input.data(), labels.data(), true);
  net->export_tensor(out, train.data());
  EXPECT_EQ(train, eval) << "a frozen batch norm normalizes with its running statistics in training";
  state = net->arena().state();
  size_t kept = 0, moved = 0;
  for (const StateInfo& s : net->arena().state_layout()) {
    const bool same = std::equal(state.begin() + long(s.offset), state.begin() + long(s.offset + s.count),
                                 before.begin() + long(s.offset));
    if (s.name.rfind("b1.bn1.", 0) == 0) kept += same;
    else moved += !same;
  }
  EXPECT_EQ(kept, 2u);  // its running mean and variance
  EXPECT_EQ(moved, net->arena().state_layout().size() - 2);
}

// ResNet's schedule (timm's): none in the first block, the given rate in the last, linear between;
// a forward-only network has none.
TEST(Net, ResNetDropPathRatesGrowWithDepth) {
  ResNetConfig c{.name = "resnet20", .num_classes = 4, .image_size = 8, .batch = 2, .width = 0.25};
  c.drop_path = 0.2;
  auto net = build_resnet<double>(c, make_backend<double>("reference"));
  std::vector<std::string> names;
  for (size_t i = 0; i < net->num_nodes(); ++i)
    if (net->node(i).name.find("drop_path") != std::string::npos) names.push_back(net->node(i).name);
  ASSERT_EQ(names.size(), 8u);  // 9 blocks, the first without
  EXPECT_EQ(names.front(), "layer1.1.drop_path");
  EXPECT_EQ(names.back(), "layer3.2.drop_path");
  c.inference_only = true;
  auto eval = build_resnet<double>(c, make_backend<double>("reference"));
  for (size_t i = 0; i < eval->num_nodes(); ++i) EXPECT_EQ(eval->node(i).name.find("drop_path"), std::string::npos);
  c.inference_only = false;
  c.drop_path = 1.0;
  EXPECT_THROW(build_resnet<double>(c, make_backend<double>("reference")), Error);
}

TEST(Net, GradientsBecomeReadyAsAGrowingPrefix) {
  auto net = residual_net();
  auto input = random_vec<double>(net->shape(0).numel(), 1);
  std::vector<int32_t> labels = {1, 2};
  net->forward(input.data(), labels.data(), true);
  auto& a = net->arena();
  std::fill(a.grads().begin(), a.grads().end(), -12345.0);  // stays in the alignment padding
  std::vector<double> snapshot(a.size(), -12345.0);
  size_t last = 0;
  net->backward([&](size_t ready) {
    EXPECT_GE(ready, last);
    for (size_t i = last; i < ready; ++i) snapshot[i] = a.grads()[i];
    last = ready;
  });
  EXPECT_EQ(last, a.size());
  // What was reported ready was already final.
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(snapshot[i], a.grads()[i]) << "at " << i;
}

// Gradient accumulation: backward with an addend leaves grads = this pass's gradients + addend,
// and what each report makes ready already holds the sum (the reducer sends it at once).
TEST(Net, AddendIsInEveryRangeBeforeItIsReported) {
  auto net = residual_net();
  auto input = random_vec<double>(net->shape(0).numel(), 1);
  std::vector<int32_t> labels = {2, 0};
  net->forward(input.data(), labels.data(), true);
  net->backward();
  auto& a = net->arena();
  const std::vector<double> g(a.grads().begin(), a.grads().end());
  // Zero in the alignment padding, as an arena's gradients are (nothing writes there).
  const std::vector<double> noise = random_vec<double>(a.size(), 5);
  std::vector<double> add(a.size(), 0.0);
  for (const ParamInfo& p : a.layout()) std::copy_n(noise.begin() + p.offset, p.count, add.begin() + p.offset);
  net->forward(input.data(), labels.data(), true);
  std::vector<double> snapshot(a.size(), 0.0);
  size_t last = 0;
  net->backward(
      [&](size_t ready) {
        for (size_t i = last; i < ready; ++i) snapshot[i] = a.grads()[i];
        last = ready;
      },
      1.0, add.data());
  ASSERT_EQ(last, a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a.grads()[i], g[i] + add[i]) << "at " << i;
    ASSERT_EQ(snapshot[i], a.grads()[i]) << "reported before the addend was in, at " << i;
  }
  // Without a callback too, and an addend of nullptr adds nothing.
  net->forward(input.data(), labels.data(), true);
  net->backward({}, 1.0, add.data());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.grads()[i], g[i] + add[i]) << "at " << i;
  net->forward(input.data(), labels.data(), true);
  net->backward({}, 1.0, nullptr);
  EXPECT_TRUE(std::equal(g.begin(), g.end(), a.grads().begin()));
}

// A frozen stem: backward starting at the first node that trains gives the trained tensors'
// gradients bit for bit as a full backward does (on oneDNN, whose kernels would reveal a changed
// order or a missing contribution), reports the whole buffer ready, and leaves the stem's
// gradients as they were. first_node_training finds that node; past the end is refused.
TEST(Net, BackwardFromTheFirstTrainedNodeGivesTheSameGradients) {
  ResNetConfig c;
  c.name = "resnet20";
  c.batch = 4;
  c.image_size = 16;
  c.num_classes = 10;
  c.seed = 3;
  auto net = build_resnet<float>(c, make_backend<float>("onednn"));
  auto input = random_vec<float>(net->shape(0).numel(), 4);
  std::vector<int32_t> labels = {1, 5, 9, 2};
  auto& a = net->arena();
  auto stem = [](const ParamInfo& p) {
    return p.name.rfind("conv1.", 0) == 0 || p.name.rfind("bn1.", 0) == 0 || p.name.rfind("layer1.", 0) == 0;
  };
  const size_t first = net->first_node_training([&](const ParamInfo& p) { return !stem(p); });
  ASSERT_GT(first, 0u);
  ASSERT_LT(first, net->num_nodes());
  EXPECT_EQ(net->node(first).name.rfind("layer2.0.", 0), 0u) << net->node(first).name;
  EXPECT_EQ(net->first_node_training([](const ParamInfo&) { return true; }), 0u);
  EXPECT_EQ(net->first_node_training([](const ParamInfo&) { return false; }), net->num_nodes());

  net->forward(input.data(), labels.data(), true);
  net->backward();
  const std::vector<float> full(a.grads().begin(), a.grads().end());
  net->set_backward_from(first);
  EXPECT_EQ(net->backward_from(), first);
  std::fill(a.grads().begin(), a.grads().end(), 7.0f);
  net->forward(input.data(), labels.data(), true);
  size_t last = 0;
  net->backward([&](size_t ready) { last = ready; });
  EXPECT_EQ(last, a.size());
  size_t stem_tensors = 0;
  for (const ParamInfo& p : a.layout()) {
    stem_tensors += stem(p);
    for (size_t i = p.offset; i < p.offset + p.count; ++i)
      ASSERT_EQ(a.grads()[i], stem(p) ? 7.0f : full[i]) << p.name << " at " << i - p.offset;
  }
  EXPECT_EQ(stem_tensors, 21u);  // conv1, bn1 (2), layer1: 3 blocks x (2 convs + 2 BNs x 2)
  EXPECT_THROW(net->set_backward_from(net->num_nodes() + 1), Error);
}

TEST(Net, SecondStepReusesBuffersAndRepeatsExactly) {
  auto net = residual_net();
  auto input = random_vec<double>(net->shape(0).numel(), 1);
  std::vector<int32_t> labels = {0, 1};
  net->forward(input.data(), labels.data(), true);
  net->backward();
  std::vector<double> g1(net->arena().grads().begin(), net->arena().grads().end());
  size_t bytes = net->activation_bytes();
  net->forward(input.data(), labels.data(), true);
  net->backward();
  EXPECT_EQ(net->activation_bytes(), bytes);
  EXPECT_TRUE(std::equal(g1.begin(), g1.end(), net->arena().grads().begin()));
}

// A full ResNet training step on oneDNN against the reference in double (the truth): every
// gradient is at least as accurate as the float reference's own, or within rtol relative. In a
// deep net with few values per BN channel, fp32 rounding flips a few ReLU masks near zero, which
// moves some gradients by percents in either float backend (which one is luck): there the
// tolerance catches wrong layouts or missing terms (errors of order 1), not rounding.
void expect_backends_agree(const std::string& model, int64_t batch, int64_t size, int64_t classes,
                           double rtol, double width = 1.0) {
  ResNetConfig c;
  c.name = model;
  c.width = width;
  c.batch = batch;
  c.image_size = size;
  c.num_classes = classes;
  c.loss.label_smoothing = 0.1;
  c.seed = 5;
  auto ref = build_resnet<float>(c, make_backend<float>("reference"));
  auto dnn = build_resnet<float>(c, make_backend<float>("onednn"));
  auto dbl = build_resnet<double>(c, make_backend<double>("reference"));
  std::copy(ref->arena().params().begin(), ref->arena().params().end(), dbl->arena().params().begin());
  auto input = random_vec<float>(ref->shape(0).numel(), 9);
  std::vector<double> input_d(input.begin(), input.end());
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = int32_t((i * 7) % classes);
  double lt = dbl->forward(input_d.data(), labels.data(), true);
  double lr = ref->forward(input.data(), labels.data(), true);
  double ld = dnn->forward(input.data(), labels.data(), true);
  EXPECT_NEAR(ld, lt, std::max(1e-4 * std::fabs(lt), 3 * std::fabs(lr - lt))) << model;
  dbl->backward();
  ref->backward();
  dnn->backward();
  auto gt = dbl->arena().grads();
  auto gr = ref->arena().grads(), gd = dnn->arena().grads();
  for (const ParamInfo& p : ref->arena().layout()) {
    double er = 0, ed = 0, den = 0;  // squared errors against double, per tensor
    for (size_t i = p.offset; i < p.offset + p.count; ++i) {
      er += (gr[i] - gt[i]) * (gr[i] - gt[i]);
      ed += (gd[i] - gt[i]) * (gd[i] - gt[i]);
      den += gt[i] * gt[i];
    }
    EXPECT_LE(std::sqrt(ed), std::max(3 * std::sqrt(er), rtol * std::sqrt(den)) + 1e-7)
        << model << " " << p.name << ": onednn error " << std::sqrt(ed / den) << ", float reference error "
        << std::sqrt(er / den);
  }
  auto st = dbl->arena().state();
  auto sd = dnn->arena().state();
  for (size_t i = 0; i < st.size(); ++i)
    ASSERT_NEAR(sd[i], st[i], 1e-4 + 1e-3 * std::fabs(st[i])) << model << " state " << i;
}

// The diagnosis after a non-finite gradient: forward again, stop at the first node whose output
// is not finite. A poisoned weight is found at its own layer; finite weights give -1.
TEST(Net, FirstNonfiniteNodeNamesThePoisonedLayer) {
  auto net = residual_net();
  auto x = random_vec<double>(size_t(net->shape(0).numel()), 5);
  std::vector<int32_t> labels = {0, 2};
  EXPECT_EQ(net->first_nonfinite_node(x.data(), labels.data()), -1);
  for (const char* layer : {"b2.conv2", "fc"}) {
    auto again = residual_net();
    for (const ParamInfo& p : again->arena().layout())
      if (p.name == std::string(layer) + ".weight") again->arena().params()[p.offset + 1] = std::nan("");
    const int node = again->first_nonfinite_node(x.data(), labels.data());
    ASSERT_GE(node, 0) << layer;
    EXPECT_EQ(again->node(size_t(node)).name, layer);
  }
  // A non-finite input (normalisation beyond the element type's range) is the input's doing,
  // not the first layer's.
  x[7] = std::numeric_limits<double>::infinity();
  EXPECT_EQ(net->first_nonfinite_node(x.data(), labels.data()), Net<double>::kNonFiniteInput);
}

TEST(Net, OnednnResNetStepMatchesReference) {
  expect_backends_agree("resnet20", 4, 16, 10, 1e-3);
  expect_backends_agree("resnet18", 2, 64, 10, 1e-3);
  // 8 values per BN channel in layer4: both float backends are 2-4% off double here. At half
  // width (up to 1024 channels: oneDNN's kernels for wide layers), a quarter of the work.
  expect_backends_agree("resnet50", 2, 64, 10, 0.1, 0.5);
}

}  // namespace
}  // namespace rt

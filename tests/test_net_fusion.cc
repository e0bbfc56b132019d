// Batch norm fused with the residual add that reads it (Backend::fuses_bn_add): the reference
// backend's fused op equals a batch norm and then an add bit for bit, and a Net that fuses
// trains bit for bit as one that does not, with the same arena layout, fewer nodes, and
// gradients reported ready only once final.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "nn/net.h"
#include "nn/resnet.h"
#include "tests/forwarding_backend.h"

namespace rt {
namespace {

// The reference backend, fusing.
template <class T>
class FusingReference final : public test::ForwardingBackend<T> {
 public:
  bool fuses_bn_add() const override { return true; }
};

std::vector<float> random_vec(size_t n, std::mt19937& g, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

// forward_train_add / forward_eval_add against forward_* followed by the add op, with and without
// the ReLU, in float (where rounding between the two steps matters).
TEST(NetFusion, ReferenceOpEqualsBatchNormThenAdd) {
  auto be = make_backend<float>("reference");
  const Shape s{3, 5, 4, 2};
  std::mt19937 g(7);
  const size_t n = size_t(s.numel());
  const auto x = random_vec(n, g, -3, 5), r = random_vec(n, g, -2, 2);
  const auto gamma = random_vec(5, g, 0.5, 2), beta = random_vec(5, g, -1, 1);
  for (bool relu : {false, true}) {
    SCOPED_TRACE(relu ? "relu" : "no relu");
    BatchNormDesc plain{"bn", s, 1e-5, 0.1, false};
    BatchNormDesc fused = plain;
    fused.residual = true;
    fused.relu = relu;
    auto bn = be->make_batchnorm(plain), bnr = be->make_batchnorm(fused);
    auto add = be->make_add({"add", s, relu});
    std::vector<float> z(n), want(n), got(n), rm1(5, 0.f), rv1(5, 1.f), rm2 = rm1, rv2 = rv1;
    bn->forward_train(x.data(), gamma.data(), beta.data(), z.data(), rm1.data(), rv1.data());
    add->forward(z.data(), r.data(), want.data());
    bnr->forward_train_add(x.data(), r.data(), gamma.data(), beta.data(), got.data(), rm2.data(), rv2.data());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), n * sizeof(float)), 0);
    EXPECT_EQ(rm1, rm2);
    EXPECT_EQ(rv1, rv2);
    bn->forward_eval(x.data(), gamma.data(), beta.data(), rm1.data(), rv1.data(), z.data());
    add->forward(z.data(), r.data(), want.data());
    bnr->forward_eval_add(x.data(), r.data(), gamma.data(), beta.data(), rm2.data(), rv2.data(), got.data());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), n * sizeof(float)), 0);
    // Backward takes bn(x)'s gradient (the add masked it): no second mask.
    const std::vector<float> dy0 = random_vec(n, g, -1, 1);
    std::vector<float> dy = dy0, dx1(n), dx2(n), dg1(5), dg2(5), db1(5), db2(5);
    bn->backward(x.data(), gamma.data(), z.data(), dy.data(), dx1.data(), dg1.data(), db1.data());
    bnr->backward(x.data(), gamma.data(), nullptr, dy.data(), dx2.data(), dg2.data(), db2.data());
    EXPECT_EQ(dx1, dx2);
    EXPECT_EQ(dg1, dg2);
    EXPECT_EQ(db1, db2);
    // With the ReLU, backward_add_relu from the unmasked gradient: the add's mask in place, then
    // the same backward.
    ASSERT_EQ(bnr->masks_add_relu(), relu);
    if (relu) {
      std::vector<float> g = dy0, masked = dy0;
      add->backward(got.data(), masked.data(), masked.data());
      ASSERT_NE(masked, dy0) << "nothing masked";
      std::fill(dx2.begin(), dx2.end(), 0.f);
      bnr->backward_add_relu(x.data(), gamma.data(), got.data(), g.data(), dx2.data(), dg2.data(), db2.data());
      EXPECT_EQ(g, masked);
      std::vector<float> dx3(n), dg3(5), db3(5);
      bn->backward(x.data(), gamma.data(), z.data(), masked.data(), dx3.data(), dg3.data(), db3.data());
      EXPECT_EQ(dx2, dx3);
      EXPECT_EQ(dg2, dg3);
      EXPECT_EQ(db2, db3);
    }
  }
  // A backend that does not fuse refuses the call.
  auto dnn = make_backend<float>("onednn");
  ASSERT_FALSE(dnn->fuses_bn_add());
  auto op = dnn->make_batchnorm({"bn", s});
  std::vector<float> y(n), rm(5), rv(5, 1.f);
  EXPECT_THROW(op->forward_train_add(x.data(), r.data(), gamma.data(), beta.data(), y.data(), rm.data(), rv.data()),
               Error);
  EXPECT_FALSE(op->masks_add_relu());
  EXPECT_THROW(op->backward_add_relu(x.data(), gamma.data(), y.data(), y.data(), y.data(), rm.data(), rv.data()),
               Error);
}

struct Run {
  std::vector<float> losses, grads, params, state, eval_logits;
  std::vector<std::pair<size_t, std::vector<float>>> reports;  // each on_ready prefix as reported
  size_t nodes = 0;
  std::vector<ParamInfo> layout;
};

// Two SGD steps (plain, on the host) and an evaluation forward; every on_ready prefix copied
// when reported.
Run train(const ResNetConfig& c, std::unique_ptr<Backend<float>> be) {
  auto net = build_resnet<float>(c, std::move(be));
  Run r;
  r.nodes = net->num_nodes();
  r.layout = net->arena().layout();
  std::mt19937 g(3);
  const auto x = random_vec(size_t(net->shape(0).numel()), g, -1, 1);
  std::vector<int32_t> labels(size_t(c.batch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t((5 * i + 1) % size_t(c.num_classes));
  for (int step = 0; step < 2; ++step) {
    r.losses.push_back(float(net->forward(x.data(), labels.data(), true)));
    r.reports.clear();
    auto grads = net->arena().grads();
    net->backward([&](size_t n) { r.reports.push_back({n, std::vector<float>(grads.data(), grads.data() + n)}); });
    auto p = net->arena().params();
    for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.05f * grads[i];
  }
  auto grads = net->arena().grads();
  r.grads.assign(grads.begin(), grads.end());
  auto p = net->arena().params();
  r.params.assign(p.begin(), p.end());
  auto st = net->arena().state();
  r.state.assign(st.begin(), st.end());
  net->forward(x.data(), labels.data(), false);
  r.eval_logits.resize(size_t(net->shape(net->logits()).numel()));
  net->export_tensor(net->logits(), r.eval_logits.data());
  return r;
}

void expect_fused_equals_plain(const ResNetConfig& c, size_t blocks) {
  SCOPED_TRACE(c.name);
  const Run plain = train(c, make_backend<float>("reference"));
  const Run fused = train(c, std::make_unique<FusingReference<float>>());
  EXPECT_EQ(fused.nodes + blocks, plain.nodes) << "one node fewer per residual block";
  ASSERT_EQ(fused.layout.size(), plain.layout.size());
  for (size_t i = 0; i < plain.layout.size(); ++i) {
    EXPECT_EQ(fused.layout[i].name, plain.layout[i].name);
    EXPECT_EQ(fused.layout[i].offset, plain.layout[i].offset);
  }
  EXPECT_EQ(fused.losses, plain.losses);
  EXPECT_EQ(fused.grads, plain.grads);
  EXPECT_EQ(fused.params, plain.params);
  EXPECT_EQ(fused.state, plain.state);
  EXPECT_EQ(fused.eval_logits, plain.eval_logits);
  // Reported prefixes grow, end with the whole buffer, and held their final values already.
  size_t last = 0;
  for (const auto& [n, prefix] : fused.reports) {
    EXPECT_GE(n, last);
    last = n;
    EXPECT_EQ(std::memcmp(prefix.data(), fused.grads.data(), n * sizeof(float)), 0)
        << "gradients [0, " << n << ") reported before they were final";
  }
  EXPECT_EQ(last, fused.grads.size());
}

TEST(NetFusion, FusedResNetsTrainAsUnfused) {
  ResNetConfig c;
  c.num_classes = 10;
  c.batch = 2;
  for (bool zero : {false, true}) {  // zero-init finds the branch's last batch norm, fused or not
    SCOPED_TRACE(zero ? "zero-init residual" : "");
    c.zero_init_residual = zero;
    c.name = "resnet20";  // padded identity shortcuts
    c.image_size = 8;
    c.width = 0.5;
    expect_fused_equals_plain(c, 9);
    c.name = "resnet18";  // basic blocks, projection shortcuts computed after the branch
    c.image_size = 32;
    c.width = 0.125;
    expect_fused_equals_plain(c, 8);
    c.name = "resnet50";  // bottlenecks
    c.width = 0.0625;
    expect_fused_equals_plain(c, 16);
  }
}

}  // namespace
}  // namespace rt

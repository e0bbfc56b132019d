// A backend's memory spaces reach every buffer of the Net (activations, gradient slots, arena),
// without changing a single result, also where the host may not touch them; make_backend("cuda")
// fails clearly where it is not usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "nn/net.h"
#include "nn/resnet.h"
#include "tests/forwarding_backend.h"
#include "tests/sealed_backend.h"

namespace rt {
namespace {

// Host memory that counts, standing in for a device's.
class CountingSpace final : public MemorySpace {
 public:
  CountingSpace(std::string name, bool host) : name_(std::move(name)), host_(host) {}
  std::string name() const override { return name_; }
  void* allocate(size_t bytes) const override {
    void* p = std::aligned_alloc(64, bytes);
    std::memset(p, 0, bytes);
    ++allocs;
    live += int64_t(bytes);
    return p;
  }
  void deallocate(void* p, size_t bytes) const noexcept override {
    std::free(p);
    live -= int64_t(bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    ++copies;
    std::memcpy(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) const override { std::memset(p, 0, bytes); }
  void to_host(void* h, const void* src, size_t bytes) const override { std::memcpy(h, src, bytes); }
  void from_host(void* dst, const void* h, size_t bytes) const override { std::memcpy(dst, h, bytes); }
  bool host_accessible() const override { return host_; }
  mutable int64_t allocs = 0, live = 0, copies = 0;

 private:
  std::string name_;
  bool host_;
};

struct Spaces {
  CountingSpace acts{"counted activations", false}, params{"counted arena", true};
  int64_t syncs = 0;
};

// The reference backend with its memory in counted spaces.
class SpacedBackend final : public test::ForwardingBackend<float> {
 public:
  explicit SpacedBackend(Spaces& s) : s_(s) {}
  std::string name() const override { return "spaced"; }
  const MemorySpace* act_memory() const override { return &s_.acts; }
  const MemorySpace* param_memory() const override { return &s_.params; }
  void sync() const override { ++s_.syncs; }

 private:
  Spaces& s_;
};

// A ResNet-20 small enough to train here in a blink.
ResNetConfig small_resnet() {
  ResNetConfig c;
  c.name = "resnet20";
  c.num_classes = 10;
  c.image_size = 16;
  c.batch = 2;
  c.width = 0.5;
  return c;
}

// Profiling a Net on a device backend times each node's own work: the host waits for the device
// before and after every node, in forward and in backward; without profiling, forward waits for
// nothing.
TEST(NetMemory, ProfilingSyncsAroundEachNode) {
  Spaces s;
  auto net = build_resnet<float>(small_resnet(), std::make_unique<SpacedBackend>(s));
  const std::vector<float> x(size_t(net->shape(0).numel()), 0.25f);
  const std::vector<int32_t> labels = {1, 8};
  const auto nodes = int64_t(net->num_nodes());
  int64_t before = s.syncs;
  net->queue_forward(x.data(), labels.data(), true);
  EXPECT_EQ(s.syncs - before, 0);
  net->set_profiling(true);
  before = s.syncs;
  net->queue_forward(x.data(), labels.data(), true);
  EXPECT_EQ(s.syncs - before, 2 * nodes);
  before = s.syncs;
  net->backward();
  EXPECT_EQ(s.syncs - before, 2 * nodes + 1);  // and backward's closing one
  for (const auto& t : net->node_times()) EXPECT_EQ(t.calls, 1);
}

TEST(NetMemory, EveryBufferInTheBackendsSpacesSameResults) {
  const ResNetConfig c = small_resnet();
  Spaces s;
  {
    auto plain = build_resnet<float>(c, make_backend<float>("reference"));
    auto spaced = build_resnet<float>(c, std::make_unique<SpacedBackend>(s));
    EXPECT_EQ(s.params.allocs, 3);  // parameters, gradients, running statistics
    std::mt19937 g(1);
    std::normal_distribution<float> nd;
    std::vector<float> x(size_t(plain->shape(0).numel()));
    for (auto& v : x) v = nd(g);
    const std::vector<int32_t> labels = {1, 8};
    for (int step = 0; step < 2; ++step) {
      EXPECT_EQ(spaced->forward(x.data(), labels.data(), true),
                plain->forward(x.data(), labels.data(), true));
      int64_t ready_calls = 0;
      const int64_t syncs_before = s.syncs;
      plain->backward();
      spaced->backward([&](size_t) { ++ready_calls; });
      EXPECT_EQ(s.syncs - syncs_before, ready_calls);  // the host waits before each report
      auto gp = plain->arena().grads(), gs = spaced->arena().grads();
      ASSERT_EQ(std::memcmp(gp.data(), gs.data(), gp.size_bytes()), 0);
      auto sp = plain->arena().state(), ss = spaced->arena().state();
      ASSERT_EQ(std::memcmp(sp.data(), ss.data(), sp.size_bytes()), 0);
    }
    EXPECT_GT(s.acts.allocs, 0);
    // Every buffer went through the space (each rounded up to 64 bytes there).
    EXPECT_GE(size_t(s.acts.live), spaced->activation_bytes());
    EXPECT_LT(size_t(s.acts.live), spaced->activation_bytes() + 64 * size_t(s.acts.allocs));
    const int64_t allocs = s.acts.allocs;
    spaced->forward(x.data(), labels.data(), true);
    spaced->backward();
    EXPECT_EQ(s.acts.allocs, allocs);  // the step allocates nothing
  }
  EXPECT_EQ(s.acts.live, 0);
  EXPECT_EQ(s.params.live, 0);
}

// An evaluation network (forward only): the same logits, bit for bit, as the training network
// evaluating, from a fraction of the activation memory; weights taken from a network of the
// same model at another input size; backward refused.
TEST(NetMemory, InferenceOnlyNetSameLogitsLessMemory) {
  for (const char* backend : {"reference", "onednn"}) {
    ResNetConfig c = small_resnet();
    c.seed = 3;
    auto train = build_resnet<float>(c, make_backend<float>(backend));
    c.inference_only = true;
    c.seed = 4;  // other initial weights, replaced by train's below
    auto eval = build_resnet<float>(c, make_backend<float>(backend));
    std::mt19937 g(2);
    std::normal_distribution<float> nd;
    std::vector<float> x(size_t(train->shape(0).numel()));
    for (auto& v : x) v = nd(g);
    const std::vector<int32_t> labels = {3, 5};
    train->forward(x.data(), labels.data(), true);  // running statistics move away from the start
    train->backward();
    eval->arena().copy_from(train->arena());
    const int64_t nl = train->shape(train->logits()).numel();
    std::vector<float> a(static_cast<size_t>(nl)), b(static_cast<size_t>(nl));
    const double la = train->forward(x.data(), labels.data(), false);
    train->export_tensor(train->logits(), a.data());
    const double lb = eval->forward(x.data(), labels.data(), false);
    eval->export_tensor(eval->logits(), b.data());
    EXPECT_EQ(la, lb) << backend;
    EXPECT_EQ(a, b) << backend;
    EXPECT_LT(eval->activation_bytes() * 3, train->activation_bytes()) << backend;
    EXPECT_THROW(eval->backward(), Error);
    // The same model at a larger input takes the weights; another model does not.
    ResNetConfig big = c;
    big.image_size = 24;
    auto larger = build_resnet<float>(big, make_backend<float>(backend));
    larger->arena().copy_from(train->arena());
    std::vector<float> wa(train->arena().size()), wb(wa.size());
    train->arena().params_to_host(wa);
    larger->arena().params_to_host(wb);
    EXPECT_EQ(wa, wb);
    ResNetConfig other = c;
    other.name = "resnet32";
    EXPECT_THROW(build_resnet<float>(other, make_backend<float>(backend))->arena().copy_from(train->arena()), Error);
  }
}

// Ops that hand every call to another backend's and, like the default, claim to read x and y
// in backward.
struct ForwardingBn : BatchNormOp<float> {
  explicit ForwardingBn(std::unique_ptr<BatchNormOp<float>> in) : in(std::move(in)) {}
  void forward_train(const float* x, const float* g, const float* b, float* y, float* m, float* v) override {
    in->forward_train(x, g, b, y, m, v);
  }
  void forward_eval(const float* x, const float* g, const float* b, const float* m, const float* v,
                    float* y) override {
    in->forward_eval(x, g, b, m, v, y);
  }
  void backward(const float* x, const float* g, const float* y, const float* dy, float* dx, float* dg,
                float* db) override {
    in->backward(x, g, y, dy, dx, dg, db);
  }
  std::unique_ptr<BatchNormOp<float>> in;
};
struct ForwardingPool : MaxPoolOp<float> {
  explicit ForwardingPool(std::unique_ptr<MaxPoolOp<float>> in) : in(std::move(in)) {}
  void forward(const float* x, float* y, bool train) override { in->forward(x, y, train); }
  void backward(const float* x, const float* y, const float* dy, float* dx) override { in->backward(x, y, dy, dx); }
  std::unique_ptr<MaxPoolOp<float>> in;
};

// A batch norm whose backward does not read y (backward_reads_y() false, as the oneDNN and
// 16-bit GPU backends', which recompute the ReLU's mask from x) and a max pooling that reads
// neither x nor y (backward_reads_xy() false, as those that record the argmax): here the
// reference's ops, keeping private copies, so that they need nothing of the Net's memory after
// forward. `nulls` counts the backward calls that got null pointers.
struct OwnMaskBatchNorm final : ForwardingBn {
  OwnMaskBatchNorm(std::unique_ptr<BatchNormOp<float>> in, size_t n, int& nulls)
      : ForwardingBn(std::move(in)), y(n), nulls(nulls) {}
  void forward_train(const float* x, const float* g, const float* b, float* out, float* m, float* v) override {
    in->forward_train(x, g, b, out, m, v);
    std::copy(out, out + y.size(), y.begin());
  }
  void backward(const float* x, const float* g, const float* out, const float* dy, float* dx, float* dg,
                float* db) override {
    nulls += out == nullptr;
    in->backward(x, g, y.data(), dy, dx, dg, db);
  }
  bool backward_reads_y() const override { return false; }
  std::vector<float> y;
  int& nulls;
};
struct OwnCopyMaxPool final : ForwardingPool {
  OwnCopyMaxPool(std::unique_ptr<MaxPoolOp<float>> in, size_t nx, size_t ny, int& nulls)
      : ForwardingPool(std::move(in)), x(nx), y(ny), nulls(nulls) {}
  void forward(const float* in_x, float* out, bool train) override {
    in->forward(in_x, out, train);
    std::copy(in_x, in_x + x.size(), x.begin());
    std::copy(out, out + y.size(), y.begin());
  }
  void backward(const float* in_x, const float* out, const float* dy, float* dx) override {
    nulls += !in_x && !out;
    in->backward(x.data(), y.data(), dy, dx);
  }
  bool backward_reads_xy() const override { return false; }
  std::vector<float> x, y;
  int& nulls;
};
class OwnMaskBackend final : public test::ForwardingBackend<float> {
 public:
  std::unique_ptr<BatchNormOp<float>> make_batchnorm(const BatchNormDesc& d) override {
    ++made;
    return std::make_unique<OwnMaskBatchNorm>(ForwardingBackend::make_batchnorm(d), act_size(d.in), null_ys);
  }
  std::unique_ptr<MaxPoolOp<float>> make_maxpool(const MaxPoolDesc& d) override {
    ++made;
    return std::make_unique<OwnCopyMaxPool>(ForwardingBackend::make_maxpool(d), act_size(d.in), act_size(d.out()),
                                            null_ys);
  }
  int made = 0, null_ys = 0;
};

// A ResNet with the ImageNet stem (batch norm, ReLU, max pooling), small.
ResNetConfig stem_resnet() {
  ResNetConfig c = small_resnet();
  c.name = "resnet18";
  c.image_size = 32;
  c.width = 0.25;
  return c;
}

// Steps of SGD (on the host) on one batch, side by side: losses and gradients equal bit for bit.
void expect_same_training(Net<float>& a, Net<float>& b, int steps) {
  std::mt19937 g(5);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(a.shape(0).numel()));
  for (auto& v : x) v = nd(g);
  const std::vector<int32_t> labels = {3, 5};
  for (int step = 0; step < steps; ++step) {
    EXPECT_EQ(a.forward(x.data(), labels.data(), true), b.forward(x.data(), labels.data(), true));
    a.backward();
    b.backward();
    const auto ga = a.arena().grads(), gb = b.arena().grads();
    ASSERT_EQ(std::memcmp(ga.data(), gb.data(), ga.size_bytes()), 0) << "step " << step;
    for (auto* n : {&a, &b}) {
      auto p = n->arena().params();
      auto gr = n->arena().grads();
      for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.1f * gr[i];
    }
  }
}

// Then a ResNet stem's batch norm output, which only max pooling reads, is not held through
// backward (411 MB of ResNet-50's bf16 activations at batch 256): it lives in a slot that
// gradients use later. Backward gets null pointers, and the results are the same bit for bit.
TEST(NetMemory, OutputOfABatchNormThatRecomputesItsMaskIsNotKept) {
  const ResNetConfig c = stem_resnet();
  auto plain = build_resnet<float>(c, make_backend<float>("reference"));
  auto own_be = std::make_unique<OwnMaskBackend>();
  OwnMaskBackend& be = *own_be;
  auto own = build_resnet<float>(c, std::move(own_be));
  expect_same_training(*plain, *own, 2);
  EXPECT_EQ(be.null_ys, 2 * be.made) << "every backward without y (and x)";
  // The stem's batch norm output, [2, 16, 16, 16] floats, no longer among the kept tensors (the
  // first step's slots then come out a little smaller too: 40 KiB less in all here).
  const Shape stem{c.batch, 16, 16, 16};
  EXPECT_GE(plain->activation_bytes(), own->activation_bytes() + size_t(stem.numel()) * sizeof(float));
}

// The oneDNN backend's batch norm and max pooling read neither (the mask recomputed, the argmax
// in oneDNN's workspace): its ResNets hold at least the stem's output less than the same backend
// whose ops claim to read them (Keeping, through the forwarding ops), with the same results (null
// pointers not read).
class Keeping final : public test::ForwardingBackend<float> {
 public:
  Keeping() : ForwardingBackend(make_backend<float>("onednn")) {}
  std::unique_ptr<BatchNormOp<float>> make_batchnorm(const BatchNormDesc& d) override {
    return std::make_unique<ForwardingBn>(ForwardingBackend::make_batchnorm(d));
  }
  std::unique_ptr<MaxPoolOp<float>> make_maxpool(const MaxPoolDesc& d) override {
    return std::make_unique<ForwardingPool>(ForwardingBackend::make_maxpool(d));
  }
};

TEST(NetMemory, OnednnKeepsNoStemOutputForBackward) {
  auto dnn = make_backend<float>("onednn");
  const Shape stem{2, 16, 16, 16};
  EXPECT_FALSE(dnn->make_batchnorm({"bn", stem, 1e-5, 0.1, true})->backward_reads_y());
  EXPECT_FALSE(dnn->make_maxpool({"pool", stem, 3, 2, 1})->backward_reads_xy());
  const ResNetConfig c = stem_resnet();
  auto keeping = build_resnet<float>(c, std::make_unique<Keeping>());
  auto plain = build_resnet<float>(c, std::move(dnn));
  expect_same_training(*plain, *keeping, 2);
  EXPECT_GE(keeping->activation_bytes(), plain->activation_bytes() + plain->backend().act_size(stem) * sizeof(float));
}

std::vector<float> host_params(Arena<float>& a) {
  std::vector<float> v(a.size());
  a.params_to_host(v);
  return v;
}

// A device arena the host cannot dereference (tests/sealed_backend.h): set-up, training steps,
// the optimizer and the gradient pass reach it only through copies, with the same results.
TEST(NetMemory, SealedArenaReachedOnlyThroughCopies) {
  const ResNetConfig c = small_resnet();
  auto plain = build_resnet<float>(c, make_backend<float>("reference"));
  auto sealed = build_resnet<float>(c, std::make_unique<test::SealedBackend>());
  Arena<float>& pa = plain->arena();
  Arena<float>& sa = sealed->arena();
  ASSERT_FALSE(sa.host_accessible());
  EXPECT_EQ(host_params(sa), std::vector<float>(pa.params().begin(), pa.params().end()));  // initialisation
  std::vector<float> st(sa.state().size());
  sa.state_to_host(st);
  EXPECT_EQ(st, std::vector<float>(pa.state().begin(), pa.state().end()));

  for (bool lars : {false, true}) {
    SgdConfig sc;
    sc.lars = lars;
    auto po = plain->backend().make_sgd(pa.layout(), sc), so = sealed->backend().make_sgd(sa.layout(), sc);
    std::mt19937 g(1);
    std::normal_distribution<float> nd;
    std::vector<float> x(size_t(plain->shape(0).numel()));
    for (auto& v : x) v = nd(g);
    const std::vector<int32_t> labels = {1, 8};
    for (int step = 0; step < 2; ++step) {
      EXPECT_EQ(sealed->forward(x.data(), labels.data(), true), plain->forward(x.data(), labels.data(), true));
      size_t last = 0;
      plain->backward();
      sealed->backward([&](size_t n) { last = n; }, 1024.0);
      EXPECT_EQ(last, sa.size());
      EXPECT_EQ(sealed->backend().scale_count_nonfinite(sa.grads().data(), sa.size(), 1.0f / 1024, true), 0u);
      std::vector<float> gs(sa.size());
      sa.grads_to_host(gs);
      ASSERT_EQ(gs, std::vector<float>(pa.grads().begin(), pa.grads().end()));
      po->step(pa.params().data(), pa.grads().data(), 0.1);
      so->step(sa.params().data(), sa.grads().data(), 0.1);
      ASSERT_EQ(host_params(sa), std::vector<float>(pa.params().begin(), pa.params().end()));
      sa.state_to_host(st);
      ASSERT_EQ(st, std::vector<float>(pa.state().begin(), pa.state().end()));
    }
  }
  // The rare count of the gradient pass, on a copy.
  const float nan = std::nanf("");
  sa.grads_from_host({&nan, 1}, 3);
  EXPECT_EQ(sealed->backend().scale_count_nonfinite(sa.grads().data(), sa.size(), 0.5f, true), 1u);
  // A host view is a copy, written back by commit().
  HostView<float> v = sa.host_params();
  EXPECT_TRUE(v.copied());
  v[5] = 42.0f;
  EXPECT_NE(host_params(sa)[5], 42.0f);
  v.commit();
  EXPECT_EQ(host_params(sa)[5], 42.0f);
  EXPECT_FALSE(pa.host_params().copied());  // host memory: no copy
}

// What makes the test above fail if host code dereferences the arena again.
TEST(NetMemoryDeathTest, SealedArenaFaultsOnAHostDereference) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ResNetConfig c;
  c.name = "resnet20";
  c.num_classes = 10;
  c.image_size = 8;
  c.batch = 1;
  c.width = 0.25;
  auto sealed = build_resnet<float>(c, std::make_unique<test::SealedBackend>());
  EXPECT_DEATH(
      {
        volatile float v = sealed->arena().params()[0];
        (void)v;
      },
      "sealed test memory: the host dereferenced");
}

TEST(NetMemory, CudaBackendUnavailableNamesIt) {
  for (const std::string name : {"cuda", "cuda-tf32", "cuda-bf16", "cuda-fp16"}) {
    try {
      make_backend<float>(name);
      FAIL() << "no " << name << " backend is registered in this program";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("backend '" + name + "' is not"), std::string::npos) << m;  // the one asked for
      EXPECT_TRUE(m.find("built without CUDA") != std::string::npos ||
                  m.find("register_backend") != std::string::npos)
          << m;
    }
  }
}

}  // namespace
}  // namespace rt

// Whole small ResNets on the 16-bit backends (cuda-bf16, cuda-fp16; one suite for both) against the
// fp32 reference: two training steps' forward and backward with loss scaling, evaluation
// through the running statistics, the backend by name, and no device allocation in a
// steady-state step.
//
// These nets are small (batches of 4 and 8, batch norm over few values, ReLU masks), and their
// gradients are sensitive: moving the weights by one rounding of the 16-bit type changes the fp32
// reference's own gradients by several percent (the whole gradient's cosine to the unperturbed one
// drops to about 0.99 for fp16's unit roundoff and 0.92 for bf16's), because values near a ReLU's
// or a max's threshold switch sides. So fixed per-tensor bounds cannot hold for any correct
// 16-bit backend; each step holds the backend to the reference's own sensitivity instead: a
// second reference whose weights start multiplied by (1 + u N(0, 1)), u the type's unit roundoff,
// is compared with the reference the same way, and the backend must agree with the reference at
// least about as well: its gradient error 1 - cosine at most twice the perturbed reference's over
// the whole gradient and eight times per tensor (or 5%), its BN running statistics within twice
// the perturbed reference's error (or 2%), and its loss within twice the largest error of four
// such references (or 3%): after an SGD step the loss moves by several times its first-step
// error, so one sample of the perturbation is too narrow a yardstick for it.
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>

#include "cuda/backend.h"
#include "cuda/lowp_backend.h"
#include "cuda/memory.h"
#include "gpu_test_util.h"
#include "lowp_test_util.h"
#include "nn/resnet.h"

namespace rt::cuda {
namespace {

using test::Kind;  // the storage type, its backend's name and its unit roundoff
class GpuLowpResNet : public ::testing::TestWithParam<Kind> {};
INSTANTIATE_TEST_SUITE_P(Types, GpuLowpResNet, ::testing::Values(test::kBf16, test::kFp16),
                         test::kind_name);

ResNetConfig cifar_resnet20() {
  ResNetConfig c;
  c.name = "resnet20";  // 3x3 convs, padded shortcuts (A), BN + fused ReLU, residual adds
  c.num_classes = 10;
  c.image_size = 16;
  c.batch = 8;
  c.width = 0.5;
  c.seed = 3;
  return c;
}

ResNetConfig imagenet_resnet18() {
  ResNetConfig c;
  c.name = "resnet18";  // 7x7 stride-2 stem, max pool, 1x1 projection shortcuts
  c.num_classes = 10;
  c.image_size = 32;
  c.batch = 4;
  c.width = 0.125;
  c.seed = 4;
  return c;
}

ResNetConfig imagenet_resnext50() {
  ResNetConfig c;
  c.name = "resnext50_32x4d";  // grouped 3x3 convolutions: 32 groups of 1, 2, 4 and 8 channels
  c.num_classes = 10;
  c.image_size = 64;
  c.batch = 4;
  c.width = 0.25;
  c.seed = 6;
  return c;
}

struct Agreement {
  double cosine = 0, normalised_max = 0;
};
Agreement agreement(std::span<const float> got, std::span<const float> ref) {
  double dot = 0, gg = 0, rr = 0, num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    dot += double(got[i]) * ref[i];
    gg += double(got[i]) * got[i];
    rr += double(ref[i]) * ref[i];
    num = std::max(num, std::abs(double(got[i]) - ref[i]));
    den = std::max(den, std::abs(double(ref[i])));
  }
  Agreement a;
  a.cosine = (gg > 0 && rr > 0) ? dot / std::sqrt(gg * rr) : (gg == rr ? 1.0 : 0.0);
  a.normalised_max = den > 0 ? num / den : num;
  return a;
}

std::vector<float> random_input(const Shape& s, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(size_t(s.numel()));
  for (auto& x : v) x = nd(g);
  return v;
}

std::vector<int32_t> labels_for(int64_t n, int64_t classes) {
  std::vector<int32_t> l(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) l[size_t(i)] = int32_t((3 * i + 1) % classes);
  return l;
}

void expect_matches_reference(const ResNetConfig& cfg, const Kind& k) {
  SCOPED_TRACE(cfg.name);
  auto ref = build_resnet<float>(cfg, make_backend<float>("reference"));
  // Perturbed references: the loss after an SGD step swings by several times its error at the
  // first step, so its bound takes the largest deviation of a few perturbations; the gradients
  // are held to the first one's.
  std::vector<std::unique_ptr<Net<float>>> perts;
  for (uint32_t seed = 11; seed < 15; ++seed) {
    perts.push_back(build_resnet<float>(cfg, make_backend<float>("reference")));
    std::vector<float> p(ref->arena().params().begin(), ref->arena().params().end());
    std::mt19937 g(seed);
    std::normal_distribution<float> nd(0.0f, float(k.unit));
    for (auto& v : p) v *= 1.0f + nd(g);
    perts.back()->arena().params_from_host(p);
  }
  Net<float>* pert = perts[0].get();
  auto gpu = build_resnet<float>(cfg, make_cuda_lowp_backend(k.dtype));
  ASSERT_EQ(gpu->arena().size(), ref->arena().size());
  gpu->arena().params_from_host(ref->arena().params());  // the arena is device memory
  const auto input = random_input(ref->shape(0), 5);
  const auto labels = labels_for(cfg.batch, cfg.num_classes);

  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const double lr = ref->forward(input.data(), labels.data(), true);
    const double lg = gpu->forward(input.data(), labels.data(), true);
    double lp = 0;  // the perturbed loss furthest from the reference's
    for (auto& q : perts) {
      const double l = q->forward(input.data(), labels.data(), true);
      if (std::abs(l - lr) >= std::abs(lp - lr)) lp = l;
    }
    EXPECT_LE(std::abs(lg - lr), std::max(3e-2 * std::max(1.0, std::abs(lr)), 2 * std::abs(lp - lr)))
        << "loss " << lg << ", reference " << lr << ", furthest perturbed reference " << lp;

    size_t last_ready = 0;
    ref->backward();
    for (auto& q : perts) q->backward();
    gpu->backward([&](size_t n) { last_ready = n; }, 128.0);
    EXPECT_EQ(last_ready, gpu->arena().size());
    std::vector<float> gr(ref->arena().grads().begin(), ref->arena().grads().end());
    std::vector<float> gq(pert->arena().grads().begin(), pert->arena().grads().end());
    for (auto& v : gr) v *= 128.0f;  // the references ran without loss scaling
    for (auto& v : gq) v *= 128.0f;
    std::vector<float> gg(gr.size()), sg(ref->arena().state().size());
    gpu->arena().grads_to_host(gg);
    gpu->arena().state_to_host(sg);
    const Agreement own = agreement(gq, gr), got = agreement(gg, gr);
    EXPECT_LE(1 - got.cosine, 2 * (1 - own.cosine) + 1e-3)
        << "whole gradient: cosine " << got.cosine << ", the perturbed reference's " << own.cosine;
    // Per tensor, against the perturbed reference's error on that tensor (a single sample of it,
    // hence the wider factor and the floor).
    for (const ParamInfo& p : ref->arena().layout()) {
      auto part = [&](const std::vector<float>& v) {
        return std::span<const float>(v).subspan(p.offset, p.count);
      };
      const double a = agreement(part(gg), part(gr)).cosine, b = agreement(part(gq), part(gr)).cosine;
      EXPECT_LE(1 - a, std::max(5e-2, 8 * (1 - b))) << p.name << ": perturbed reference's cosine " << b;
    }
    const double st_own = agreement(pert->arena().state(), ref->arena().state()).normalised_max;
    EXPECT_LE(agreement(sg, ref->arena().state()).normalised_max, std::max(2e-2, 2 * st_own))
        << "BN running statistics";

    // All take the same plain SGD step on their gradients (the 16-bit one's scaled back).
    HostView<float> gp = gpu->arena().host_params();
    for (size_t i = 0; i < gr.size(); ++i) {
      ref->arena().params()[i] -= 0.01f * ref->arena().grads()[i];
      for (auto& q : perts) q->arena().params()[i] -= 0.01f * q->arena().grads()[i];
      gp[i] -= 0.01f * gg[i] / 128.0f;
    }
    gp.commit();
  }
  ref->forward(input.data(), nullptr, false);
  pert->forward(input.data(), nullptr, false);
  gpu->forward(input.data(), nullptr, false);
  const size_t nl = size_t(ref->shape(ref->logits()).numel());
  std::vector<float> zr(nl), zp(nl), zg(nl);
  ref->export_tensor(ref->logits(), zr.data());
  pert->export_tensor(pert->logits(), zp.data());
  gpu->export_tensor(gpu->logits(), zg.data());
  const Agreement ev = agreement(zg, zr), own = agreement(zp, zr);
  // The direction only: after two steps single logits of these small nets swing by more than
  // their size under the perturbation alone.
  EXPECT_LE(1 - ev.cosine, std::max(1e-2, 2 * (1 - own.cosine))) << "eval logits";
}

TEST_P(GpuLowpResNet, Resnet20MatchesReference) {
  RT_REQUIRE_GPU();
  expect_matches_reference(cifar_resnet20(), GetParam());
}

TEST_P(GpuLowpResNet, Resnet18MatchesReference) {
  RT_REQUIRE_GPU();
  expect_matches_reference(imagenet_resnet18(), GetParam());
}

TEST_P(GpuLowpResNet, ResNeXt50MatchesReference) {
  RT_REQUIRE_GPU();
  expect_matches_reference(imagenet_resnext50(), GetParam());
}

// ResNet-D in 16 bits: the deep stem (3x3 convolutions on the 3-channel input and 8-channel
// ones) and the average-pooled shortcuts on odd sides (72 pixels: layer3 9x9, layer4 5x5); and
// the ECA-ResNet-T on them: the channel convolution on (n, c, 1, 1) tensors (kernels 3 and 5 on
// 64 to 512 channels at this width) and the tiered stem.
TEST_P(GpuLowpResNet, ResNetDAndEcaResNetMatchReference) {
  RT_REQUIRE_GPU();
  ResNetConfig cfg = imagenet_resnext50();
  cfg.image_size = 72;
  for (const char* model : {"resnet26d", "ecaresnet26t"}) {
    SCOPED_TRACE(model);
    cfg.name = model;
    expect_matches_reference(cfg, GetParam());
  }
}

// Squeeze-and-excitation in ResNeXt bottlenecks: the gate and the 1x1 convolutions with bias
// on (n, c, 1, 1) tensors in 16 bits. These backends fuse a batch norm with the residual add
// that alone reads it: not the SE blocks' last batch norms, which the squeeze and the gate read.
TEST_P(GpuLowpResNet, SeResNeXt50MatchesReference) {
  RT_REQUIRE_GPU();
  ResNetConfig cfg = imagenet_resnext50();
  auto fused = [&](const std::string& model) {
    cfg.name = model;
    auto net = build_resnet<float>(cfg, make_cuda_lowp_backend(GetParam().dtype));
    int n = 0;
    for (size_t i = 0; i < net->num_nodes(); ++i) n += net->node(i).name.ends_with("+add");
    return n;
  };
  EXPECT_EQ(fused("resnext50_32x4d"), 16);
  EXPECT_EQ(fused("seresnext50_32x4d"), 0);
  expect_matches_reference(cfg, GetParam());
}

TEST_P(GpuLowpResNet, SteadyStateStepAllocatesNothing) {
  RT_REQUIRE_GPU();
  const ResNetConfig cfg = cifar_resnet20();
  auto net = build_resnet<float>(cfg, make_cuda_lowp_backend(GetParam().dtype));
  auto sgd = net->backend().make_sgd(net->arena().layout(), SgdConfig{});
  const auto input = random_input(net->shape(0), 6);
  const auto labels = labels_for(cfg.batch, cfg.num_classes);
  auto step = [&] {
    net->forward(input.data(), labels.data(), true);
    net->backward({}, 128.0);
    net->backend().scale_count_nonfinite(net->arena().grads().data(), net->arena().size(),
                                         1.0f / 128.0f, true);
    (void)net->backend().sum_squares(net->arena().grads().data(), net->arena().size());  // clipping's
    sgd->step(net->arena().params().data(), net->arena().grads().data(), 0.01);
    net->backend().sync();
  };
  step();  // the first step may size buffers (the import staging buffer, gradient slots)
  step();
  const AllocStats before = alloc_stats();
  for (int i = 0; i < 3; ++i) step();
  const AllocStats after = alloc_stats();
  EXPECT_EQ(after.device_allocs, before.device_allocs);
  EXPECT_EQ(after.device_frees, before.device_frees);
  EXPECT_EQ(after.pinned_allocs, before.pinned_allocs);
}

TEST_P(GpuLowpResNet, MakeBackendByName) {
  RT_REQUIRE_GPU();
  register_backend();
  auto b = make_backend<float>(GetParam().backend);
  EXPECT_EQ(b->name(), GetParam().backend);
  EXPECT_EQ(b->act_size({2, 3, 5, 7}), 108u);  // 210 16-bit values in 27 16-byte vectors
}

}  // namespace
}  // namespace rt::cuda

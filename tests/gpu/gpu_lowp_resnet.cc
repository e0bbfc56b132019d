// Whole small ResNets on the 16-bit backends (cuda-bf16, cuda-fp16; one suite for both) against the
// fp32 reference: two training steps' forward and backward with loss scaling, evaluation
// through the running statistics, the backend by name, and no device allocation in a
// steady-state step.
//
// Tolerances are loose and untested on hardware (no GPU where this was written): bf16
// activations carry 8 significant bits (fp16 11) through ~20 layers, so the comparison asks for
// the same function, not the same bits, with the bounds bf16 needs for both types: the loss
// within 3% and every parameter's gradient pointing the same way (cosine similarity >= 0.98 per
// tensor, >= 0.99 over the whole gradient) with a normalised max error (max |got - ref| /
// max |ref|) of at most 0.15 per tensor.
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>

#include "cuda/backend.h"
#include "cuda/lowp_backend.h"
#include "cuda/memory.h"
#include "gpu_test_util.h"
#include "nn/resnet.h"

namespace rt::cuda {
namespace {

// The storage type and its backend's name.
struct Kind {
  DType dtype;
  const char* backend;
};
// gtest names the parameter by its backend.
void PrintTo(const Kind& k, std::ostream* os) { *os << k.backend; }
class GpuLowpResNet : public ::testing::TestWithParam<Kind> {};
INSTANTIATE_TEST_SUITE_P(Types, GpuLowpResNet,
                         ::testing::Values(Kind{DType::bf16, "cuda-bf16"}, Kind{DType::f16, "cuda-fp16"}),
                         [](const ::testing::TestParamInfo<Kind>& i) {
                           return std::string(i.param.dtype == DType::bf16 ? "bf16" : "fp16");
                         });

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

void expect_matches_reference(const ResNetConfig& cfg, DType t) {
  SCOPED_TRACE(cfg.name);
  auto ref = build_resnet<float>(cfg, make_backend<float>("reference"));
  auto gpu = build_resnet<float>(cfg, make_cuda_lowp_backend(t));
  ASSERT_EQ(gpu->arena().size(), ref->arena().size());
  gpu->arena().params_from_host(ref->arena().params());  // the arena is device memory
  const auto input = random_input(ref->shape(0), 5);
  const auto labels = labels_for(cfg.batch, cfg.num_classes);

  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const double lr = ref->forward(input.data(), labels.data(), true);
    const double lg = gpu->forward(input.data(), labels.data(), true);
    EXPECT_NEAR(lg, lr, 3e-2 * std::max(1.0, std::abs(lr)));

    size_t last_ready = 0;
    ref->backward();
    gpu->backward([&](size_t n) { last_ready = n; }, 128.0);
    EXPECT_EQ(last_ready, gpu->arena().size());
    std::vector<float> gr(ref->arena().grads().begin(), ref->arena().grads().end());
    for (auto& v : gr) v *= 128.0f;  // the reference ran without loss scaling
    std::vector<float> gg(gr.size()), sg(ref->arena().state().size());
    gpu->arena().grads_to_host(gg);
    gpu->arena().state_to_host(sg);
    for (const ParamInfo& p : ref->arena().layout()) {
      const Agreement a = agreement(std::span<const float>(gg).subspan(p.offset, p.count),
                                    std::span<const float>(gr).subspan(p.offset, p.count));
      EXPECT_GE(a.cosine, 0.98) << p.name;
      EXPECT_LE(a.normalised_max, 0.15) << p.name;
    }
    EXPECT_GE(agreement(gg, gr).cosine, 0.99) << "whole gradient";
    const Agreement st = agreement(sg, ref->arena().state());
    EXPECT_LE(st.normalised_max, 2e-2) << "BN running statistics";

    // Both take the same plain SGD step on their gradients (the 16-bit one's scaled back).
    HostView<float> gp = gpu->arena().host_params();
    for (size_t i = 0; i < gr.size(); ++i) {
      ref->arena().params()[i] -= 0.01f * ref->arena().grads()[i];
      gp[i] -= 0.01f * gg[i] / 128.0f;
    }
    gp.commit();
  }
  ref->forward(input.data(), nullptr, false);
  gpu->forward(input.data(), nullptr, false);
  const size_t nl = size_t(ref->shape(ref->logits()).numel());
  std::vector<float> zr(nl), zg(nl);
  ref->export_tensor(ref->logits(), zr.data());
  gpu->export_tensor(gpu->logits(), zg.data());
  const Agreement ev = agreement(zg, zr);
  EXPECT_GE(ev.cosine, 0.99) << "eval logits";
  EXPECT_LE(ev.normalised_max, 0.1) << "eval logits";
}

TEST_P(GpuLowpResNet, Resnet20MatchesReference) {
  RT_REQUIRE_GPU();
  expect_matches_reference(cifar_resnet20(), GetParam().dtype);
}

TEST_P(GpuLowpResNet, Resnet18MatchesReference) {
  RT_REQUIRE_GPU();
  expect_matches_reference(imagenet_resnet18(), GetParam().dtype);
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

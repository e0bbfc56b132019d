// SGD on the flat arena: hand-computed momentum, Nesterov, weight decay and LARS steps; padding,
// precision, thread-count determinism and checkpoint restore.
#include "nn/optimizer.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nn/arena.h"
#include "nn/error.h"
#include "nn/ops.h"

namespace rt {
namespace {

constexpr double kTol = 1e-12;

// Parameter values of tensor `id`.
template <class T>
std::vector<T> values(Arena<T>& a, int id) {
  const T* p = a.param(id);
  return std::vector<T>(p, p + a.info(id).count);
}

template <class T>
void set(T* dst, std::initializer_list<T> v) {
  std::copy(v.begin(), v.end(), dst);
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], kTol) << "element " << i;
}

TEST(Sgd, MomentumMatchesHandComputedSteps) {
  Arena<double> a;
  int w = a.add_param("w", {2}, ParamKind::conv_weight);
  a.finalize();
  set(a.param(w), {1.0, -2.0});
  set(a.grad(w), {0.5, 1.0});
  SgdConfig cfg;
  cfg.weight_decay = 0;
  Sgd<double> opt(a.layout(), cfg);
  // buf = g = [.5, 1]; p -= .1·buf.
  opt.step(a.params().data(), a.grads().data(), 0.1);
  expect_near(values(a, w), {0.95, -2.1});
  // buf = .9·[.5, 1] + [.5, 1] = [.95, 1.9].
  opt.step(a.params().data(), a.grads().data(), 0.1);
  expect_near(values(a, w), {0.855, -2.29});
  // buf = .9·[.95, 1.9] + [.5, 1] = [1.355, 2.71].
  opt.step(a.params().data(), a.grads().data(), 0.1);
  expect_near(values(a, w), {0.7195, -2.561});
  EXPECT_EQ(opt.steps(), 3);
  EXPECT_NEAR(opt.momentum()[0], 1.355, kTol);
  EXPECT_NEAR(opt.momentum()[1], 2.71, kTol);
}

TEST(Sgd, NesterovMatchesHandComputedSteps) {
  Arena<double> a;
  int w = a.add_param("w", {2}, ParamKind::linear_weight);
  a.finalize();
  set(a.param(w), {1.0, -2.0});
  set(a.grad(w), {0.5, 1.0});
  SgdConfig cfg;
  cfg.weight_decay = 0;
  cfg.nesterov = true;
  Sgd<double> opt(a.layout(), cfg);
  // buf = g; d = g + .9·buf = 1.9·g = [.95, 1.9].
  opt.step(a.params().data(), a.grads().data(), 0.1);
  expect_near(values(a, w), {0.905, -2.19});
  // buf = .9·g + g = [.95, 1.9]; d = g + .9·buf = [1.355, 2.71].
  opt.step(a.params().data(), a.grads().data(), 0.1);
  expect_near(values(a, w), {0.7695, -2.461});
}

TEST(Sgd, WeightDecayPerKind) {
  for (bool decay_bn_and_bias : {true, false}) {
    Arena<double> a;
    int w = a.add_param("conv.weight", {1}, ParamKind::conv_weight);
    int b = a.add_param("fc.bias", {1}, ParamKind::bias);
    int g = a.add_param("bn.weight", {1}, ParamKind::bn_gamma);
    int be = a.add_param("bn.bias", {1}, ParamKind::bn_beta);
    a.finalize();
    for (int id : {w, b, g, be}) {
      a.param(id)[0] = 2.0;
      a.grad(id)[0] = 1.0;
    }
    SgdConfig cfg;
    cfg.weight_decay = 0.1;
    cfg.decay_bn_and_bias = decay_bn_and_bias;
    Sgd<double> opt(a.layout(), cfg);
    opt.step(a.params().data(), a.grads().data(), 0.1);
    opt.step(a.params().data(), a.grads().data(), 0.1);
    // Decayed: g = 1 + .1·2 = 1.2, p = 1.88; g = 1 + .1·1.88 = 1.188, buf = .9·1.2 + 1.188 =
    // 2.268, p = 1.88 − .2268 = 1.6532. Not decayed: p = 1.9, then buf = 1.9, p = 1.71.
    const double bn_bias_want = decay_bn_and_bias ? 1.6532 : 1.71;
    EXPECT_NEAR(a.param(w)[0], 1.6532, kTol);
    for (int id : {b, g, be}) EXPECT_NEAR(a.param(id)[0], bn_bias_want, kTol) << a.info(id).name;
  }
}

TEST(Sgd, LarsTrustRatioMatchesHandComputedSteps) {
  Arena<double> a;
  int w = a.add_param("conv.weight", {2}, ParamKind::conv_weight);
  int z = a.add_param("zero.weight", {2}, ParamKind::conv_weight);
  int g = a.add_param("bn.weight", {1}, ParamKind::bn_gamma);
  a.finalize();
  set(a.param(w), {3.0, 4.0});  // ‖w‖ = 5
  set(a.grad(w), {0.6, 0.8});   // ‖∇w‖ = 1
  set(a.param(z), {0.0, 0.0});  // ‖w‖ = 0: trust ratio 1
  set(a.grad(z), {1.0, 1.0});
  a.param(g)[0] = 1.0;
  a.grad(g)[0] = 0.5;
  SgdConfig cfg;
  cfg.lars = true;
  cfg.lars_trust = 0.03;
  cfg.lars_eps = 0;
  cfg.weight_decay = 0.1;
  cfg.decay_bn_and_bias = false;
  Sgd<double> opt(a.layout(), cfg);
  const size_t tw = 2, tz = 1, tg = 0;  // layout is in reverse registration order
  ASSERT_EQ(a.layout()[tw].name, "conv.weight");

  // s = .03·5 / (1 + .1·5) = .1; g = ([.6, .8] + .1·[3, 4])·.1 = [.09, .12]; p -= 1·g.
  opt.step(a.params().data(), a.grads().data(), 1.0);
  EXPECT_NEAR(opt.trust_ratios()[tw], 0.1, kTol);
  expect_near(values(a, w), {2.91, 3.88});
  // Zero weights: s = 1, g = [1, 1] + .1·0. BN γ: excluded from LARS and from decay: p = 1 − .5.
  EXPECT_EQ(opt.trust_ratios()[tz], 1.0);
  expect_near(values(a, z), {-1.0, -1.0});
  EXPECT_EQ(opt.trust_ratios()[tg], 1.0);
  EXPECT_NEAR(a.param(g)[0], 0.5, kTol);

  // w = .97·[3, 4], ‖w‖ = 4.85; s = .03·4.85 / (1 + .485) = 97/990;
  // g = ([.6, .8] + [.291, .388])·97/990 = [.0873, .1164];
  // buf = .9·[.09, .12] + g = [.1683, .2244]; p = [2.91, 3.88] − buf.
  opt.step(a.params().data(), a.grads().data(), 1.0);
  EXPECT_NEAR(opt.trust_ratios()[tw], 97.0 / 990.0, kTol);
  expect_near(values(a, w), {2.7417, 3.6556});
}

TEST(Sgd, LarsCanIncludeBnAndUsesEps) {
  Arena<double> a;
  int g = a.add_param("bn.weight", {1}, ParamKind::bn_gamma);
  a.finalize();
  a.param(g)[0] = 1.0;
  a.grad(g)[0] = 0.5;
  SgdConfig cfg;
  cfg.lars = true;
  cfg.lars_trust = 0.03;
  cfg.lars_exclude_bn_and_bias = false;
  cfg.decay_bn_and_bias = false;
  Sgd<double> opt(a.layout(), cfg);
  // s = .03·1 / (.5 + 0·1 + 1e-9) ≈ .06; g = .5·s = .03; p = 1 − .03.
  opt.step(a.params().data(), a.grads().data(), 1.0);
  EXPECT_NEAR(opt.trust_ratios()[0], 0.03 / (0.5 + 1e-9), 1e-15);
  EXPECT_NEAR(a.param(g)[0], 1.0 - 0.5 * 0.03 / (0.5 + 1e-9), kTol);
}

// A tensor with a zero gradient (no loss reaches it) but nonzero weights and weight decay takes
// the plain global lr, trust 1, as one with zero weights does: ratio·‖w‖ / (0 + wd·‖w‖ + eps)
// would be about trust / wd instead, scaling its decay-only step by a factor unrelated to it.
TEST(Sgd, LarsZeroGradientTakesThePlainRate) {
  Arena<double> a;
  int w = a.add_param("w", {2}, ParamKind::conv_weight);
  a.finalize();
  set(a.param(w), {3.0, 4.0});
  set(a.grad(w), {0.0, 0.0});
  SgdConfig cfg;
  cfg.lars = true;
  cfg.lars_trust = 0.02;
  cfg.weight_decay = 0.01;
  cfg.momentum = 0.9;
  Sgd<double> opt(a.layout(), cfg);
  // s = 1; g = (0 + .01·[3, 4])·1 = [.03, .04]; buf = g; p = [3, 4] − .5·g.
  opt.step(a.params().data(), a.grads().data(), 0.5);
  EXPECT_EQ(opt.trust_ratios()[0], 1.0);
  expect_near(values(a, w), {3.0 - 0.5 * 0.03, 4.0 - 0.5 * 0.04});
}

TEST(Sgd, ZeroLearningRateLeavesParametersButFillsMomentum) {
  Arena<double> a;
  int w = a.add_param("w", {1}, ParamKind::conv_weight);
  a.finalize();
  a.param(w)[0] = 1.0;
  a.grad(w)[0] = 2.0;
  SgdConfig cfg;
  cfg.weight_decay = 0;
  Sgd<double> opt(a.layout(), cfg);
  opt.step(a.params().data(), a.grads().data(), 0.0);
  EXPECT_EQ(a.param(w)[0], 1.0);
  EXPECT_EQ(opt.momentum()[0], 2.0);
}

// A small arena whose tensor sizes leave padding after each, and span several work chunks.
template <class T>
Arena<T> make_arena(uint32_t seed) {
  Arena<T> a;
  a.add_param("conv1.weight", {7, 3, 3, 3}, ParamKind::conv_weight);
  a.add_param("bn1.weight", {7}, ParamKind::bn_gamma);
  a.add_param("bn1.bias", {7}, ParamKind::bn_beta);
  a.add_param("conv2.weight", {33, 7, 5, 5}, ParamKind::conv_weight);  // > one chunk
  a.add_param("fc.weight", {10, 33}, ParamKind::linear_weight);
  a.add_param("fc.bias", {10}, ParamKind::bias);
  a.finalize();
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const ParamInfo& p : a.layout())
    for (size_t i = 0; i < p.count; ++i) {
      a.params()[p.offset + i] = T(nd(rng));
      a.grads()[p.offset + i] = T(0.1 * nd(rng));
    }
  return a;
}

SgdConfig busy_config() {
  SgdConfig cfg;
  cfg.nesterov = true;
  cfg.lars = true;
  cfg.lars_trust = 0.02;
  cfg.decay_bn_and_bias = false;
  return cfg;
}

template <class T>
std::vector<bool> padding_mask(const Arena<T>& a) {
  std::vector<bool> pad(a.size(), true);
  for (const ParamInfo& p : a.layout()) std::fill_n(pad.begin() + p.offset, p.count, false);
  return pad;
}

TEST(Sgd, PaddingStaysZero) {
  auto a = make_arena<float>(1);
  Sgd<float> opt(a.layout(), busy_config());
  ASSERT_EQ(opt.size(), a.size());
  const auto pad = padding_mask(a);
  ASSERT_GT(std::count(pad.begin(), pad.end(), true), 0);
  for (int s = 0; s < 5; ++s) opt.step(a.params().data(), a.grads().data(), 0.5);
  for (size_t i = 0; i < a.size(); ++i) {
    if (!pad[i]) continue;
    EXPECT_EQ(a.params()[i], 0.0f) << "param padding at " << i;
    EXPECT_EQ(opt.momentum()[i], 0.0f) << "momentum padding at " << i;
  }
}

// optimizer.freeze: frozen tensors (by name, or by a prefix ending before a '.') keep their
// values and a zero momentum through LARS, decay and Nesterov steps; every other tensor moves
// exactly as without the freeze (LARS's ratios are per tensor).
TEST(Sgd, FrozenTensorsAreLeftAlone) {
  auto freezing = [](std::string name) {
    SgdConfig c;
    c.freeze = {std::move(name)};
    return c;
  };
  EXPECT_TRUE(sgd_frozen(freezing("bn1"), "bn1.bias"));
  EXPECT_TRUE(sgd_frozen(freezing("fc.bias"), "fc.bias"));
  EXPECT_FALSE(sgd_frozen(freezing("bn"), "bn1.bias"));  // not at a '.'
  EXPECT_FALSE(sgd_frozen(freezing("fc.bias.x"), "fc.bias"));
  auto plain = make_arena<float>(6), frozen = make_arena<float>(6);
  SgdConfig cfg = busy_config();
  Sgd<float> a(plain.layout(), cfg);
  cfg.freeze = {"bn1", "conv2.weight"};
  Sgd<float> b(frozen.layout(), cfg);
  const std::vector<float> start(frozen.params().begin(), frozen.params().end());
  for (int s = 0; s < 3; ++s) {
    a.step(plain.params().data(), plain.grads().data(), 0.5);
    b.step(frozen.params().data(), frozen.grads().data(), 0.5);
  }
  for (const ParamInfo& p : frozen.layout()) {
    const bool f = p.name.rfind("bn1.", 0) == 0 || p.name == "conv2.weight";
    for (size_t i = p.offset; i < p.offset + p.count; ++i) {
      ASSERT_EQ(frozen.params()[i], f ? start[i] : plain.params()[i]) << p.name << " at " << i - p.offset;
      ASSERT_EQ(b.momentum()[i], f ? 0.0f : a.momentum()[i]) << p.name << " at " << i - p.offset;
    }
  }
}

TEST(Sgd, FloatAgreesWithDouble) {
  auto af = make_arena<float>(2);
  auto ad = make_arena<double>(2);
  Sgd<float> of(af.layout(), busy_config());
  Sgd<double> od(ad.layout(), busy_config());
  for (int s = 0; s < 10; ++s) {
    of.step(af.params().data(), af.grads().data(), 0.1);
    od.step(ad.params().data(), ad.grads().data(), 0.1);
  }
  // Offsets differ (padding is per cache line), so compare tensor by tensor.
  for (size_t t = 0; t < ad.layout().size(); ++t) {
    const ParamInfo &pf = af.layout()[t], &pd = ad.layout()[t];
    ASSERT_EQ(pf.count, pd.count);
    for (size_t i = 0; i < pd.count; ++i) {
      const double d = ad.params()[pd.offset + i];
      ASSERT_NEAR(af.params()[pf.offset + i], d, 1e-5 * (1 + std::abs(d)))
          << pd.name << "[" << i << "]";
    }
  }
  for (size_t t = 0; t < ad.layout().size(); ++t)
    EXPECT_NEAR(of.trust_ratios()[t], od.trust_ratios()[t], 1e-6 * od.trust_ratios()[t]);
}

TEST(Sgd, BitwiseIdenticalForAnyThreadCount) {
  const int saved = omp_get_max_threads();
  std::vector<float> ref;
  for (int threads : {1, 2, 3, 8}) {
    omp_set_num_threads(threads);
    auto a = make_arena<float>(3);
    Sgd<float> opt(a.layout(), busy_config());
    for (int s = 0; s < 4; ++s) opt.step(a.params().data(), a.grads().data(), 0.3);
    std::vector<float> got(a.params().begin(), a.params().end());
    if (ref.empty()) ref = got;
    else EXPECT_EQ(got, ref) << threads << " threads";
  }
  omp_set_num_threads(saved);
}

TEST(Sgd, RestoreResumesBitwise) {
  auto a = make_arena<float>(4);
  Sgd<float> opt(a.layout(), busy_config());
  for (int s = 0; s < 3; ++s) opt.step(a.params().data(), a.grads().data(), 0.2);
  std::vector<float> params(a.params().begin(), a.params().end());
  std::vector<float> mom(opt.momentum().begin(), opt.momentum().end());
  const int64_t steps = opt.steps();
  for (int s = 0; s < 2; ++s) opt.step(a.params().data(), a.grads().data(), 0.2);

  Sgd<float> resumed(a.layout(), busy_config());
  resumed.restore(mom, steps);
  EXPECT_EQ(resumed.steps(), 3);
  for (int s = 0; s < 2; ++s) resumed.step(params.data(), a.grads().data(), 0.2);
  EXPECT_EQ(params, std::vector<float>(a.params().begin(), a.params().end()));

  std::vector<float> short_buf(mom.size() - 1);
  EXPECT_THROW(resumed.restore(short_buf, 1), Error);
  EXPECT_THROW(resumed.restore(mom, -1), Error);
}

TEST(Sgd, RejectsBadConfigAndArguments) {
  auto a = make_arena<float>(5);
  auto make = [&](auto edit) {
    SgdConfig cfg;
    edit(cfg);
    return Sgd<float>(a.layout(), cfg);
  };
  EXPECT_THROW(make([](SgdConfig& c) { c.momentum = -0.1; }), Error);
  EXPECT_THROW(make([](SgdConfig& c) { c.weight_decay = -1e-4; }), Error);
  EXPECT_THROW(make([](SgdConfig& c) { c.lars_trust = -1; }), Error);
  EXPECT_THROW(make([](SgdConfig& c) {
                 c.nesterov = true;
                 c.momentum = 0;
               }),
               Error);
  try {
    make([](SgdConfig& c) { c.weight_decay = -1; });
    ADD_FAILURE() << "negative weight_decay accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_decay"), std::string::npos) << e.what();
  }

  auto layout = a.layout();
  std::swap(layout[0], layout[1]);
  EXPECT_THROW(Sgd<float>(layout, SgdConfig{}), Error);

  Sgd<float> opt(a.layout(), SgdConfig{});
  EXPECT_THROW(opt.step(a.params().data(), a.grads().data(), -0.1), Error);
  EXPECT_THROW(opt.step(a.params().data(), a.grads().data(), std::nan("")), Error);
  EXPECT_EQ(opt.steps(), 0);
}

// The weights' moving average (Backend::ema_update): avg moves the fraction w of the way to x,
// one fused multiply-add per element, the same on every CPU backend and thread count.
TEST(MovingAverage, FusedStepOnEveryCpuBackend) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const size_t n = (size_t(1) << 17) + 3;  // the threaded loop, and an odd tail
  std::vector<float> x(n), start(n);
  for (size_t i = 0; i < n; ++i) x[i] = d(rng), start[i] = d(rng);
  for (const char* name : {"reference", "onednn"}) {
    auto b = make_backend<float>(name);
    for (float w : {0.25f, 1e-4f, 0.9f}) {
      std::vector<float> avg = start;
      b->ema_update(avg.data(), x.data(), n, w);
      size_t differ = 0;
      for (size_t i = 0; i < n; ++i) differ += avg[i] != std::fma(w, x[i] - start[i], start[i]);
      EXPECT_EQ(differ, 0u) << name << " w " << w;
    }
  }
  std::vector<float> a = {1.0f, -2.0f, 8.0f}, y = {3.0f, 2.0f, 8.0f};
  make_backend<float>("onednn")->ema_update(a.data(), y.data(), 3, 0.25f);
  EXPECT_EQ(a, (std::vector<float>{1.5f, -1.0f, 8.0f}));
}

// train.clip_grad_norm's Σg² (Backend::sum_squares): the order nn/ops.h promises, written out
// here (chunks of 4096, 32 interleaved lanes, the butterfly, chunks in order), because the CUDA
// backend reproduces exactly it; the same bits for any thread count, on every CPU backend.
double squares_in_documented_order(const std::vector<float>& v) {
  double total = 0;
  for (size_t c = 0; c < v.size(); c += 4096) {
    double lane[32] = {};
    for (size_t i = c; i < std::min(v.size(), c + 4096); ++i) lane[(i - c) % 32] += double(v[i]) * double(v[i]);
    for (size_t off = 16; off > 0; off /= 2)
      for (size_t l = 0; l < off; ++l) lane[l] += lane[l + off];
    total += lane[0];
  }
  return total;
}

TEST(GradientNorm, SumOfSquaresInOneOrderOnEveryCpuBackend) {
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int saved = omp_get_max_threads();
  for (size_t n : {size_t(0), size_t(1), size_t(31), size_t(4096), size_t(4097), (size_t(1) << 18) + 77}) {
    std::vector<float> v(n);
    for (float& x : v) x = d(rng) * 1e3f;  // squares far apart in size: the order shows
    const double want = squares_in_documented_order(v);
    long double exact = 0;
    for (float x : v) exact += (long double)x * x;
    EXPECT_NEAR(want, double(exact), 1e-12 * double(exact)) << n;
    for (const char* name : {"reference", "onednn"})
      for (int threads : {1, 3}) {
        omp_set_num_threads(threads);
        const double got = make_backend<float>(name)->sum_squares(v.data(), n);
        EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
            << name << ", " << threads << " thread(s), n " << n << ": " << got << " vs " << want;
      }
  }
  omp_set_num_threads(saved);
  // A plain sum, chunk by chunk, is not that order: the test can tell them apart.
  std::vector<float> v((size_t(1) << 18) + 77);
  for (float& x : v) x = d(rng) * 1e3f;
  double plain = 0;
  for (float x : v) plain += double(x) * double(x);
  EXPECT_NE(plain, squares_in_documented_order(v));
  const float three[] = {3.0f, -4.0f, 12.0f};
  EXPECT_EQ(make_backend<float>("onednn")->sum_squares(three, 3), 169.0);
}

// The host update is compared bit for bit with the device's, whose multiplies and adds are rounded
// one by one (_rn intrinsics), so the library must not fuse them either (CMakeLists.txt:
// -ffp-contract=off). Here grad + wd * p is exactly a tie that rounds to 0 when wd * p is rounded
// first (wd * p = 1 + 2^-11 + 2^-24); fused, as GCC does by default under an -march with FMA, it
// is 2^-24, which the learning rate of 2^20 turns into a step of 16.
TEST(Sgd, StepRoundsEachOperationApart) {
  Arena<float> a;
  int w = a.add_param("w", {1}, ParamKind::conv_weight);
  a.finalize();
  const float p0 = 1 + 0x1p-12f;
  a.param(w)[0] = p0;
  a.grad(w)[0] = -(1 + 0x1p-11f);
  SgdConfig cfg;
  cfg.weight_decay = 1 + 0x1p-12;
  Sgd<float> opt(a.layout(), cfg);
  opt.step(a.params().data(), a.grads().data(), 0x1p20);
  EXPECT_EQ(a.param(w)[0], p0);
  EXPECT_EQ(opt.momentum()[0], 0.0f);
}

}  // namespace
}  // namespace rt

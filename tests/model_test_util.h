// What the model tests (SE, ResNet-D, ECA) share: models built on the reference backend, their
// tensors' shapes, and whole-network gradients against finite differences.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "nn/resnet.h"

namespace rt::test {

// A model of that name on the reference backend; layout_only: names and shapes alone.
template <class T = float>
std::unique_ptr<Net<T>> build_model(const std::string& name, bool layout_only, int64_t size = 64, double width = 1.0,
                                    int64_t classes = 1000, int64_t batch = 1, bool zero_init = false) {
  ResNetConfig c;
  c.name = name;
  c.num_classes = classes;
  c.image_size = size;
  c.batch = batch;
  c.width = width;
  c.zero_init_residual = zero_init;
  c.layout_only = layout_only;
  c.seed = 3;
  return build_resnet<T>(c, make_backend<T>("reference"));
}

// The shape of the parameter of that name; empty where there is none.
inline std::vector<int64_t> param_dims(const Net<float>& net, const std::string& name) {
  for (const ParamInfo& p : net.arena().registered())
    if (p.name == name) return p.dims;
  return {};
}

// An input batch for the network, standard normal values.
inline std::vector<double> normal_input(const Net<double>& net, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<double> x(size_t(net.shape(0).numel()));
  for (auto& v : x) v = nd(rng);
  return x;
}

// The gradient of a whole network in double against central differences of its loss, on chosen
// elements of chosen parameter tensors: checks the graph's wiring (which ops feed which, what
// reaches each parameter), not only each op.
// One forward and backward in training mode on x and labels y, then for each tensor `pick`
// chooses, the elements 0, count / per_tensor, ...: (loss(w + h) - loss(w - h)) / 2h against the
// analytic gradient, within 1e-5 of the larger of them (or of 1e-2). Returns how many it checked.
inline int expect_whole_net_gradient(Net<double>& net, const std::vector<double>& x, const std::vector<int32_t>& y,
                                     const std::function<bool(const ParamInfo&)>& pick, size_t per_tensor,
                                     double h) {
  net.forward(x.data(), y.data(), true);
  net.backward();
  auto& a = net.arena();
  const std::vector<double> grads(a.grads().begin(), a.grads().end());
  int checked = 0;
  for (int id = 0; id < int(a.registered().size()); ++id) {
    const ParamInfo& p = a.info(id);
    if (!pick(p)) continue;
    double* w = a.param(id);
    for (size_t i = 0; i < p.count; i += std::max<size_t>(1, p.count / per_tensor)) {
      const double saved = w[i];
      w[i] = saved + h;
      const double lp = net.forward(x.data(), y.data(), true);
      w[i] = saved - h;
      const double lm = net.forward(x.data(), y.data(), true);
      w[i] = saved;
      const double numeric = (lp - lm) / (2 * h), analytic = grads[p.offset + i];
      EXPECT_NEAR(analytic, numeric, 1e-5 * std::max({std::fabs(analytic), std::fabs(numeric), 1e-2}))
          << p.name << "[" << i << "]";
      ++checked;
    }
  }
  return checked;
}

}  // namespace rt::test

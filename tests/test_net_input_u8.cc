// Net::forward_u8 (8-bit NHWC pixels, normalized by Backend::act_import_u8) against forward() on
// the same pixels normalized as the loader's float output is: bitwise equal loss, logits and
// gradients on the reference (float and double) and oneDNN backends.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "nn/net.h"
#include "nn/resnet.h"

namespace rt {
namespace {

template <class T>
std::unique_ptr<Net<T>> small_net(const std::string& backend, const Shape& in) {
  auto net = std::make_unique<Net<T>>(make_backend<T>(backend), in);
  int x = net->conv(net->input(), "conv1", 8, 3, 1, 1);
  x = net->batchnorm(x, "bn1", true);
  x = net->conv(x, "conv2", 8, 3, 2, 1, true);
  x = net->relu(x, "relu2");
  x = net->global_avgpool(x, "pool");
  x = net->linear(x, "fc", 5);
  net->loss(x, {});
  net->finalize();
  init_resnet(*net, 3, false);
  return net;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
void check_backend(const std::string& backend) {
  SCOPED_TRACE(backend);
  const Shape in{3, 3, 9, 7};
  const size_t hw = size_t(in.h * in.w);
  std::mt19937 g(11);
  std::vector<uint8_t> px(size_t(in.numel()));
  for (uint8_t& b : px) b = uint8_t(g());
  px[0] = 0, px[1] = 255;
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  const NormParams p = norm_params(mean, std);
  // What the loader's float output holds for these pixels: NCHW, each value rounded once.
  std::vector<T> x(px.size());
  for (int64_t n = 0; n < in.n; ++n)
    for (size_t i = 0; i < hw; ++i)
      for (int c = 0; c < 3; ++c)
        x[(size_t(n) * 3 + size_t(c)) * hw + i] =
            T(std::fmaf(float(px[(size_t(n) * hw + i) * 3 + size_t(c)]), p.scale[c], p.shift[c]));
  const std::vector<int32_t> labels = {0, 4, 2};
  for (bool train : {true, false}) {
    auto a = small_net<T>(backend, in), b = small_net<T>(backend, in);
    const double la = a->forward(x.data(), labels.data(), train);
    const double lb = b->forward_u8(px.data(), p, labels.data(), train);
    EXPECT_EQ(std::memcmp(&la, &lb, sizeof la), 0) << "loss " << la << " vs " << lb << " (train " << train << ")";
    std::vector<T> za(size_t(a->shape(a->logits()).numel())), zb(za.size());
    a->export_tensor(a->logits(), za.data());
    b->export_tensor(b->logits(), zb.data());
    EXPECT_TRUE(same_bits(za, zb)) << "logits (train " << train << ")";
    if (!train) continue;
    a->backward();
    b->backward();
    const auto ga = a->arena().grads(), gb = b->arena().grads();
    EXPECT_TRUE(same_bits(std::vector<T>(ga.begin(), ga.end()), std::vector<T>(gb.begin(), gb.end())))
        << "gradients";
  }
  // The 8-bit import is the float import of the normalized values, in the backend's own layout.
  auto be = make_backend<T>(backend);
  std::vector<T> da(be->act_size(in)), db(da.size());
  be->act_import(x.data(), in, da.data());
  be->act_import_u8(px.data(), in, p, db.data());
  EXPECT_TRUE(same_bits(da, db)) << "act_import_u8";
  EXPECT_THROW(be->act_import_u8(px.data(), Shape{1, 4, 3, 3}, p, db.data()), Error);
}

TEST(net_input_u8, ForwardU8EqualsForwardOnTheNormalizedFloats) {
  check_backend<float>("reference");
  check_backend<double>("reference");
  check_backend<float>("onednn");
}

}  // namespace
}  // namespace rt

// Input normalization on the device against the CPU loader's fused p * scale + shift.
#include <cmath>
#include <random>

#include "cuda/check.h"
#include "cuda/kernels.h"
#include "tests/gpu/gpu_test_util.h"

namespace rt::cuda {
namespace {

using test::to_device;
using test::to_host;

TEST(GpuNormalize, U8NhwcToNchwAndNhwc) {
  RT_REQUIRE_GPU();
  const int64_t n = 3, h = 7, w = 5;
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  NormalizeParams p;  // fused as data/image.cc's make_augment_spec fuses them
  for (int c = 0; c < 3; ++c) p.scale[c] = 1.0f / (255.0f * std[c]), p.shift[c] = -mean[c] / std[c];
  std::vector<uint8_t> img(size_t(n * h * w * 3));
  std::mt19937 g(7);
  for (uint8_t& b : img) b = uint8_t(g());
  img[0] = 0, img[1] = 255;
  DeviceBuffer din = to_device(img), dout(img.size() * sizeof(float));
  for (bool nchw : {true, false}) {
    p.nchw = nchw;
    normalize_u8(Elem::f32, din.as<uint8_t>(), dout.get(), n, h, w, p, nullptr);
    const auto got = to_host<float>(dout, img.size());
    normalize_u8(Elem::bf16, din.as<uint8_t>(), dout.get(), n, h, w, p, nullptr);
    const auto got16 = to_host<bf16_t>(dout, img.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
          for (int c = 0; c < 3; ++c) {
            const uint8_t px = img[size_t(((i * h + y) * w + x) * 3 + c)];
            const float want = std::fma(float(px), p.scale[c], p.shift[c]);  // one rounding, as the kernel
            const size_t o = size_t(nchw ? ((i * 3 + c) * h + y) * w + x : ((i * h + y) * w + x) * 3 + c);
            ASSERT_EQ(got[o], want) << "nchw " << nchw << " at " << o;
            ASSERT_EQ(got16[o].bits, to_bf16(want).bits) << "bf16, nchw " << nchw << " at " << o;
          }
  }
}

}  // namespace
}  // namespace rt::cuda

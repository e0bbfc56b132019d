// Mixup and CutMix: the draw (Beta weights from two std::gamma_distribution draws over the
// counter-based Rng) and the in-place blend or box swap of each pair (i, n-1-i).
#include "data/mixup.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <type_traits>
#include <utility>

#include "data/rng.h"
#include "nn/error.h"

namespace rt::data {
namespace {

// Rng as a UniformRandomBitGenerator, for the standard library's distributions.
struct Bits {
  using result_type = uint64_t;
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type{0}; }
  result_type operator()() { return rng.next_u64(); }
  Rng rng;
};

double beta(double alpha, Bits& bits) {
  std::gamma_distribution<double> gamma(alpha, 1.0);
  const double x = gamma(bits), y = gamma(bits);
  // Both can underflow to 0 for a tiny alpha: the limit is then an even coin between 0 and 1.
  if (x + y == 0) return (bits() & 1) ? 1.0 : 0.0;
  return x / (x + y);
}

// In float, which vectorizes (a batch of 256 ImageNet crops in 8-bit pixels: ~100 ms per batch
// in double with lround, far less this way), the pixels rounded half up.
template <class E>
void blend(E* x, size_t n, size_t per, double mix) {
  const float m = float(mix), m1 = float(1 - mix);
  for (size_t i = 0, j = n - 1; i < j; ++i, --j) {
    E* __restrict a = x + i * per;  // two different images
    E* __restrict b = x + j * per;
    for (size_t k = 0; k < per; ++k) {
      const float va = float(a[k]), vb = float(b[k]);
      if constexpr (std::is_floating_point_v<E>) {
        a[k] = m * va + m1 * vb;
        b[k] = m * vb + m1 * va;
      } else {  // a convex blend of two bytes stays in [0, 255]
        a[k] = E(m * va + m1 * vb + 0.5f);
        b[k] = E(m * vb + m1 * va + 0.5f);
      }
    }
  }  // an odd batch's middle image is its own partner: unchanged
}

// Swaps the box between each pair: rows of `run` contiguous elements, `rows` per image, each
// `stride` apart, the first at `first` (the layouts differ: planes of NCHW floats, NHWC bytes).
template <class E>
void swap_box(E* x, size_t n, size_t per, size_t first, size_t rows, size_t stride, size_t run) {
  for (size_t i = 0, j = n - 1; i < j; ++i, --j)
    for (size_t r = 0; r < rows; ++r) {
      E* a = x + i * per + first + r * stride;
      std::swap_ranges(a, a + run, x + j * per + first + r * stride);
    }
}

}  // namespace

MixDraw draw_mix(double mixup_alpha, double cutmix_alpha, int64_t image_size, uint64_t seed, int64_t step,
                 int64_t pass, int rank) {
  if (!(mixup_alpha >= 0 && cutmix_alpha >= 0 && mixup_alpha + cutmix_alpha > 0))
    throw Error(str_cat("mixup: alphas must be >= 0, one of them > 0; got mixup ", mixup_alpha, ", cutmix ",
                        cutmix_alpha));
  Bits bits{Rng(hash_key(hash_key(seed, uint64_t(Stream::mixup)), uint64_t(step), uint64_t(pass), uint64_t(rank)))};
  MixDraw d;
  d.cutmix = mixup_alpha == 0 || (cutmix_alpha > 0 && (bits() & 1));
  const double lam = beta(d.cutmix ? cutmix_alpha : mixup_alpha, bits);
  if (!d.cutmix) {
    d.mix = lam;
    return d;
  }
  const int64_t s = image_size, side = int64_t(double(s) * std::sqrt(1 - lam));
  auto span = [&](int64_t centre, int64_t& lo, int64_t& len) {  // `side` pixels about centre, clipped
    lo = std::clamp<int64_t>(centre - side / 2, 0, s);
    len = std::clamp<int64_t>(centre - side / 2 + side, 0, s) - lo;
  };
  const int64_t cy = bits.rng.range(0, s), cx = bits.rng.range(0, s);
  span(cy, d.top, d.height);
  span(cx, d.left, d.width);
  d.mix = 1 - double(d.height * d.width) / double(s * s);
  return d;
}

void mix_batch(Batch& b, const MixDraw& d, int64_t image_size) {
  if (!(d.mix >= 0 && d.mix <= 1)) throw Error(str_cat("mixup: weight ", d.mix, " is outside [0, 1]"));
  if (!b.mixed.empty()) throw Error("mixup: the batch is already mixed");
  const size_t n = size_t(b.n), s = size_t(image_size);
  if (n == 0) return;
  if (b.labels.size() != n)
    throw Error(str_cat("mixup: a batch of ", n, " images has ", b.labels.size(), " labels"));
  for (size_t size : {b.images.size(), b.pixels.size()})
    if (size != 0 && size != n * 3 * s * s)
      throw Error(str_cat("mixup: a batch of ", n, " images of ", s, "x", s, " has ", size, " values"));
  if (!d.cutmix) {
    if (!b.images.empty()) blend(b.images.data(), n, 3 * s * s, d.mix);
    if (!b.pixels.empty()) blend(b.pixels.data(), n, 3 * s * s, d.mix);
  } else {
    if (d.top < 0 || d.left < 0 || d.height < 0 || d.width < 0 || d.top + d.height > image_size ||
        d.left + d.width > image_size)
      throw Error(str_cat("cutmix: box ", d.height, "x", d.width, " at (", d.top, ", ", d.left,
                          ") is outside the ", s, "x", s, " image"));
    const size_t top = size_t(d.top), left = size_t(d.left), h = size_t(d.height), w = size_t(d.width);
    if (!b.images.empty())  // NCHW: each channel's plane, a run of w per row
      for (size_t c = 0; c < 3; ++c)
        swap_box(b.images.data(), n, 3 * s * s, c * s * s + top * s + left, h, s, w);
    if (!b.pixels.empty())  // NHWC: a run of 3 w per row
      swap_box(b.pixels.data(), n, 3 * s * s, (top * s + left) * 3, h, 3 * s, 3 * w);
  }
  b.mixed.assign(b.labels.rbegin(), b.labels.rend());
  b.mix = d.mix;
}

}  // namespace rt::data

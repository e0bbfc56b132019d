// Mixup: the Beta draw (two std::gamma_distribution draws over the counter-based Rng) and the
// in-place blend of each pair (i, n-1-i).
#include "data/mixup.h"

#include <cmath>
#include <random>
#include <type_traits>

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

}  // namespace

double mixup_weight(double alpha, uint64_t seed, int64_t step, int64_t pass, int rank) {
  if (!(alpha > 0)) throw Error(str_cat("mixup: alpha must be > 0, got ", alpha));
  Bits bits{Rng(hash_key(hash_key(seed, uint64_t(Stream::mixup)), uint64_t(step), uint64_t(pass), uint64_t(rank)))};
  std::gamma_distribution<double> gamma(alpha, 1.0);
  const double x = gamma(bits), y = gamma(bits);
  // Both can underflow to 0 for a tiny alpha: the limit is then an even coin between 0 and 1.
  if (x + y == 0) return (bits() & 1) ? 1.0 : 0.0;
  return x / (x + y);
}

void mixup(Batch& b, double mix) {
  if (!(mix >= 0 && mix <= 1)) throw Error(str_cat("mixup: weight ", mix, " is outside [0, 1]"));
  if (!b.mixed.empty()) throw Error("mixup: the batch is already mixed");
  const size_t n = size_t(b.n);
  if (n == 0) return;
  if (b.labels.size() != n)
    throw Error(str_cat("mixup: a batch of ", n, " images has ", b.labels.size(), " labels"));
  if (!b.images.empty()) blend(b.images.data(), n, b.images.size() / n, mix);
  if (!b.pixels.empty()) blend(b.pixels.data(), n, b.pixels.size() / n, mix);
  b.mixed.assign(b.labels.rbegin(), b.labels.rend());
  b.mix = mix;
}

}  // namespace rt::data

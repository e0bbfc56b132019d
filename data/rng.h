// Counter-based randomness for the input pipeline: every draw is a pure function of
// (seed, epoch, sample index, purpose), never of thread scheduling, so runs reproduce exactly and a
// resumed run sees the same permutation and the same augmentations as an uninterrupted one.
#pragma once

#include <cmath>
#include <cstdint>

#include "nn/hash.h"

namespace rt::data {

using rt::hash_key;
using rt::mix64;

// What a draw is for: separate streams so e.g. adding a flip never changes the crop. drop_path:
// the network's own draws in training (stochastic depth's masks; Net::set_noise_key).
enum class Stream : uint64_t {
  permutation = 1, augment = 2, synthetic_image = 3, synthetic_label = 4, mixup = 5, drop_path = 6
};

// A small sequential generator (splitmix64) seeded from a key; cheap to create per sample.
class Rng {
 public:
  explicit Rng(uint64_t key) : state_(key) {}
  Rng(uint64_t seed, int64_t epoch, int64_t index, Stream s)
      : state_(hash_key(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index),
                        static_cast<uint64_t>(s))) {}

  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n) (Lemire's multiply-shift; the bias is below 2^-64 * n).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
  }
  // Uniform integer in [lo, hi) (hi > lo), like Python's randint(lo, hi - 1).
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo)));
  }

 private:
  uint64_t state_;
};

}  // namespace rt::data

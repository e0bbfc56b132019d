// Counter-based randomness's building block: a draw is a hash of what it is for (seed, step,
// sample, ...), never a generator's state, so that runs and resumed runs draw the same.
#pragma once
#include <cstdint>

namespace rt {

// splitmix64's finalizer: a bijective 64-bit mix with full avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hashes a tuple of words into one key; chaining mix64 keeps (a, b) and (b, a) apart.
inline uint64_t hash_key(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0) {
  return mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d);
}

// A uniform double in [0, 1) from a hash's top 53 bits.
inline double unit_double(uint64_t h) { return double(h >> 11) * 0x1.0p-53; }

}  // namespace rt

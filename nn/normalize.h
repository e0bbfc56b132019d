// Input normalization of 8-bit RGB pixels, fused per channel: out = p * scale[c] + shift[c]
// (scale = 1 / (255 std), shift = -mean / std). One definition for the loader's float output and
// the backends' 8-bit import, so the two paths give the same floats bit for bit.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace rt {

struct NormParams {
  float scale[3] = {1, 1, 1};  // RGB
  float shift[3] = {0, 0, 0};
};

// The fused constants for a per-channel mean and std of pixels scaled to [0, 1].
NormParams norm_params(const float mean[3], const float std[3]);

// One normalized value, rounded once (fused multiply-add). A single rounding is what OpenCV's
// convertTo gave on FMA3 CPUs, which the loader used before; std::fmaf rounds once on every CPU,
// so the result no longer depends on which SIMD path a machine takes.
inline float norm_value(uint8_t p, float scale, float shift) {
  return std::fmaf(static_cast<float>(p), scale, shift);
}

// The 256 values of each channel: a lookup per byte is both exact and cheaper than an FMA call on
// CPUs where std::fmaf is a library routine.
struct NormTable {
  float v[3][256];
};
NormTable norm_table(const NormParams& p);

// n images of h x w x 3 bytes (NHWC, RGB) to normalized values in NCHW (T = float or double:
// the float value, widened exactly).
template <class T>
void normalize_u8_nchw(const uint8_t* nhwc, int64_t n, int64_t h, int64_t w, const NormTable& t,
                       T* nchw) {
  const size_t hw = static_cast<size_t>(h * w);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = nhwc + static_cast<size_t>(i) * hw * 3;
    T* r = nchw + static_cast<size_t>(i) * hw * 3;
    T* g = r + hw;
    T* b = g + hw;
    for (size_t k = 0; k < hw; ++k) {
      r[k] = t.v[0][src[3 * k]];
      g[k] = t.v[1][src[3 * k + 1]];
      b[k] = t.v[2][src[3 * k + 2]];
    }
  }
}

}  // namespace rt

// The pixel ops of data/autoaugment.h, in torchvision's tensor arithmetic (torchvision/transforms/
// functional_tensor.py): float32 products and sums each rounded on their own (this file is built
// with -ffp-contract=off, so no fused multiply-add changes a byte), truncation where torchvision
// casts a float tensor to uint8, round-half-even where it rounds. OpenCV's warpAffine and
// equalizeHist are not used: their nearest-neighbour rounding and histogram mapping differ.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "data/autoaugment.h"

namespace rt::data {
namespace {

constexpr double kPi = 3.14159265358979323846;
double radians(double deg) { return deg * kPi / 180.0; }

uint8_t to_u8(float v) { return static_cast<uint8_t>(std::clamp(v, 0.0f, 255.0f)); }  // truncates

// A float32 constant times every byte value: the very products the per-pixel multiply gives,
// looked up instead (the ops below are table lookups and float adds in torchvision's order).
struct Times {
  float v[256];
  explicit Times(float k) {
    for (int i = 0; i < 256; ++i) v[i] = k * static_cast<float>(i);
  }
  float operator[](uint8_t i) const { return v[i]; }
};

// Round half to even for |v| < 2^22, as nearbyint in the default rounding mode: adding 1.5 * 2^23
// leaves no fraction bits. Without SSE4.1 (the default x86-64 target) nearbyint is a library call.
float round_even(float v) {
  constexpr float big = 12582912.0f;
  return (v + big) - big;
}

template <class F>
void for_each_pixel(const Image8& img, F&& f) {
  for (int y = 0; y < img.height; ++y) {
    uint8_t* p = img.px + static_cast<size_t>(y) * img.stride;
    for (int x = 0; x < img.width; ++x, p += 3) f(p, x, y);
  }
}

// rgb_to_grayscale: (0.2989 r + 0.587 g + 0.114 b) in float32, truncated.
struct Gray {
  Times r{0.2989f}, g{0.587f}, b{0.114f};
  int red;
  explicit Gray(int red_) : red(red_) {}
  uint8_t operator()(const uint8_t* p) const { return to_u8(r[p[red]] + g[p[1]] + b[p[2 - red]]); }
};

// A per-channel table applied to every pixel (the enhancements with a constant, posterize,
// solarize, invert, autocontrast, equalize).
void apply_luts(const Image8& img, const uint8_t (*lut)[256]) {
  for_each_pixel(img, [&](uint8_t* p, int, int) { p[0] = lut[0][p[0]], p[1] = lut[1][p[1]], p[2] = lut[2][p[2]]; });
}

// _blend(img, other, ratio) where other is a constant: ratio * x + (1 - ratio) * other.
void blend_constant(const Image8& img, double ratio, float other) {
  const float r = static_cast<float>(ratio), o = static_cast<float>(1.0 - ratio) * other;
  uint8_t lut[3][256];
  for (int v = 0; v < 256; ++v) lut[0][v] = lut[1][v] = lut[2][v] = to_u8(r * static_cast<float>(v) + o);
  apply_luts(img, lut);
}

void saturation(const Image8& img, double factor) {
  const Times r(static_cast<float>(factor)), q(static_cast<float>(1.0 - factor));
  const Gray gray(img.red);
  for_each_pixel(img, [&](uint8_t* p, int, int) {
    const float o = q[gray(p)];
    p[0] = to_u8(r[p[0]] + o), p[1] = to_u8(r[p[1]] + o), p[2] = to_u8(r[p[2]] + o);
  });
}

void contrast(const Image8& img, double factor) {
  int64_t sum = 0;  // exact, as torch's float32 mean is for sums below 2^24
  const Gray gray(img.red);
  for_each_pixel(img, [&](uint8_t* p, int, int) { sum += gray(p); });
  const float mean = static_cast<float>(sum) / static_cast<float>(int64_t{img.width} * img.height);
  blend_constant(img, factor, mean);
}

// _blurred_degenerate_image: a 3x3 smoothing (weights 1/13, centre 5/13) of the interior, rounded
// half to even, the border its own pixels; then the blend, which touches the border too (a factor
// r blends x with itself as r x + (1 - r) x in float32, which can truncate to x - 1).
void sharpness(const Image8& img, double factor, std::vector<uint8_t>& scratch) {
  const int w = img.width, h = img.height;
  if (w <= 2 || h <= 2) return;
  const size_t row = static_cast<size_t>(w) * 3;
  scratch.resize(row * static_cast<size_t>(h));
  for (int y = 0; y < h; ++y) std::memcpy(&scratch[y * row], img.px + y * img.stride, row);
  const Times k(1.0f / 13.0f), kc(5.0f / 13.0f);
  const Times r(static_cast<float>(factor)), q(static_cast<float>(1.0 - factor));
  const auto blend = [&](uint8_t& out, float blurred) { out = to_u8(r[out] + q.v[static_cast<int>(blurred)]); };
  for (int y = 0; y < h; ++y) {
    uint8_t* out = img.px + static_cast<size_t>(y) * img.stride;
    if (y == 0 || y == h - 1) {
      for (size_t i = 0; i < row; ++i) blend(out[i], out[i]);
      continue;
    }
    const uint8_t* u = &scratch[(y - 1) * row];
    const uint8_t* m = u + row;
    const uint8_t* d = m + row;
    for (size_t i = 0; i < 3; ++i) blend(out[i], out[i]), blend(out[row - 3 + i], out[row - 3 + i]);
    for (size_t i = 3; i < row - 3; ++i) {
      // The 3x3 window summed row by row, left to right, from 0 (0 + x is x exactly).
      const float acc = k[u[i - 3]] + k[u[i]] + k[u[i + 3]] + k[m[i - 3]] + kc[m[i]] + k[m[i + 3]] +
                        k[d[i - 3]] + k[d[i]] + k[d[i + 3]];
      blend(out[i], round_even(std::clamp(acc, 0.0f, 255.0f)));
    }
  }
}

void posterize(const Image8& img, int bits) {
  const int keep = bits <= 0 ? 0 : bits >= 8 ? 0xff : (0xff << (8 - bits)) & 0xff;
  uint8_t lut[3][256];
  for (int v = 0; v < 256; ++v) lut[0][v] = lut[1][v] = lut[2][v] = static_cast<uint8_t>(v & keep);
  apply_luts(img, lut);
}

void solarize(const Image8& img, double threshold) {
  const float t = static_cast<float>(threshold);
  uint8_t lut[3][256];
  for (int v = 0; v < 256; ++v)
    lut[0][v] = lut[1][v] = lut[2][v] = static_cast<float>(v) >= t ? static_cast<uint8_t>(255 - v) : v;
  apply_luts(img, lut);
}

void invert(const Image8& img) { solarize(img, 0.0); }

// Each channel stretched to [0, 255]: (x - min) * (255 / (max - min)) in float32, truncated; a
// flat channel is left as it is.
void autocontrast(const Image8& img) {
  uint8_t lo[3] = {255, 255, 255}, hi[3] = {0, 0, 0};
  for_each_pixel(img, [&](uint8_t* p, int, int) {
    lo[0] = std::min(lo[0], p[0]), lo[1] = std::min(lo[1], p[1]), lo[2] = std::min(lo[2], p[2]);
    hi[0] = std::max(hi[0], p[0]), hi[1] = std::max(hi[1], p[1]), hi[2] = std::max(hi[2], p[2]);
  });
  uint8_t lut[3][256];
  for (int c = 0; c < 3; ++c) {
    const bool flat = lo[c] == hi[c];
    const float mn = flat ? 0.0f : lo[c];
    const float scale = flat ? 1.0f : 255.0f / (static_cast<float>(hi[c]) - mn);
    for (int v = 0; v < 256; ++v) lut[c][v] = to_u8((static_cast<float>(v) - mn) * scale);
  }
  apply_luts(img, lut);
}

// torchvision's _scale_channel (PIL's ImageOps.equalize): step = (count of all pixels but those of
// the highest value present) / 255, floored; value v maps to (pixels below v + step / 2) / step.
void equalize(const Image8& img) {
  int64_t hist[3][256] = {};
  for_each_pixel(img, [&](uint8_t* p, int, int) { ++hist[0][p[0]], ++hist[1][p[1]], ++hist[2][p[2]]; });
  uint8_t lut[3][256];
  for (int c = 0; c < 3; ++c) {
    int64_t total = 0, last = 0;
    for (int v = 0; v < 256; ++v)
      if (hist[c][v]) total += hist[c][v], last = hist[c][v];
    const int64_t step = (total - last) / 255;
    int64_t below = 0;
    for (int v = 0; v < 256; ++v) {
      lut[c][v] = step == 0 ? static_cast<uint8_t>(v)
                            : static_cast<uint8_t>(std::min<int64_t>((below + step / 2) / step, 255));
      below += hist[c][v];
    }
  }
  apply_luts(img, lut);
}

// F.affine / F.rotate on a tensor: the inverse matrix (_get_inverse_affine_matrix, in double),
// then as F_t.affine: a float32 theta, the output pixel centres relative to the image centre,
// grid_sample's unnormalization ((g + 1) * size - 1) / 2 and nearest rounding half to even; a
// source outside the image gives 0 (fill None).
void warp(const Image8& img, double angle_deg, double tx, double ty, double shear_x_deg,
          double shear_y_deg, bool top_left_centre, std::vector<uint8_t>& scratch) {
  const int w = img.width, h = img.height;
  const double rot = radians(angle_deg), sx = radians(shear_x_deg), sy = radians(shear_y_deg);
  const double cx = top_left_centre ? -0.5 * w : 0.0, cy = top_left_centre ? -0.5 * h : 0.0;
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  double m[6] = {d, -b, 0.0, -c, a, 0.0};
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
  float t[6];
  for (int i = 0; i < 6; ++i) t[i] = static_cast<float>(m[i]);
  const float hw = 0.5f * static_cast<float>(w), hh = 0.5f * static_cast<float>(h);
  const float gx[3] = {t[0] / hw, t[1] / hw, t[2] / hw}, gy[3] = {t[3] / hh, t[4] / hh, t[5] / hh};

  const size_t row = static_cast<size_t>(w) * 3;
  scratch.resize(row * static_cast<size_t>(h));
  for (int y = 0; y < h; ++y) std::memcpy(&scratch[y * row], img.px + y * img.stride, row);
  const float fw = static_cast<float>(w), fh = static_cast<float>(h);
  for (int y = 0; y < h; ++y) {
    uint8_t* p = img.px + static_cast<size_t>(y) * img.stride;
    const float by = -0.5f * fh + 0.5f + static_cast<float>(y);
    const float byx = by * gx[1], byy = by * gy[1];
    for (int x = 0; x < w; ++x, p += 3) {
      const float bx = -0.5f * fw + 0.5f + static_cast<float>(x);
      const float ux = bx * gx[0] + byx + gx[2];
      const float uy = bx * gy[0] + byy + gy[2];
      // Clamped to [-1, size] first: whatever lies beyond is outside either way.
      const int ix = static_cast<int>(round_even(std::clamp(((ux + 1.0f) * fw - 1.0f) / 2.0f, -1.0f, fw)));
      const int iy = static_cast<int>(round_even(std::clamp(((uy + 1.0f) * fh - 1.0f) / 2.0f, -1.0f, fh)));
      if (static_cast<unsigned>(ix) < static_cast<unsigned>(w) && static_cast<unsigned>(iy) < static_cast<unsigned>(h)) {
        const uint8_t* s = &scratch[static_cast<size_t>(iy) * row + static_cast<size_t>(ix) * 3];
        p[0] = s[0], p[1] = s[1], p[2] = s[2];
      } else {
        p[0] = p[1] = p[2] = 0;
      }
    }
  }
}

double degrees_of_tangent(double t) { return std::atan(t) * 180.0 / kPi; }

}  // namespace

void apply_aug_step(const AugStep& step, const Image8& img, std::vector<uint8_t>& scratch) {
  const double m = step.magnitude;
  switch (step.op) {
    case AugOp::identity: return;
    // Shears about the top-left corner (torchvision passes center=[0, 0]); the rest about the centre.
    case AugOp::shear_x: return warp(img, 0, 0, 0, degrees_of_tangent(m), 0, true, scratch);
    case AugOp::shear_y: return warp(img, 0, 0, 0, 0, degrees_of_tangent(m), true, scratch);
    case AugOp::translate_x: return warp(img, 0, static_cast<int>(m), 0, 0, 0, false, scratch);
    case AugOp::translate_y: return warp(img, 0, 0, static_cast<int>(m), 0, 0, false, scratch);
    case AugOp::rotate: return warp(img, -m, 0, 0, 0, 0, false, scratch);  // F.rotate negates
    case AugOp::brightness: return blend_constant(img, 1.0 + m, 0.0f);
    case AugOp::color: return saturation(img, 1.0 + m);
    case AugOp::contrast: return contrast(img, 1.0 + m);
    case AugOp::sharpness: return sharpness(img, 1.0 + m, scratch);
    case AugOp::posterize: return posterize(img, static_cast<int>(m));
    case AugOp::solarize: return solarize(img, m);
    case AugOp::autocontrast: return autocontrast(img);
    case AugOp::equalize: return equalize(img);
    case AugOp::invert: return invert(img);
  }
}

}  // namespace rt::data

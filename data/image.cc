// The decoder-free half of data/image.h: header dims, JPEG completeness, crop geometry. The
// decode itself is in image_decode.cc (OpenCV) or image_decode_none.cc (builds without it).
#include "data/image.h"

#include <algorithm>
#include <cmath>

namespace rt::data {

namespace {
uint32_t be16(const uint8_t* p) { return (uint32_t{p[0]} << 8) | p[1]; }
uint32_t be32(const uint8_t* p) { return (be16(p) << 16) | be16(p + 2); }

// Where the next marker starts at or after p, as libjpeg's next_marker finds it: stray bytes
// before it (which libjpeg only warns about) and 0xff fill bytes are passed over; 0xff 0x00 is no
// marker. len when there is none.
size_t next_marker(const uint8_t* d, size_t len, size_t p) {
  for (; p + 1 < len; ++p)
    if (d[p] == 0xff && d[p + 1] != 0xff && d[p + 1] != 0x00) return p;
  return len;
}
}  // namespace

bool image_dims(const uint8_t* d, size_t len, int* width, int* height, bool* is_jpeg) {
  *is_jpeg = false;
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (len >= 24 && std::equal(kPng, kPng + 8, d) && std::equal(d + 12, d + 16, "IHDR")) {
    *width = static_cast<int>(be32(d + 16));
    *height = static_cast<int>(be32(d + 20));
    return *width > 0 && *height > 0;
  }
  if (len < 4 || d[0] != 0xff || d[1] != 0xd8) return false;
  // Walk the marker segments up to the first start-of-frame (SOF0..SOF15 except DHT, JPG, DAC).
  size_t p = 2;
  while ((p = next_marker(d, len, p)) + 4 <= len) {
    const uint8_t m = d[p + 1];
    if (m == 0xd8 || (m >= 0xd0 && m <= 0xd7) || m == 0x01) { p += 2; continue; }  // no length
    const size_t seg = be16(d + p + 2);
    if (m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc) {
      if (p + 9 > len || seg < 7) return false;
      *height = static_cast<int>(be16(d + p + 5));
      *width = static_cast<int>(be16(d + p + 7));
      *is_jpeg = true;
      return *width > 0 && *height > 0;
    }
    if (m == 0xda || m == 0xd9 || seg < 2) return false;  // scan data before any frame header
    p += 2 + seg;
  }
  return false;
}

bool jpeg_complete(const uint8_t* d, size_t len) {
  // libjpeg pads a truncated scan with grey and only warns; a complete file has an EOI marker
  // after its first scan header (inside entropy-coded data 0xff is always followed by 0x00 or a
  // restart marker, so 0xff 0xd9 there is the real EOI; searching backwards finds it at once).
  size_t p = 2;
  while ((p = next_marker(d, len, p)) + 4 <= len) {
    const uint8_t m = d[p + 1];
    if (m == 0xd8 || (m >= 0xd0 && m <= 0xd7) || m == 0x01) { p += 2; continue; }
    if (m == 0xd9) return false;
    const size_t seg = be16(d + p + 2);
    if (seg < 2) return false;
    p += 2 + seg;
    if (m == 0xda) break;
  }
  for (size_t q = len; q >= p + 2; --q)
    if (d[q - 2] == 0xff && d[q - 1] == 0xd9) return true;
  return false;
}

std::string header_problem(const uint8_t* data, size_t len, int* width, int* height, bool* is_jpeg) {
  if (!image_dims(data, len, width, height, is_jpeg)) return "not a JPEG or PNG image this build can decode";
  if (int64_t{*width} * *height > kMaxImagePixels)
    return "a " + std::to_string(*width) + " x " + std::to_string(*height) + " image, more than the " +
           std::to_string(kMaxImagePixels) + " pixels this build decodes";
  if (*is_jpeg && !jpeg_complete(data, len)) return "a JPEG cut short (no end-of-image marker)";
  return "";
}

Box random_resized_crop(int width, int height, float min_scale, float max_scale, Rng& rng, double min_ratio,
                        double max_ratio) {
  const double area = double(width) * height;
  const double log_lo = std::log(min_ratio), log_hi = std::log(max_ratio);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.uniform(min_scale, max_scale);
    const double ratio = std::exp(rng.uniform(log_lo, log_hi));
    const int w = static_cast<int>(std::lround(std::sqrt(target * ratio)));
    const int h = static_cast<int>(std::lround(std::sqrt(target / ratio)));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      const int y = static_cast<int>(rng.range(0, height - h + 1));
      const int x = static_cast<int>(rng.range(0, width - w + 1));
      return {x, y, w, h};
    }
  }
  // Fallback: the whole image, clamped to the ratio range, centred.
  const double in_ratio = double(width) / height;
  int w = width, h = height;
  if (in_ratio < min_ratio) {
    h = static_cast<int>(std::lround(w / min_ratio));
  } else if (in_ratio > max_ratio) {
    w = static_cast<int>(std::lround(h * max_ratio));
  }
  w = std::clamp(w, 1, width);
  h = std::clamp(h, 1, height);
  return {(width - w) / 2, (height - h) / 2, w, h};
}

Box random_erasing_box(int width, int height, Rng& rng) {
  const double area = double(width) * height;
  const double log_lo = std::log(0.3), log_hi = std::log(3.3);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.uniform(0.02, 0.33);
    const double ratio = std::exp(rng.uniform(log_lo, log_hi));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(target * ratio)));  // Python's round
    const int w = static_cast<int>(std::nearbyint(std::sqrt(target / ratio)));
    if (h < height && w < width) {
      const int y = static_cast<int>(rng.range(0, height - h + 1));
      const int x = static_cast<int>(rng.range(0, width - w + 1));
      return {x, y, w, h};
    }
  }
  return {};
}

Box center_crop_box(int width, int height, int size, int resize) {
  // torchvision Resize(r): the short side becomes r, the long one int(r * long / short).
  const int r = resize > 0 ? std::max(resize, size) : size * 256 / 224;
  const bool wide = width >= height;
  const int s_short = wide ? height : width, s_long = wide ? width : height;
  const int r_long = static_cast<int>(int64_t{r} * s_long / s_short);
  // CenterCrop(size) in the resized image starts at round((r_side - size) / 2); map back to source
  // pixels by the per-axis scale (source / resized).
  const int rw = wide ? r_long : r, rh = wide ? r : r_long;
  auto map = [](int src, int res, int size) {
    const double s = double(src) / res;
    const int first = static_cast<int>(std::nearbyint((res - size) / 2.0));  // Python's round: half to even
    int a = static_cast<int>(std::lround(first * s));
    int len = std::max(1, static_cast<int>(std::lround(size * s)));
    len = std::min(len, src);
    a = std::clamp(a, 0, src - len);
    return std::pair<int, int>(a, len);
  };
  // Both resized sides are >= r >= size (Resize scales small images up too), so the crop fits.
  const auto [x, w] = map(width, rw, size);
  const auto [y, h] = map(height, rh, size);
  return {x, y, w, h};
}

int reduction_for(const Box& box, int size) {
  int f = 1;
  while (f < 8 && std::min(box.w, box.h) / (2 * f) >= size) f *= 2;
  return f;
}

AugmentSpec make_augment_spec(int size, bool train, float min_scale, float max_scale, bool flip,
                              const float mean[3], const float std[3]) {
  AugmentSpec a;
  a.size = size;
  a.train = train;
  a.min_scale = min_scale;
  a.max_scale = max_scale;
  a.flip = flip && train;
  a.norm = norm_table(norm_params(mean, std));
  for (int c = 0; c < 3; ++c)
    a.erase_rgb[c] = static_cast<uint8_t>(std::clamp(std::lround(mean[c] * 255.0), 0L, 255L));
  return a;
}

}  // namespace rt::data

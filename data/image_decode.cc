// Decode + augment of one image with OpenCV: reduced-size JPEG decode, one resize straight to
// the output size, then flip, the automatic augmentation's ops, random erasing, channel split and
// normalize into the batch layouts.
#include <algorithm>
#include <cmath>
#include <mutex>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "data/image_cv.h"

namespace rt::data {

DecodeScratch::DecodeScratch() : m_(std::make_unique<Mats>()) {}
DecodeScratch::~DecodeScratch() = default;

bool have_image_decoder() { return true; }

// OpenCV's thread count is one process-wide setting (its TBB arena), and setting it from two
// threads at once tears the arena down under the other and crashes: set once, by the first
// decode thread, while the others wait.
void decode_thread_init() {
  static std::once_flag once;
  std::call_once(once, [] { cv::setNumThreads(1); });
}

void crop_resize_write(const cv::Mat& bgr, const Box& box, bool flip, const AugmentSpec& spec,
                       DecodeScratch& scratch, float* out_chw, uint8_t* out_hwc,
                       const PixelDraws* draws) {
  const int s = spec.size;
  const cv::Mat roi = bgr(cv::Rect(box.x, box.y, box.w, box.h));
  const cv::Mat* src = &roi;
  DecodeScratch::Mats& m = scratch.mats();
  if (box.w != s || box.h != s) {
    // Shrinking by more than 2x with bilinear or bicubic taps would alias; area averaging does
    // not. (The reduced-size JPEG decode leaves less than 2x to shrink in most crops.)
    const bool big = box.w >= 2 * s && box.h >= 2 * s;
    const bool cubic = spec.interpolation == Interpolation::bicubic ||
                       (spec.interpolation == Interpolation::random && draws && draws->bicubic);
    const int taps = cubic ? cv::INTER_CUBIC : cv::INTER_LINEAR;
    cv::resize(roi, m.resized, cv::Size(s, s), 0, 0, big ? cv::INTER_AREA : taps);
    src = &m.resized;
  }
  if (flip) {
    cv::flip(*src, m.flipped, 1);
    src = &m.flipped;
  }
  if (draws && (draws->nsteps > 0 || draws->erase.w * draws->erase.h > 0)) {
    src->copyTo(m.augmented);  // the ops work in place on an image of the output size
    const Image8 img{m.augmented.data, s, s, m.augmented.step[0], 2};
    for (int i = 0; i < draws->nsteps; ++i) apply_aug_step(draws->steps[i], img, m.aug_scratch);
    const Box& e = draws->erase;
    // torchvision erases the normalized tensor with 0, the mean colour; bytes hold its nearest.
    if (e.w * e.h > 0)
      m.augmented(cv::Rect(e.x, e.y, e.w, e.h)).setTo(cv::Scalar(spec.erase_rgb[2], spec.erase_rgb[1], spec.erase_rgb[0]));
    src = &m.augmented;
  }
  if (out_hwc) {
    cv::Mat hwc(s, s, CV_8UC3, out_hwc);
    cv::cvtColor(*src, hwc, cv::COLOR_BGR2RGB);
  }
  if (out_chw) {
    // One table lookup per byte (nn/normalize.h): the same floats a backend's 8-bit import makes
    // from out_hwc, on any CPU. Row by row: an unresized crop is a view with the source's stride.
    const size_t plane = static_cast<size_t>(s) * s;
    const NormTable& t = spec.norm;
    for (int y = 0; y < s; ++y) {
      const uint8_t* px = src->ptr<uint8_t>(y);  // B, G, R
      float* r = out_chw + static_cast<size_t>(y) * s;
      float* g = r + plane;
      float* b = g + plane;
      for (int x = 0; x < s; ++x, px += 3) {
        b[x] = t.v[2][px[0]];
        g[x] = t.v[1][px[1]];
        r[x] = t.v[0][px[2]];
      }
    }
  }
}

bool decode_augment(const uint8_t* data, size_t len, const AugmentSpec& spec, Rng& rng,
                    DecodeScratch& scratch, float* out_chw, uint8_t* out_hwc) {
  if (len == 0) return false;
  cv::Mat& decoded = scratch.mats().decoded;
  const cv::Mat buf(1, static_cast<int>(len), CV_8U, const_cast<uint8_t*>(data));
  int w = 0, h = 0;
  bool jpeg = false;
  // Only bytes whose size a JPEG or PNG header states are decoded, and only up to kMaxImagePixels:
  // OpenCV allocates whatever a header claims (a 27-byte PPM header asks for 2.7 GB), and a decode
  // thread must not be made to do that by one bad file.
  if (!header_problem(data, len, &w, &h, &jpeg).empty()) return false;
  // Geometry first (random draws depend only on rng and the dims), then decode what it needs.
  const Box box = spec.train
                      ? random_resized_crop(w, h, spec.min_scale, spec.max_scale, rng, spec.min_ratio, spec.max_ratio)
                      : center_crop_box(w, h, spec.size, spec.resize);
  const bool flip = spec.flip && (rng.next_u64() >> 63);
  PixelDraws draws;
  if (spec.train) {
    draws.nsteps = draw_aug_steps(spec.auto_augment, spec.size, spec.size, rng, draws.steps);
    if (spec.random_erasing > 0 && rng.uniform() < spec.random_erasing)
      draws.erase = random_erasing_box(spec.size, spec.size, rng);
    // Last, and only when asked: every other setting keeps its draws as they were.
    if (spec.interpolation == Interpolation::random) draws.bicubic = rng.next_u64() >> 63;
  }
  Box use = box;
  {
    const int f = jpeg ? reduction_for(box, spec.size) : 1;  // other formats would decode fully anyway
    const int flag = f == 8 ? cv::IMREAD_REDUCED_COLOR_8 : f == 4 ? cv::IMREAD_REDUCED_COLOR_4
                   : f == 2 ? cv::IMREAD_REDUCED_COLOR_2 : cv::IMREAD_COLOR;
    try {
      // IGNORE_ORIENTATION: torchvision (PIL) does not apply EXIF rotation, and the header dims
      // must describe the decoded pixels for the crop to be drawn before decoding.
      // A fresh Mat each time: imdecode(buf, flags, &dst) leaves dst's old pixels in place when
      // the header cannot be read, which would pass off the previous image as this one.
      decoded = cv::imdecode(buf, flag | cv::IMREAD_IGNORE_ORIENTATION);
    } catch (const cv::Exception&) {
      return false;
    }
    if (decoded.empty()) return false;
    const cv::Mat& d = decoded;
    if (d.cols != w || d.rows != h) {  // reduced (libjpeg rounds the size up): scale the box
      const double sx = double(d.cols) / w, sy = double(d.rows) / h;
      use.x = std::min(static_cast<int>(box.x * sx), d.cols - 1);
      use.y = std::min(static_cast<int>(box.y * sy), d.rows - 1);
      use.w = std::clamp(static_cast<int>(std::lround(box.w * sx)), 1, d.cols - use.x);
      use.h = std::clamp(static_cast<int>(std::lround(box.h * sy)), 1, d.rows - use.y);
    }
  }
  if (decoded.type() != CV_8UC3) return false;
  crop_resize_write(decoded, use, flip, spec, scratch, out_chw, out_hwc, &draws);
  return true;
}

}  // namespace rt::data

// Decode + augment of one encoded image into the batch layouts (OpenCV; a build without it has
// only the geometry, and decode_augment throws). Training: random resized crop (torchvision's
// algorithm), horizontal flip, optionally an automatic augmentation policy (data/autoaugment.h)
// and random erasing; evaluation: resize the short side (to size * 256 / 224 unless told) and take
// the centre crop. Large images are decoded at 1/2, 1/4 or 1/8 size
// by the JPEG decoder when the region used is still at least `size` after reduction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "data/autoaugment.h"
#include "data/rng.h"
#include "nn/normalize.h"

namespace rt::data {

// Width and height from a JPEG SOF or PNG IHDR header without decoding; false when unknown.
bool image_dims(const uint8_t* data, size_t len, int* width, int* height, bool* is_jpeg);

// False for a JPEG whose last scan has no end-of-image marker (a truncated file, which libjpeg
// would decode with a grey bottom and only a warning).
bool jpeg_complete(const uint8_t* data, size_t len);

// A crop box in source pixels: x, y top-left, w, h size.
struct Box {
  int x = 0, y = 0, w = 0, h = 0;
};

// torchvision RandomResizedCrop.get_params: 10 attempts at an area in [min_scale, max_scale] of
// the image and log-uniform aspect ratio (w / h) in [min_ratio, max_ratio] (torchvision's
// default 3/4 to 4/3), else the centre crop clamped to the ratio range.
Box random_resized_crop(int width, int height, float min_scale, float max_scale, Rng& rng,
                        double min_ratio = 3.0 / 4.0, double max_ratio = 4.0 / 3.0);

// torchvision RandomErasing.get_params: 10 attempts at an area in [0.02, 0.33] of the image and a
// log-uniform aspect ratio (h / w) in [0.3, 3.3], sides rounded half to even, until both are
// smaller than the image's; else an empty box (nothing erased). A side may round to 0.
Box random_erasing_box(int width, int height, Rng& rng);

// The source box whose resize to size x size equals torchvision's Resize(resize) followed by
// CenterCrop(size), up to rounding to whole source pixels. resize: the short side's length after
// the resize, >= size; 0 = size * 256 / 224 (the classic 87.5 % crop).
Box center_crop_box(int width, int height, int size, int resize = 0);

// Largest of 1, 2, 4, 8 such that the box, reduced by it, still has both sides >= size.
int reduction_for(const Box& box, int size);

// The resize's taps where it shrinks by less than 2x or enlarges (area averaging beyond);
// random: each training crop draws bilinear or bicubic (timm's --train-interpolation default).
enum class Interpolation : uint8_t { bilinear, bicubic, random };

struct AugmentSpec {
  int size = 224;
  Interpolation interpolation = Interpolation::bilinear;
  bool train = true;
  int resize = 0;                // evaluation: center_crop_box's resize (0: size * 256 / 224)
  float min_scale = 0.08f, max_scale = 1.0f;
  double min_ratio = 3.0 / 4.0, max_ratio = 4.0 / 3.0;  // the crop's aspect ratio (w / h) range
  bool flip = true;
  AutoAugmentSpec auto_augment;  // training only: after the crop and flip
  float random_erasing = 0;      // training only: probability of erasing a box, after the policy
  uint8_t erase_rgb[3] = {0, 0, 0};  // what erasing writes: the mean colour's nearest bytes
  NormTable norm = norm_table(NormParams{});  // float output: (p / 255 - mean) / std, fused per channel
};
AugmentSpec make_augment_spec(int size, bool train, float min_scale, float max_scale, bool flip,
                              const float mean[3], const float std[3]);

// Per-thread buffers reused across images (no per-image allocation once sizes settle). Opaque:
// the decoder's image types stay out of this header (data/image_cv.h has them).
class DecodeScratch {
 public:
  struct Mats;
  DecodeScratch();
  ~DecodeScratch();
  DecodeScratch(const DecodeScratch&) = delete;
  DecodeScratch& operator=(const DecodeScratch&) = delete;
  Mats& mats() { return *m_; }

 private:
  std::unique_ptr<Mats> m_;
};

// False in a build without OpenCV: only synthetic data can be loaded then.
bool have_image_decoder();
// Called by each decode thread before it decodes: the loader's pool is the parallelism, so the
// decoder must not start threads of its own (set once per process; safe from any thread).
void decode_thread_init();

// Images above this many pixels (by their header) are not decoded.
constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

// What the header says of bytes about to be decoded: "" when they may be, else why not (no JPEG
// or PNG header image_dims can read, more than kMaxImagePixels, a JPEG cut short). Fills the
// dims image_dims reads.
std::string header_problem(const uint8_t* data, size_t len, int* width, int* height, bool* is_jpeg);

// Decodes and augments one image. Writes 3 * size * size floats (CHW, RGB, normalized) to
// out_chw and/or size * size * 3 bytes (HWC, RGB) to out_hwc (either may be null). Returns false
// when the bytes cannot be decoded: no JPEG or PNG header image_dims can read, more than
// kMaxImagePixels, or a decoder error. The crop and flip come from rng alone. Throws rt::Error
// where have_image_decoder() is false.
bool decode_augment(const uint8_t* data, size_t len, const AugmentSpec& spec, Rng& rng,
                    DecodeScratch& scratch, float* out_chw, uint8_t* out_hwc);

}  // namespace rt::data

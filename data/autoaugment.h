// Automatic augmentation of the training crop, as torchvision's transforms that the ImageNet
// recipes name with --auto-augment: AutoAugment (its ImageNet, CIFAR-10 and SVHN policies),
// RandAugment and TrivialAugmentWide. Each op follows torchvision's arithmetic on 8-bit tensors (float32 blends
// truncated to bytes, nearest-neighbour geometry with black outside the image), so for the same
// choices the pixels are torchvision's, a geometry pixel on a rounding tie aside. The choices come
// from the sample's own Rng, after its crop and flip: a resumed run augments as an uninterrupted one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/rng.h"

namespace rt::data {

enum class AutoAugment : uint8_t {
  none, autoaugment, randaugment, trivialaugment, autoaugment_cifar10, autoaugment_svhn
};

// "none", "autoaugment" (the ImageNet policy), "randaugment", "trivialaugment",
// "autoaugment_cifar10", "autoaugment_svhn" (AutoAugment's policies for those datasets).
const char* auto_augment_name(AutoAugment a);
// Throws rt::Error listing the names when s is none of them.
AutoAugment auto_augment_from_string(const std::string& s);

constexpr int kMaxAugSteps = 16;  // RandAugment's ops per image at most
constexpr int kAugBins = 31;      // RandAugment's and TrivialAugmentWide's magnitude bins

struct AutoAugmentSpec {
  AutoAugment policy = AutoAugment::none;
  int ops = 2;        // RandAugment: ops applied to each image, in [1, kMaxAugSteps]
  int magnitude = 9;  // RandAugment: every op's magnitude bin, in [0, kAugBins)
  // RandAugment: > 0 draws each op's bin around `magnitude` with this standard deviation (in
  // bins), rounded and clamped to [0, kAugBins) (timm's magnitude_std: its mstd0.5 over 10 levels
  // is 1.5 of these 30 steps); 0: every op at `magnitude`, as torchvision.
  double magnitude_std = 0;
};

// Throws rt::Error naming the field that is out of range.
void auto_augment_validate(const AutoAugmentSpec& s);

// In torchvision's order of RandAugment's op list (identity .. equalize), invert last.
enum class AugOp : uint8_t {
  identity, shear_x, shear_y, translate_x, translate_y, rotate, brightness, color, contrast,
  sharpness, posterize, solarize, autocontrast, equalize, invert
};
const char* aug_op_name(AugOp op);

// One op with its signed magnitude as torchvision's _apply_op takes it (shear: the tangent;
// translate: pixels; rotate: degrees counter-clockwise; enhancements: the factor minus 1;
// posterize: bits kept; solarize: the threshold).
struct AugStep {
  AugOp op = AugOp::identity;
  double magnitude = 0;
};

// The magnitude of bin `bin` of `bins` for op under a policy's table (torchvision's float32
// linspace and rounding), unsigned; 0 for ops without one.
double aug_magnitude(AutoAugment policy, AugOp op, int bin, int bins, int width, int height);

// RandAugment's bin for one op: s.magnitude, or with s.magnitude_std > 0 a normal draw around it
// (two uniforms of rng, Box-Muller), rounded and clamped to [0, kAugBins).
int randaugment_bin(const AutoAugmentSpec& s, Rng& rng);

// Draws the steps for one width x height image into out[0..n), returns n (<= kMaxAugSteps).
int draw_aug_steps(const AutoAugmentSpec& s, int width, int height, Rng& rng, AugStep* out);

// An interleaved 3-channel 8-bit image: rows `stride` bytes apart, green at byte 1 of a pixel and
// red at byte `red` (0: RGB, 2: BGR; the colour ops weigh the channels by it).
struct Image8 {
  uint8_t* px = nullptr;
  int width = 0, height = 0;
  size_t stride = 0;
  int red = 0;
};

// Applies one step in place; scratch is reused between calls (no allocation once it has grown).
void apply_aug_step(const AugStep& step, const Image8& img, std::vector<uint8_t>& scratch);

}  // namespace rt::data

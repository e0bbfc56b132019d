// The OpenCV side of data/image.h, for image_decode.cc and the tests of its geometry.
#pragma once

#include <vector>

#include <opencv2/core.hpp>

#include "data/image.h"

namespace rt::data {

struct DecodeScratch::Mats {
  cv::Mat decoded, resized, flipped, augmented;
  std::vector<uint8_t> aug_scratch;
};

// The pixel-level draws of one training image, made with its crop and flip.
struct PixelDraws {
  AugStep steps[kMaxAugSteps];  // the automatic augmentation's ops, in order
  int nsteps = 0;
  Box erase;                    // random erasing's box (empty: none)
  bool bicubic = false;         // Interpolation::random's draw
};

// Writes an already decoded BGR image's box, resized to size x size, into the outputs, mirrored
// when flip, then changed by the draws (the policy's ops, then the erasing).
void crop_resize_write(const cv::Mat& bgr, const Box& box, bool flip, const AugmentSpec& spec,
                       DecodeScratch& scratch, float* out_chw, uint8_t* out_hwc,
                       const PixelDraws* draws = nullptr);

}  // namespace rt::data

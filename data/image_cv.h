// The OpenCV side of data/image.h, for image_decode.cc and the tests of its geometry.
#pragma once

#include <opencv2/core.hpp>

#include "data/image.h"

namespace rt::data {

struct DecodeScratch::Mats {
  cv::Mat decoded, resized, flipped;
};

// Writes an already decoded BGR image's box, resized to size x size, into the outputs, mirrored
// when flip.
void crop_resize_write(const cv::Mat& bgr, const Box& box, bool flip, const AugmentSpec& spec,
                       DecodeScratch& scratch, float* out_chw, uint8_t* out_hwc);

}  // namespace rt::data

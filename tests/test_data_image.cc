// Decode + augment geometry on images whose pixels encode their own coordinates: crop boxes within
// bounds and scale/ratio limits, flip mirrors, the centre crop takes the centre, reduced decode,
// header parsing, grayscale input, truncated files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "data/image_cv.h"

namespace rt::data {
namespace {

// BGR image with B = x, G = y (both < 256), R = 77.
cv::Mat coord_image(int w, int h) {
  cv::Mat m(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) m.at<cv::Vec3b>(y, x) = cv::Vec3b(uint8_t(x), uint8_t(y), 77);
  return m;
}

AugmentSpec raw_spec(int size, bool train) {  // outputs stay in pixel units (mean 0, std 1/255)
  const float mean[3] = {0, 0, 0}, std[3] = {1.0f / 255, 1.0f / 255, 1.0f / 255};
  return make_augment_spec(size, train, 0.08f, 1.0f, true, mean, std);
}

std::vector<uint8_t> encode(const cv::Mat& m, const char* ext, int quality = 95) {
  std::vector<uint8_t> out;
  std::vector<int> params;
  if (std::string(ext) == ".jpg") params = {cv::IMWRITE_JPEG_QUALITY, quality};
  EXPECT_TRUE(cv::imencode(ext, m, out, params));
  return out;
}

TEST(data_image, RandomResizedCropWithinBoundsScaleAndRatio) {
  int fallbacks = 0;
  for (auto [w, h] : {std::pair{500, 375}, {64, 64}, {33, 200}, {300, 20}, {1, 1}}) {
    for (int i = 0; i < 2000; ++i) {
      Rng rng(3, 0, i, Stream::augment);
      const Box b = random_resized_crop(w, h, 0.08f, 1.0f, rng);
      ASSERT_GE(b.x, 0); ASSERT_GE(b.y, 0); ASSERT_GE(b.w, 1); ASSERT_GE(b.h, 1);
      ASSERT_LE(b.x + b.w, w); ASSERT_LE(b.y + b.h, h);
      const double area = double(b.w) * b.h / (double(w) * h), ratio = double(b.w) / b.h;
      const bool fallback = b.x == (w - b.w) / 2 && b.y == (h - b.h) / 2 && (b.w == w || b.h == h);
      if (w >= 64 && h >= 64 && !fallback) {
        // Rounding w and h to whole pixels moves area and ratio a little past the drawn range.
        EXPECT_GE(area, 0.08 * 0.9); EXPECT_LE(area, 1.0);
        EXPECT_GE(ratio, 0.75 * 0.95); EXPECT_LE(ratio, 4.0 / 3.0 * 1.05);
      }
      fallbacks += fallback;
    }
  }
  EXPECT_GT(fallbacks, 0);  // the thin images must exercise the fallback
}

// data.min_ratio / max_ratio (torchvision's ratio=, timm's --ratio): the drawn boxes keep to the
// range given, and the fallback clamps a thin image to it.
TEST(data_image, RandomResizedCropTakesItsRatioRange) {
  for (const auto& [lo, hi] : {std::pair{1.0, 1.0}, {1.5, 2.5}, {0.25, 0.5}}) {
    double seen_lo = 1e9, seen_hi = 0;
    for (int i = 0; i < 2000; ++i) {
      Rng rng(5, 0, i, Stream::augment);
      const Box b = random_resized_crop(400, 400, 0.2f, 1.0f, rng, lo, hi);
      const double ratio = double(b.w) / b.h;
      if (b.w == 400 || b.h == 400) continue;  // a fallback, or a box on a side: rounded at 400
      seen_lo = std::min(seen_lo, ratio);
      seen_hi = std::max(seen_hi, ratio);
    }
    EXPECT_GE(seen_lo, lo * 0.97) << lo << "-" << hi;  // whole pixels round the ratio a little
    EXPECT_LE(seen_hi, hi * 1.03) << lo << "-" << hi;
    EXPECT_LE(seen_hi - seen_lo, (hi - lo) * 1.03 + 0.02) << lo << "-" << hi;
  }
  Rng rng(1, 0, 0, Stream::augment);
  const Box b = random_resized_crop(300, 20, 0.9f, 1.0f, rng, 1.0, 1.0);  // no square fits 90 %
  EXPECT_TRUE(b.w == 20 && b.h == 20 && b.x == 140 && b.y == 0) << b.x << " " << b.y << " " << b.w << " " << b.h;
}

TEST(data_image, SameRngSameBox) {
  Rng a(1, 2, 3, Stream::augment), b(1, 2, 3, Stream::augment), c(1, 2, 4, Stream::augment);
  const Box x = random_resized_crop(500, 375, 0.08f, 1, a), y = random_resized_crop(500, 375, 0.08f, 1, b);
  const Box z = random_resized_crop(500, 375, 0.08f, 1, c);
  EXPECT_TRUE(x.x == y.x && x.y == y.y && x.w == y.w && x.h == y.h);
  EXPECT_FALSE(x.x == z.x && x.y == z.y && x.w == z.w && x.h == z.h);
}

TEST(data_image, CenterCropBoxIsTheCentre) {
  // 224 from 500x375: resize short side to 256 (-> 341x256), crop 224 at (58.5->58/59, 16).
  const Box b = center_crop_box(500, 375, 224);
  EXPECT_NEAR(b.x + b.w / 2.0, 250, 1.0);
  EXPECT_NEAR(b.y + b.h / 2.0, 187.5, 1.0);
  EXPECT_NEAR(b.h, 375.0 * 224 / 256, 1.0);
  EXPECT_NEAR(b.w, 500.0 * 224 / 341, 1.5);
  const Box small = center_crop_box(20, 10, 224);  // smaller than the crop: scaled up, centred
  EXPECT_NEAR(small.h, 10.0 * 224 / 256, 0.5);
  EXPECT_NEAR(small.w, 20.0 * 224 / 512, 0.5);
  EXPECT_NEAR(small.x + small.w / 2.0, 10, 1.0);
  EXPECT_NEAR(small.y + small.h / 2.0, 5, 1.0);
  const Box t = center_crop_box(100, 300, 32);  // tall: short side is the width
  EXPECT_NEAR(t.y + t.h / 2.0, 150, 1.0);
  EXPECT_NEAR(t.w, 100.0 * 32 / 36, 1.0);
}

// torchvision's Resize(232) + CenterCrop(224) (the FixRes-style evaluation of its newer
// recipes): the crop is 224 / 232 of the short side, centred.
TEST(data_image, CenterCropBoxWithAnExplicitResize) {
  const Box b = center_crop_box(500, 375, 224, 232);
  EXPECT_NEAR(b.h, 375.0 * 224 / 232, 1.0);
  EXPECT_NEAR(b.w, 500.0 * 224 / int(232 * 500 / 375), 1.0);
  EXPECT_NEAR(b.x + b.w / 2.0, 250, 1.0);
  EXPECT_NEAR(b.y + b.h / 2.0, 187.5, 1.0);
  const Box classic = center_crop_box(500, 375, 224), zero = center_crop_box(500, 375, 224, 0);
  EXPECT_TRUE(classic.x == zero.x && classic.y == zero.y && classic.w == zero.w && classic.h == zero.h);
  const Box whole = center_crop_box(500, 375, 224, 224);  // no margin: the whole short side
  EXPECT_EQ(whole.h, 375);
  EXPECT_EQ(whole.y, 0);
}

// CenterCrop's offset is Python's round((side - size) / 2): halves to even, as torchvision's
// crop of 64 from 97x73 (no resize: Resize(73) keeps it) at top 4 (4.5), left 16 (16.5); and
// 500x375 at 256/224 from 341 wide: left round(58.5) = 58 resized pixels.
TEST(data_image, CenterCropOffsetRoundsHalvesToEvenAsTorchvision) {
  const Box b = center_crop_box(97, 73, 64, 73);
  EXPECT_EQ(b.x, 16);
  EXPECT_EQ(b.y, 4);
  EXPECT_EQ(b.w, 64);
  EXPECT_EQ(b.h, 64);
  EXPECT_EQ(center_crop_box(500, 375, 224).x, int(std::lround(58 * 500.0 / 341)));
}

TEST(data_image, CropResizeTakesTheBoxAndFlipMirrors) {
  const cv::Mat img = coord_image(200, 150);
  const AugmentSpec spec = raw_spec(20, true);
  DecodeScratch scratch;
  std::vector<float> out(3 * 20 * 20), flipped(3 * 20 * 20);
  std::vector<uint8_t> hwc(20 * 20 * 3);
  const Box box{40, 30, 100, 80};
  crop_resize_write(img, box, false, spec, scratch, out.data(), hwc.data());
  crop_resize_write(img, box, true, spec, scratch, flipped.data(), nullptr);
  const int plane = 400;
  // Channel 0 is R (constant), 1 is G = y, 2 is B = x; values follow the box.
  EXPECT_NEAR(out[0], 77, 0.5);
  EXPECT_NEAR(out[2 * plane + 0], 40 + 2.5, 3.0);             // leftmost column near x = 40
  EXPECT_NEAR(out[2 * plane + 19], 40 + 100 - 2.5, 3.0);      // rightmost near x = 139
  EXPECT_NEAR(out[plane + 0], 30 + 2, 3.0);                   // top row near y = 30
  EXPECT_NEAR(out[plane + 19 * 20], 30 + 80 - 2, 3.0);        // bottom row near y = 109
  for (int y = 0; y < 20; ++y)
    for (int x = 0; x < 20; ++x)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(flipped[c * plane + y * 20 + x], out[c * plane + y * 20 + 19 - x]);
  // 8-bit output: RGB, HWC, the same pixels.
  EXPECT_EQ(hwc[(5 * 20 + 7) * 3 + 2], static_cast<uint8_t>(std::lround(out[2 * plane + 5 * 20 + 7])));
  EXPECT_EQ(hwc[(5 * 20 + 7) * 3 + 1], static_cast<uint8_t>(std::lround(out[plane + 5 * 20 + 7])));
}

// data.interpolation: bicubic taps are OpenCV's (its cubic kernel, a = -0.75), which ring at an
// edge (undershoot and overshoot) where bilinear stays between the two levels; beyond a 2x
// shrink both average areas.
TEST(data_image, BicubicTapsRingAtAnEdgeAndAreaAveragingStaysBeyondTwoTimes) {
  cv::Mat img(40, 40, CV_8UC3, cv::Scalar(50, 50, 50));
  img(cv::Rect(20, 0, 20, 40)).setTo(cv::Scalar(200, 200, 200));  // a vertical edge at x = 20
  AugmentSpec linear = raw_spec(56, false), cubic = linear;
  cubic.interpolation = Interpolation::bicubic;
  DecodeScratch scratch;
  auto run = [&](const AugmentSpec& spec, const Box& box) {
    std::vector<float> out(size_t(3) * spec.size * spec.size);
    crop_resize_write(img, box, false, spec, scratch, out.data(), nullptr);
    return out;
  };
  const Box whole{0, 0, 40, 40};  // enlarged 1.4x
  const auto l = run(linear, whole), c = run(cubic, whole);
  const auto [lmin, lmax] = std::minmax_element(l.begin(), l.end());
  const auto [cmin, cmax] = std::minmax_element(c.begin(), c.end());
  EXPECT_GE(*lmin, 50);
  EXPECT_LE(*lmax, 200);
  EXPECT_LT(*cmin, 45);
  EXPECT_GT(*cmax, 205);
  cv::Mat want;
  cv::resize(img, want, cv::Size(56, 56), 0, 0, cv::INTER_CUBIC);
  for (int y = 0; y < 56; y += 11)
    for (int x = 0; x < 56; ++x) ASSERT_EQ(c[size_t(y) * 56 + x], want.at<cv::Vec3b>(y, x)[2]) << y << "," << x;
  linear.size = cubic.size = 16;  // 40 -> 16: 2.5x smaller
  EXPECT_EQ(run(linear, whole), run(cubic, whole));
}

TEST(data_image, NormalizeUsesMeanAndStdPerRgbChannel) {
  cv::Mat img(4, 4, CV_8UC3, cv::Scalar(0, 128, 255));  // B=0 G=128 R=255
  const float mean[3] = {0.5f, 0.25f, 0.125f}, std[3] = {0.5f, 0.25f, 2.0f};
  const AugmentSpec spec = make_augment_spec(4, false, 0.08f, 1, false, mean, std);
  DecodeScratch scratch;
  std::vector<float> out(3 * 16);
  crop_resize_write(img, {0, 0, 4, 4}, false, spec, scratch, out.data(), nullptr);
  EXPECT_NEAR(out[0], (1.0f - 0.5f) / 0.5f, 1e-5);
  EXPECT_NEAR(out[16], (128 / 255.0f - 0.25f) / 0.25f, 1e-5);
  EXPECT_NEAR(out[32], (0.0f - 0.125f) / 2.0f, 1e-5);
}

TEST(data_image, HeaderDimsJpegAndPng) {
  const cv::Mat img = coord_image(123, 45);
  for (const char* ext : {".jpg", ".png"}) {
    const std::vector<uint8_t> e = encode(img, ext);
    int w = 0, h = 0;
    bool jpeg = false;
    ASSERT_TRUE(image_dims(e.data(), e.size(), &w, &h, &jpeg)) << ext;
    EXPECT_EQ(w, 123); EXPECT_EQ(h, 45);
    EXPECT_EQ(jpeg, std::string(ext) == ".jpg");
  }
  const uint8_t junk[] = {1, 2, 3, 4, 5, 6, 7, 8};
  int w, h;
  bool jpeg;
  EXPECT_FALSE(image_dims(junk, sizeof(junk), &w, &h, &jpeg));
  EXPECT_EQ(reduction_for({0, 0, 500, 375}, 224), 1);
  EXPECT_EQ(reduction_for({0, 0, 500, 460}, 224), 2);
  EXPECT_EQ(reduction_for({0, 0, 4000, 3000}, 224), 8);
  EXPECT_EQ(reduction_for({0, 0, 4000, 3000}, 400), 4);
}

// Stray bytes between marker segments: libjpeg warns and decodes (as PIL does), so the header
// walk must pass over them too rather than call the file no image.
TEST(data_image, StrayBytesBeforeAMarkerAreSkipped) {
  const std::vector<uint8_t> jpg = encode(coord_image(120, 80), ".jpg");
  ASSERT_EQ(jpg[2], 0xff);
  const size_t app0_end = 4 + ((size_t{jpg[4]} << 8) | jpg[5]);  // SOI, then the first segment
  std::vector<uint8_t> padded(jpg.begin(), jpg.begin() + long(app0_end));
  padded.insert(padded.end(), {0x00, 0x12, 0x34, 0xff, 0xff});  // stray bytes, then fill bytes
  padded.insert(padded.end(), jpg.begin() + long(app0_end), jpg.end());
  int w = 0, h = 0;
  bool is_jpeg = false;
  EXPECT_EQ(header_problem(padded.data(), padded.size(), &w, &h, &is_jpeg), "");
  EXPECT_EQ(w, 120);
  EXPECT_EQ(h, 80);
  DecodeScratch scratch;
  std::vector<float> out(3 * 8 * 8);
  Rng rng(1);
  EXPECT_TRUE(decode_augment(padded.data(), padded.size(), raw_spec(8, false), rng, scratch, out.data(), nullptr));
  // Cut short after the padding: still refused.
  EXPECT_NE(header_problem(padded.data(), padded.size() / 2, &w, &h, &is_jpeg), "");
}

TEST(data_image, ReducedDecodeMatchesFullDecodeClosely) {
  // A smooth 1024x768 image: the 1/4-size decode and the full decode give nearly the same crop.
  cv::Mat img(768, 1024, CV_8UC3);
  for (int y = 0; y < 768; ++y)
    for (int x = 0; x < 1024; ++x) img.at<cv::Vec3b>(y, x) = cv::Vec3b(uint8_t(x / 4), uint8_t(y / 3), 100);
  const std::vector<uint8_t> jpg = encode(img, ".jpg");
  const AugmentSpec spec = raw_spec(64, false);
  DecodeScratch scratch;
  std::vector<float> fast(3 * 64 * 64), full(3 * 64 * 64);
  Rng rng(0);
  ASSERT_TRUE(decode_augment(jpg.data(), jpg.size(), spec, rng, scratch, fast.data(), nullptr));
  EXPECT_LT(scratch.mats().decoded.cols, 1024);  // it did decode reduced
  const cv::Mat dec = cv::imdecode(jpg, cv::IMREAD_COLOR);
  crop_resize_write(dec, center_crop_box(1024, 768, 64), false, spec, scratch, full.data(), nullptr);
  double err = 0;
  for (size_t i = 0; i < fast.size(); ++i) err = std::max(err, double(std::abs(fast[i] - full[i])));
  EXPECT_LT(err, 12.0);  // pixel units; the gradient spans 256 levels
}

TEST(data_image, GrayscaleBecomesThreeChannels) {
  cv::Mat gray(40, 50, CV_8UC1, cv::Scalar(90));
  for (const char* ext : {".png", ".jpg"}) {
    const std::vector<uint8_t> e = encode(gray, ext);
    DecodeScratch scratch;
    std::vector<float> out(3 * 16 * 16);
    std::vector<uint8_t> hwc(16 * 16 * 3);
    Rng rng(1);
    ASSERT_TRUE(decode_augment(e.data(), e.size(), raw_spec(16, true), rng, scratch, out.data(), hwc.data())) << ext;
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(out[c * 256 + 100], 90, 2.0) << ext;
  }
}

// A 16x12 CMYK JPEG (as Photoshop-style Adobe JPEGs store it): left half cyan, right half red.
const uint8_t kCmykJpeg[] = {
    0xff, 0xd8, 0xff, 0xee, 0x00, 0x0e, 0x41, 0x64, 0x6f, 0x62, 0x65, 0x00, 0x64, 0x00, 0x00, 0x00,
    0x00, 0x00, 0xff, 0xdb, 0x00, 0x43, 0x00, 0x02, 0x01, 0x01, 0x01, 0x01, 0x01, 0x02, 0x01, 0x01,
    0x01, 0x02, 0x02, 0x02, 0x02, 0x02, 0x04, 0x03, 0x02, 0x02, 0x02, 0x02, 0x05, 0x04, 0x04, 0x03,
    0x04, 0x06, 0x05, 0x06, 0x06, 0x06, 0x05, 0x06, 0x06, 0x06, 0x07, 0x09, 0x08, 0x06, 0x07, 0x09,
    0x07, 0x06, 0x06, 0x08, 0x0b, 0x08, 0x09, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x06, 0x08, 0x0b, 0x0c,
    0x0b, 0x0a, 0x0c, 0x09, 0x0a, 0x0a, 0x0a, 0xff, 0xc0, 0x00, 0x14, 0x08, 0x00, 0x0c, 0x00, 0x10,
    0x04, 0x43, 0x11, 0x00, 0x4d, 0x11, 0x00, 0x59, 0x11, 0x00, 0x4b, 0x11, 0x00, 0xff, 0xc4, 0x00,
    0x1f, 0x00, 0x00, 0x01, 0x05, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0xff, 0xc4,
    0x00, 0xb5, 0x10, 0x00, 0x02, 0x01, 0x03, 0x03, 0x02, 0x04, 0x03, 0x05, 0x05, 0x04, 0x04, 0x00,
    0x00, 0x01, 0x7d, 0x01, 0x02, 0x03, 0x00, 0x04, 0x11, 0x05, 0x12, 0x21, 0x31, 0x41, 0x06, 0x13,
    0x51, 0x61, 0x07, 0x22, 0x71, 0x14, 0x32, 0x81, 0x91, 0xa1, 0x08, 0x23, 0x42, 0xb1, 0xc1, 0x15,
    0x52, 0xd1, 0xf0, 0x24, 0x33, 0x62, 0x72, 0x82, 0x09, 0x0a, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x25,
    0x26, 0x27, 0x28, 0x29, 0x2a, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x43, 0x44, 0x45, 0x46,
    0x47, 0x48, 0x49, 0x4a, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x63, 0x64, 0x65, 0x66,
    0x67, 0x68, 0x69, 0x6a, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x83, 0x84, 0x85, 0x86,
    0x87, 0x88, 0x89, 0x8a, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9a, 0xa2, 0xa3, 0xa4,
    0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xc2,
    0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xd9,
    0xda, 0xe1, 0xe2, 0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5,
    0xf6, 0xf7, 0xf8, 0xf9, 0xfa, 0xff, 0xda, 0x00, 0x0e, 0x04, 0x43, 0x00, 0x4d, 0x00, 0x59, 0x00,
    0x4b, 0x00, 0x00, 0x3f, 0x00, 0xfc, 0xdb, 0xaf, 0xdf, 0xca, 0xfd, 0xfc, 0xaf, 0xdf, 0xca, 0xfe,
    0xc8, 0x2b, 0xf8, 0xdf, 0xaf, 0xe3, 0x7e, 0xbc, 0x1e, 0xbf, 0x8d, 0xfa, 0xfe, 0xc8, 0x2b, 0xfb,
    0x20, 0xaf, 0x78, 0xaf, 0xec, 0x82, 0xbf, 0x8d, 0xfa, 0xfe, 0x37, 0xeb, 0xc1, 0xeb, 0xff, 0xd9

};

TEST(data_image, CmykBecomesRgb) {
  DecodeScratch scratch;
  std::vector<uint8_t> hwc(12 * 12 * 3);
  Rng rng(1);
  AugmentSpec spec = raw_spec(12, false);
  ASSERT_TRUE(decode_augment(kCmykJpeg, sizeof(kCmykJpeg), spec, rng, scratch, nullptr, hwc.data()));
  const uint8_t* left = &hwc[(6 * 12 + 1) * 3];
  const uint8_t* right = &hwc[(6 * 12 + 10) * 3];
  EXPECT_LT(left[0], 100);  EXPECT_GT(left[1], 180); EXPECT_GT(left[2], 180);    // cyan
  EXPECT_GT(right[0], 180); EXPECT_LT(right[1], 100); EXPECT_LT(right[2], 100);  // red
}

TEST(data_image, CorruptAndTruncatedImagesFail) {
  const std::vector<uint8_t> jpg = encode(coord_image(64, 64), ".jpg");
  const std::vector<uint8_t> png = encode(coord_image(64, 64), ".png");
  DecodeScratch scratch;
  std::vector<float> out(3 * 8 * 8);
  Rng rng(1);
  const AugmentSpec spec = raw_spec(8, true);
  EXPECT_TRUE(decode_augment(jpg.data(), jpg.size(), spec, rng, scratch, out.data(), nullptr));
  EXPECT_TRUE(decode_augment(jpg.data(), jpg.size(), spec, rng, scratch, out.data(), nullptr));
  EXPECT_FALSE(decode_augment(jpg.data(), jpg.size() / 2, spec, rng, scratch, out.data(), nullptr));
  EXPECT_FALSE(decode_augment(png.data(), png.size() / 2, spec, rng, scratch, out.data(), nullptr));
  // A JPEG whose frame header parses but whose tables are garbage, right after a good image of
  // the same size: must fail, not return the previous pixels.
  size_t dht = 2;
  while (dht + 1 < jpg.size() && !(jpg[dht] == 0xff && jpg[dht + 1] == 0xc4)) ++dht;  // first DHT
  std::vector<uint8_t> broken(jpg.begin(), jpg.begin() + dht + 4);
  for (int i = 0; i < 300; ++i) broken.push_back(static_cast<uint8_t>(i * 37 % 255));
  broken.push_back(0xff), broken.push_back(0xd9);
  int w, h;
  bool is_jpeg;
  ASSERT_TRUE(image_dims(broken.data(), broken.size(), &w, &h, &is_jpeg));
  EXPECT_TRUE(decode_augment(jpg.data(), jpg.size(), spec, rng, scratch, out.data(), nullptr));
  EXPECT_FALSE(decode_augment(broken.data(), broken.size(), spec, rng, scratch, out.data(), nullptr));
  std::vector<uint8_t> garbage(1000, 0x5a);
  EXPECT_TRUE(decode_augment(jpg.data(), jpg.size(), spec, rng, scratch, out.data(), nullptr));
  EXPECT_FALSE(decode_augment(garbage.data(), garbage.size(), spec, rng, scratch, out.data(), nullptr));
  EXPECT_FALSE(decode_augment(garbage.data(), 0, spec, rng, scratch, out.data(), nullptr));
}

}  // namespace
}  // namespace rt::data

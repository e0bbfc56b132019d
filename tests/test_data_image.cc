// Decode + augment geometry on images whose pixels encode their own coordinates: crop boxes within
// bounds and scale/ratio limits, flip mirrors, the centre crop takes the centre, reduced decode,
// header parsing, grayscale input, truncated files.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <opencv2/imgcodecs.hpp>

#include "data/image.h"

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
  const Box t = center_crop_box(100, 300, 32);  // tall: short side is the width
  EXPECT_NEAR(t.y + t.h / 2.0, 150, 1.0);
  EXPECT_NEAR(t.w, 100.0 * 32 / 36, 1.0);
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
  EXPECT_LT(scratch.decoded.cols, 1024);  // it did decode reduced
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

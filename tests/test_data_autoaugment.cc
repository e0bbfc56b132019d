// The automatic augmentation's ops on images whose expected bytes follow from the op's definition
// (tests/tools/test_autoaugment.py holds every op to torchvision's own), its policy draws, its
// checks, and its place in decode_augment: after the crop and flip, training only, the same
// pixels in both batch layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include <opencv2/imgcodecs.hpp>

#include "data/autoaugment.h"
#include "data/image.h"
#include "tests/error_of.h"

namespace rt::data {
namespace {

using rt_test::error_of;

struct Pixels {
  int w, h;
  std::vector<uint8_t> px;  // RGB
  Pixels(int w_, int h_) : w(w_), h(h_), px(static_cast<size_t>(w_) * h_ * 3) {
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 37 + i / 7) % 256);
  }
  uint8_t& at(int x, int y, int c) { return px[(static_cast<size_t>(y) * w + x) * 3 + c]; }
  Image8 image(int red = 0) { return Image8{px.data(), w, h, static_cast<size_t>(w) * 3, red}; }
};

// A PNG of w x h pixels, every one different: BGR (x, y, x ^ y).
std::vector<uint8_t> pattern_png(int w, int h) {
  cv::Mat m(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) m.at<cv::Vec3b>(y, x) = cv::Vec3b(uint8_t(x), uint8_t(y), uint8_t(x ^ y));
  std::vector<uint8_t> png;
  EXPECT_TRUE(cv::imencode(".png", m, png));
  return png;
}

// decode_augment of png with a generator seeded by seed: the 8-bit output; the float one in *chw.
std::vector<uint8_t> decode(const std::vector<uint8_t>& png, const AugmentSpec& spec, uint64_t seed,
                            DecodeScratch& scratch, std::vector<float>* chw = nullptr) {
  const size_t n = static_cast<size_t>(spec.size) * spec.size * 3;
  std::vector<uint8_t> hwc(n);
  std::vector<float> f(n);
  Rng rng(seed);
  EXPECT_TRUE(decode_augment(png.data(), png.size(), spec, rng, scratch, f.data(), hwc.data()));
  if (chw) *chw = std::move(f);
  return hwc;
}

std::vector<uint8_t> applied(Pixels p, AugOp op, double m, int red = 0) {
  std::vector<uint8_t> scratch;
  apply_aug_step({op, m}, p.image(red), scratch);
  return p.px;
}

TEST(AutoAugmentOps, TablesOfOneByte) {
  const Pixels in(9, 7);
  const auto post = applied(in, AugOp::posterize, 3), inv = applied(in, AugOp::invert, 0),
             sol = applied(in, AugOp::solarize, 128.5), same = applied(in, AugOp::brightness, 0.0);
  for (size_t i = 0; i < in.px.size(); ++i) {
    const uint8_t v = in.px[i];
    EXPECT_EQ(post[i], v & 0xe0) << i;  // 3 bits kept
    EXPECT_EQ(inv[i], 255 - v) << i;
    EXPECT_EQ(sol[i], v >= 129 ? 255 - v : v) << i;
    EXPECT_EQ(same[i], v) << i;  // factor 1
  }
  // Brightness 0.5: 0.5 x truncated; -1 (factor 0) is black.
  const auto half = applied(in, AugOp::brightness, -0.5), black = applied(in, AugOp::brightness, -1);
  for (size_t i = 0; i < in.px.size(); ++i) {
    EXPECT_EQ(half[i], in.px[i] / 2) << i;
    EXPECT_EQ(black[i], 0) << i;
  }
}

TEST(AutoAugmentOps, AutocontrastStretchesEachChannelAndLeavesAFlatOne) {
  Pixels in(4, 2);
  for (int i = 0; i < 8; ++i) {
    in.at(i % 4, i / 4, 0) = static_cast<uint8_t>(100 + 10 * i);  // 100..170
    in.at(i % 4, i / 4, 1) = 42;                                   // flat
    in.at(i % 4, i / 4, 2) = static_cast<uint8_t>(i % 2 ? 255 : 0);
  }
  Pixels out = in;
  out.px = applied(in, AugOp::autocontrast, 0);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(out.at(i % 4, i / 4, 0), static_cast<uint8_t>(10.0f * i * (255.0f / 70.0f))) << i;
    EXPECT_EQ(out.at(i % 4, i / 4, 1), 42) << i;
    EXPECT_EQ(out.at(i % 4, i / 4, 2), in.at(i % 4, i / 4, 2)) << i;
  }
}

TEST(AutoAugmentOps, EqualizeSpreadsTheHistogram) {
  // 510 pixels: 255 of value 10, 255 of value 20 in every channel. step = 255 / 255 = 1; 10 maps
  // to (0 + 0) / 1 = 0 and 20 to (255 + 0) / 1 = 255.
  Pixels in(255, 2);
  for (int x = 0; x < 255; ++x)
    for (int c = 0; c < 3; ++c) in.at(x, 0, c) = 10, in.at(x, 1, c) = 20;
  Pixels out = in;
  out.px = applied(in, AugOp::equalize, 0);
  for (int x = 0; x < 255; ++x)
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(out.at(x, 0, c), 0);
      EXPECT_EQ(out.at(x, 1, c), 255);
    }
  // One value only: nothing to spread (step 0).
  Pixels flat(5, 5);
  std::fill(flat.px.begin(), flat.px.end(), uint8_t{77});
  EXPECT_EQ(applied(flat, AugOp::equalize, 0), flat.px);
}

TEST(AutoAugmentOps, TranslateShiftsAndFillsBlack) {
  const Pixels in(10, 6);
  Pixels right = in, down = in;
  right.px = applied(in, AugOp::translate_x, 3.7);  // whole pixels: int(3.7) = 3
  down.px = applied(in, AugOp::translate_y, -2);
  Pixels src = in;
  for (int y = 0; y < 6; ++y)
    for (int x = 0; x < 10; ++x)
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(right.at(x, y, c), x >= 3 ? src.at(x - 3, y, c) : 0) << x << "," << y;
        EXPECT_EQ(down.at(x, y, c), y < 4 ? src.at(x, y + 2, c) : 0) << x << "," << y;
      }
}

TEST(AutoAugmentOps, ColourOpsWeighTheChannelsByTheirOrder) {
  // The same image as RGB and as BGR gives the same result, channel-swapped.
  const Pixels rgb(13, 11);
  Pixels bgr = rgb;
  for (size_t i = 0; i < bgr.px.size(); i += 3) std::swap(bgr.px[i], bgr.px[i + 2]);
  for (AugOp op : {AugOp::color, AugOp::contrast, AugOp::sharpness}) {
    for (double m : {-0.8, 0.45}) {
      auto a = applied(rgb, op, m, 0), b = applied(bgr, op, m, 2);
      for (size_t i = 0; i < b.size(); i += 3) std::swap(b[i], b[i + 2]);
      EXPECT_EQ(a, b) << aug_op_name(op) << " " << m;
      EXPECT_NE(a, rgb.px) << aug_op_name(op) << " " << m;
    }
  }
  // Colour at factor 0 is grey: 0.2989 r + 0.587 g + 0.114 b, truncated, in every channel.
  Pixels in(3, 1);
  in.px = {255, 0, 0, 0, 255, 0, 10, 20, 30};
  const auto g = applied(in, AugOp::color, -1.0);
  const uint8_t want[3] = {76, 149, 18};  // 76.22, 149.69, 2.989 + 11.74 + 3.42
  for (int p = 0; p < 3; ++p)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(g[p * 3 + c], want[p]) << p;
}

TEST(AutoAugmentOps, RowStrideIsHonoured) {
  // A 4x3 image inside rows of 20 bytes: the bytes between rows stay as they were.
  std::vector<uint8_t> buf(20 * 3);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i);
  const std::vector<uint8_t> before = buf;
  std::vector<uint8_t> scratch;
  for (AugOp op : {AugOp::rotate, AugOp::invert, AugOp::sharpness, AugOp::equalize})
    apply_aug_step({op, 0.5}, Image8{buf.data(), 4, 3, 20, 0}, scratch);
  for (int y = 0; y < 3; ++y)
    for (int b = 12; b < 20; ++b) EXPECT_EQ(buf[y * 20 + b], before[y * 20 + b]) << y << " " << b;
  EXPECT_NE(buf, before);
}

TEST(AutoAugmentPolicy, Draws) {
  AutoAugmentSpec s;
  AugStep steps[kMaxAugSteps];
  Rng rng(1);
  EXPECT_EQ(draw_aug_steps(s, 224, 224, rng, steps), 0);  // none
  s.policy = AutoAugment::randaugment;
  s.ops = 3;
  s.magnitude = 30;  // the largest bin: every range's end
  int seen[16] = {};
  for (int i = 0; i < 2000; ++i) {
    Rng r(7, 0, i, Stream::augment), again(7, 0, i, Stream::augment);
    AugStep twice[kMaxAugSteps];
    ASSERT_EQ(draw_aug_steps(s, 224, 224, r, steps), 3);
    ASSERT_EQ(draw_aug_steps(s, 224, 224, again, twice), 3);
    for (int j = 0; j < 3; ++j) {
      ++seen[static_cast<int>(steps[j].op)];
      EXPECT_EQ(steps[j].op, twice[j].op);
      EXPECT_EQ(steps[j].magnitude, twice[j].magnitude);
      const double m = std::abs(steps[j].magnitude);
      switch (steps[j].op) {
        case AugOp::rotate: EXPECT_EQ(m, 30.0); break;
        case AugOp::translate_x: EXPECT_FLOAT_EQ(m, 150.0 / 331.0 * 224); break;
        case AugOp::posterize: EXPECT_EQ(m, 4); break;
        case AugOp::solarize: EXPECT_EQ(m, 0); break;
        case AugOp::brightness: EXPECT_FLOAT_EQ(m, 0.9); break;
        default: break;
      }
    }
  }
  for (int op = 0; op < 14; ++op) EXPECT_GT(seen[op], 300) << aug_op_name(static_cast<AugOp>(op));
  EXPECT_EQ(seen[static_cast<int>(AugOp::invert)], 0);  // not in RandAugment's list
  s.policy = AutoAugment::trivialaugment;
  EXPECT_EQ(draw_aug_steps(s, 224, 224, rng, steps), 1);
  s.policy = AutoAugment::autoaugment;
  int applied_steps = 0;
  for (int i = 0; i < 1000; ++i) applied_steps += draw_aug_steps(s, 224, 224, rng, steps);
  EXPECT_GT(applied_steps, 1000);  // 2 ops, each applied with probability 0.62 on average
  EXPECT_LT(applied_steps, 1500);
}

// RandAugment's magnitude noise (timm's magnitude_std): none draws nothing from the stream (so
// torchvision's draws are untouched); otherwise the bins scatter around the magnitude with the
// given spread, whole, within [0, 30], piling up at an edge; and they reach the ops.
TEST(AutoAugmentPolicy, MagnitudeNoise) {
  AutoAugmentSpec s;
  s.policy = AutoAugment::randaugment;
  s.magnitude = 12;
  Rng a(3), b(3);
  EXPECT_EQ(randaugment_bin(s, a), 12);
  EXPECT_EQ(a.next_u64(), b.next_u64()) << "magnitude_std 0 must draw nothing";
  s.magnitude_std = 1.5;
  const int n = 20000;
  double sum = 0, sq = 0;
  int off = 0;
  for (int i = 0; i < n; ++i) {
    const int bin = randaugment_bin(s, a);
    sum += bin;
    sq += double(bin - 12) * (bin - 12);
    off += bin != 12;
  }
  EXPECT_NEAR(sum / n, 12.0, 0.05);
  // Rounding adds 1/12 of a bin's variance: sqrt(1.5^2 + 1/12) = 1.528.
  EXPECT_NEAR(std::sqrt(sq / n), 1.528, 0.03);
  EXPECT_GT(off, n / 2);
  s.magnitude = 30;
  int top = 0;
  for (int i = 0; i < n; ++i) {
    const int bin = randaugment_bin(s, a);
    ASSERT_GE(bin, 0);
    ASSERT_LE(bin, 30);
    top += bin == 30;
  }
  EXPECT_NEAR(double(top) / n, 0.63, 0.02);  // P(z > -0.5 / 1.5) = 0.6306: the upper side clamped
  // Through the policy: rotations of 30 x bin / 30 degrees for several bins around 30.
  AugStep steps[kMaxAugSteps];
  int seen[31] = {};
  for (int i = 0; i < 3000; ++i) {
    Rng r(9, 0, i, Stream::augment);
    const int k = draw_aug_steps(s, 224, 224, r, steps);
    for (int j = 0; j < k; ++j)
      if (steps[j].op == AugOp::rotate) ++seen[std::lround(std::abs(steps[j].magnitude))];
  }
  EXPECT_GT(seen[30], 0);
  EXPECT_GT(seen[29], 0);
  EXPECT_GT(seen[28], 0);
}

TEST(AutoAugmentPolicy, NamesAndChecks) {
  for (auto a : {AutoAugment::none, AutoAugment::autoaugment, AutoAugment::randaugment,
                 AutoAugment::trivialaugment, AutoAugment::autoaugment_cifar10, AutoAugment::autoaugment_svhn})
    EXPECT_EQ(auto_augment_from_string(auto_augment_name(a)), a);
  EXPECT_NE(error_of([] { auto_augment_from_string("augmix"); }).find("'augmix' is not an augmentation policy"),
            std::string::npos);
  AutoAugmentSpec s;
  s.ops = 0;
  EXPECT_NE(error_of([&] { auto_augment_validate(s); }).find("ops per image must be in [1, 16], not 0"),
            std::string::npos);
  s.ops = 2;
  s.magnitude = 31;
  EXPECT_NE(error_of([&] { auto_augment_validate(s); }).find("magnitude must be a bin in [0, 30], not 31"),
            std::string::npos);
  s.magnitude = 9;
  s.magnitude_std = -1;
  EXPECT_NE(error_of([&] { auto_augment_validate(s); }).find("magnitude_std must be in [0, 31] bins, not -1"),
            std::string::npos);
}

TEST(AutoAugmentDecode, AfterTheCropTrainingOnlyBothLayouts) {
  const std::vector<uint8_t> png = pattern_png(160, 120);
  const float mean[3] = {0, 0, 0}, std[3] = {1.0f / 255, 1.0f / 255, 1.0f / 255};
  const int s = 32;
  DecodeScratch scratch;
  auto run = [&](bool train, AutoAugment policy, uint64_t seed, std::vector<float>* f = nullptr) {
    AugmentSpec spec = make_augment_spec(s, train, 0.08f, 1.0f, true, mean, std);
    spec.auto_augment.policy = policy;
    return decode(png, spec, seed, scratch, f);
  };
  int changed = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<float> chw;
    const auto plain = run(true, AutoAugment::none, seed);
    const auto aug = run(true, AutoAugment::randaugment, seed, &chw);
    EXPECT_EQ(aug, run(true, AutoAugment::randaugment, seed));  // a function of the seed
    changed += aug != plain;
    // The float layout holds the same augmented pixels (planar, in pixel units here).
    for (int i = 0; i < s * s; ++i)
      for (int c = 0; c < 3; ++c) ASSERT_NEAR(chw[c * s * s + i], aug[i * 3 + c], 1e-3) << seed;
    // Evaluation is never augmented.
    EXPECT_EQ(run(false, AutoAugment::randaugment, seed), run(false, AutoAugment::none, seed));
  }
  EXPECT_GE(changed, 15);  // identity twice, or ops that change nothing here, are rare
  // The draws come after the crop and flip: identity-only draws give the plain image.
  // (RandAugment's first op is identity with probability 1/14; find such a seed and check it.)
  for (uint64_t seed = 0; seed < 200; ++seed) {
    AugmentSpec spec = make_augment_spec(s, true, 0.08f, 1.0f, true, mean, std);
    Rng probe(seed);
    random_resized_crop(160, 120, 0.08f, 1.0f, probe);
    probe.next_u64();  // the flip
    AutoAugmentSpec one;
    one.policy = AutoAugment::randaugment;
    one.ops = 1;
    AugStep st[kMaxAugSteps];
    draw_aug_steps(one, s, s, probe, st);
    if (st[0].op != AugOp::identity) continue;
    spec.auto_augment = one;
    const auto a = decode(png, spec, seed, scratch);
    spec.auto_augment.policy = AutoAugment::none;
    EXPECT_EQ(a, decode(png, spec, seed, scratch)) << seed;
    return;
  }
  FAIL() << "no seed drew identity";
}

TEST(RandomErasing, BoxesAsTorchvisionDrawsThem) {
  int empty = 0;
  double area_sum = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    Rng rng(3, 0, i, Stream::augment);
    const Box b = random_erasing_box(224, 160, rng);
    if (b.w * b.h == 0) {
      ++empty;
      continue;
    }
    ASSERT_TRUE(b.x >= 0 && b.y >= 0 && b.w < 224 && b.h < 160 && b.x + b.w <= 224 && b.y + b.h <= 160);
    const double share = double(b.w) * b.h / (224.0 * 160.0), ratio = double(b.h) / b.w;
    EXPECT_GT(share, 0.015);  // 0.02 to 0.33 before rounding the sides
    EXPECT_LT(share, 0.35);
    EXPECT_GT(ratio, 0.27);
    EXPECT_LT(ratio, 3.7);
    area_sum += share;
  }
  EXPECT_LT(empty, n / 100);  // a few tall or wide draws fail all 10 attempts
  // Later attempts favour smaller boxes a little; the mean stays near (0.02 + 0.33) / 2.
  EXPECT_NEAR(area_sum / (n - empty), 0.175, 0.02);
  Rng rng(1);
  EXPECT_EQ(random_erasing_box(1, 1, rng).w * random_erasing_box(1, 1, rng).h, 0);  // never the whole image
}

TEST(RandomErasing, DecodeErasesABoxWithTheMeanColourAfterThePolicy) {
  const std::vector<uint8_t> png = pattern_png(120, 90);
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  const int s = 48;
  DecodeScratch scratch;
  auto run = [&](float p, AutoAugment policy, uint64_t seed, std::vector<float>* chw = nullptr) {
    AugmentSpec spec = make_augment_spec(s, true, 0.08f, 1.0f, true, mean, std);
    spec.random_erasing = p;
    spec.auto_augment.policy = policy;
    return decode(png, spec, seed, scratch, chw);
  };
  const AugmentSpec spec = make_augment_spec(s, true, 0.08f, 1.0f, true, mean, std);
  EXPECT_EQ(spec.erase_rgb[0], 124);  // 0.485 * 255 = 123.7
  EXPECT_EQ(spec.erase_rgb[1], 116);
  EXPECT_EQ(spec.erase_rgb[2], 104);
  int erased_images = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    for (AutoAugment policy : {AutoAugment::none, AutoAugment::trivialaugment}) {
      std::vector<float> chw;
      const auto plain = run(0, policy, seed), erased = run(1, policy, seed, &chw);
      EXPECT_EQ(run(0.5f, policy, seed), run(0.5f, policy, seed));
      // The pixels that differ form one box of the mean colour; the rest is the plain image.
      int x0 = s, y0 = s, x1 = -1, y1 = -1, differ = 0;
      for (int y = 0; y < s; ++y)
        for (int x = 0; x < s; ++x) {
          const uint8_t* e = &erased[(y * s + x) * 3];
          if (std::equal(e, e + 3, &plain[(y * s + x) * 3])) continue;
          ++differ;
          EXPECT_TRUE(e[0] == 124 && e[1] == 116 && e[2] == 104) << seed << " " << x << "," << y;
          x0 = std::min(x0, x), y0 = std::min(y0, y), x1 = std::max(x1, x), y1 = std::max(y1, y);
        }
      if (differ) {
        ++erased_images;
        EXPECT_LE(differ, (x1 - x0 + 1) * (y1 - y0 + 1));
        EXPECT_LT((x1 - x0 + 1) * (y1 - y0 + 1), s * s / 2);
      }
      // The float layout carries the same bytes, normalized.
      for (int i = 0; i < s * s; ++i)
        for (int c = 0; c < 3; ++c) ASSERT_EQ(chw[c * s * s + i], spec.norm.v[c][erased[i * 3 + c]]) << seed;
    }
  }
  EXPECT_GE(erased_images, 50);  // of 60: boxes whose pixels already had the mean colour are rare
}

}  // namespace
}  // namespace rt::data

// The policies: which ops with which magnitudes, drawn as torchvision's AutoAugment (ImageNet
// policy), RandAugment and TrivialAugmentWide draw them. The pixel ops are in autoaugment_ops.cc.
#include <algorithm>
#include <cmath>

#include "data/autoaugment.h"
#include "nn/error.h"

namespace rt::data {
namespace {

constexpr const char* kPolicyNames[] = {"none",           "autoaugment",         "randaugment",
                                        "trivialaugment", "autoaugment_cifar10", "autoaugment_svhn"};
constexpr int kPolicies = 6;
constexpr const char* kOpNames[] = {"identity", "shear_x",  "shear_y",   "translate_x", "translate_y",
                                    "rotate",   "brightness", "color",   "contrast",    "sharpness",
                                    "posterize", "solarize", "autocontrast", "equalize", "invert"};

// RandAugment's and TrivialAugmentWide's op list: the enum's first 14.
constexpr int kRandOps = 14;

bool is_signed(AugOp op) { return op >= AugOp::shear_x && op <= AugOp::sharpness; }
bool has_magnitude(AugOp op) { return op >= AugOp::shear_x && op <= AugOp::solarize; }

// torch.linspace(start, end, steps)[i] in float32, as the float nearest the exact value: torch's
// own last bit depends on its SIMD width (it steps from a vector's first lane), so no one float
// sequence is torchvision's on every machine.
float linspace_f32(float start, float end, int steps, int i) {
  if (steps == 1) return start;
  const double s = start, e = end;
  return static_cast<float>(s + (e - s) * i / (steps - 1));
}

// AutoAugment's policies (Cubuk et al. 2019, as torchvision lists them): 25 pairs of
// (op, probability, magnitude bin of 10; -1 for none) each, for ImageNet, CIFAR-10 and SVHN.
struct PolicyOp {
  AugOp op;
  float p;
  int bin;
};
using A = AugOp;
constexpr PolicyOp kImageNetPolicy[25][2] = {
    {{A::posterize, 0.4f, 8}, {A::rotate, 0.6f, 9}},
    {{A::solarize, 0.6f, 5}, {A::autocontrast, 0.6f, -1}},
    {{A::equalize, 0.8f, -1}, {A::equalize, 0.6f, -1}},
    {{A::posterize, 0.6f, 7}, {A::posterize, 0.6f, 6}},
    {{A::equalize, 0.4f, -1}, {A::solarize, 0.2f, 4}},
    {{A::equalize, 0.4f, -1}, {A::rotate, 0.8f, 8}},
    {{A::solarize, 0.6f, 3}, {A::equalize, 0.6f, -1}},
    {{A::posterize, 0.8f, 5}, {A::equalize, 1.0f, -1}},
    {{A::rotate, 0.2f, 3}, {A::solarize, 0.6f, 8}},
    {{A::equalize, 0.6f, -1}, {A::posterize, 0.4f, 6}},
    {{A::rotate, 0.8f, 8}, {A::color, 0.4f, 0}},
    {{A::rotate, 0.4f, 9}, {A::equalize, 0.6f, -1}},
    {{A::equalize, 0.0f, -1}, {A::equalize, 0.8f, -1}},
    {{A::invert, 0.6f, -1}, {A::equalize, 1.0f, -1}},
    {{A::color, 0.6f, 4}, {A::contrast, 1.0f, 8}},
    {{A::rotate, 0.8f, 8}, {A::color, 1.0f, 2}},
    {{A::color, 0.8f, 8}, {A::solarize, 0.8f, 7}},
    {{A::sharpness, 0.4f, 7}, {A::invert, 0.6f, -1}},
    {{A::shear_x, 0.6f, 5}, {A::equalize, 1.0f, -1}},
    {{A::color, 0.4f, 0}, {A::equalize, 0.6f, -1}},
    {{A::equalize, 0.4f, -1}, {A::solarize, 0.2f, 4}},
    {{A::solarize, 0.6f, 5}, {A::autocontrast, 0.6f, -1}},
    {{A::invert, 0.6f, -1}, {A::equalize, 1.0f, -1}},
    {{A::color, 0.6f, 4}, {A::contrast, 1.0f, 8}},
    {{A::equalize, 0.8f, -1}, {A::equalize, 0.6f, -1}},
};
constexpr PolicyOp kCifar10Policy[25][2] = {
    {{A::invert, 0.1f, -1}, {A::contrast, 0.2f, 6}},
    {{A::rotate, 0.7f, 2}, {A::translate_x, 0.3f, 9}},
    {{A::sharpness, 0.8f, 1}, {A::sharpness, 0.9f, 3}},
    {{A::shear_y, 0.5f, 8}, {A::translate_y, 0.7f, 9}},
    {{A::autocontrast, 0.5f, -1}, {A::equalize, 0.9f, -1}},
    {{A::shear_y, 0.2f, 7}, {A::posterize, 0.3f, 7}},
    {{A::color, 0.4f, 3}, {A::brightness, 0.6f, 7}},
    {{A::sharpness, 0.3f, 9}, {A::brightness, 0.7f, 9}},
    {{A::equalize, 0.6f, -1}, {A::equalize, 0.5f, -1}},
    {{A::contrast, 0.6f, 7}, {A::sharpness, 0.6f, 5}},
    {{A::color, 0.7f, 7}, {A::translate_x, 0.5f, 8}},
    {{A::equalize, 0.3f, -1}, {A::autocontrast, 0.4f, -1}},
    {{A::translate_y, 0.4f, 3}, {A::sharpness, 0.2f, 6}},
    {{A::brightness, 0.9f, 6}, {A::color, 0.2f, 8}},
    {{A::solarize, 0.5f, 2}, {A::invert, 0.0f, -1}},
    {{A::equalize, 0.2f, -1}, {A::autocontrast, 0.6f, -1}},
    {{A::equalize, 0.2f, -1}, {A::equalize, 0.6f, -1}},
    {{A::color, 0.9f, 9}, {A::equalize, 0.6f, -1}},
    {{A::autocontrast, 0.8f, -1}, {A::solarize, 0.2f, 8}},
    {{A::brightness, 0.1f, 3}, {A::color, 0.7f, 0}},
    {{A::solarize, 0.4f, 5}, {A::autocontrast, 0.9f, -1}},
    {{A::translate_y, 0.9f, 9}, {A::translate_y, 0.7f, 9}},
    {{A::autocontrast, 0.9f, -1}, {A::solarize, 0.8f, 3}},
    {{A::equalize, 0.8f, -1}, {A::invert, 0.1f, -1}},
    {{A::translate_y, 0.7f, 9}, {A::autocontrast, 0.9f, -1}},
};
constexpr PolicyOp kSvhnPolicy[25][2] = {
    {{A::shear_x, 0.9f, 4}, {A::invert, 0.2f, -1}},
    {{A::shear_y, 0.9f, 8}, {A::invert, 0.7f, -1}},
    {{A::equalize, 0.6f, -1}, {A::solarize, 0.6f, 6}},
    {{A::invert, 0.9f, -1}, {A::equalize, 0.6f, -1}},
    {{A::equalize, 0.6f, -1}, {A::rotate, 0.9f, 3}},
    {{A::shear_x, 0.9f, 4}, {A::autocontrast, 0.8f, -1}},
    {{A::shear_y, 0.9f, 8}, {A::invert, 0.4f, -1}},
    {{A::shear_y, 0.9f, 5}, {A::solarize, 0.2f, 6}},
    {{A::invert, 0.9f, -1}, {A::autocontrast, 0.8f, -1}},
    {{A::equalize, 0.6f, -1}, {A::rotate, 0.9f, 3}},
    {{A::shear_x, 0.9f, 4}, {A::solarize, 0.3f, 3}},
    {{A::shear_y, 0.8f, 8}, {A::invert, 0.7f, -1}},
    {{A::equalize, 0.9f, -1}, {A::translate_y, 0.6f, 6}},
    {{A::invert, 0.9f, -1}, {A::equalize, 0.6f, -1}},
    {{A::contrast, 0.3f, 3}, {A::rotate, 0.8f, 4}},
    {{A::invert, 0.8f, -1}, {A::translate_y, 0.0f, 2}},
    {{A::shear_y, 0.7f, 6}, {A::solarize, 0.4f, 8}},
    {{A::invert, 0.6f, -1}, {A::rotate, 0.8f, 4}},
    {{A::shear_y, 0.3f, 7}, {A::translate_x, 0.9f, 3}},
    {{A::shear_x, 0.1f, 6}, {A::invert, 0.6f, -1}},
    {{A::solarize, 0.7f, 2}, {A::translate_y, 0.6f, 7}},
    {{A::shear_y, 0.8f, 4}, {A::invert, 0.8f, -1}},
    {{A::shear_x, 0.7f, 9}, {A::translate_y, 0.8f, 3}},
    {{A::shear_y, 0.8f, 5}, {A::autocontrast, 0.7f, -1}},
    {{A::shear_x, 0.7f, 2}, {A::invert, 0.1f, -1}},
};
constexpr int kAutoAugmentBins = 10;

}  // namespace

const char* auto_augment_name(AutoAugment a) { return kPolicyNames[static_cast<int>(a)]; }

AutoAugment auto_augment_from_string(const std::string& s) {
  for (int i = 0; i < kPolicies; ++i)
    if (s == kPolicyNames[i]) return static_cast<AutoAugment>(i);
  throw Error(str_cat("'", s, "' is not an augmentation policy (none, autoaugment, randaugment, "
                      "trivialaugment, autoaugment_cifar10, autoaugment_svhn)"));
}

void auto_augment_validate(const AutoAugmentSpec& s) {
  if (s.ops < 1 || s.ops > kMaxAugSteps)
    throw Error(str_cat("RandAugment's ops per image must be in [1, ", kMaxAugSteps, "], not ", s.ops));
  if (s.magnitude < 0 || s.magnitude >= kAugBins)
    throw Error(str_cat("RandAugment's magnitude must be a bin in [0, ", kAugBins - 1, "], not ",
                        s.magnitude));
  if (!(s.magnitude_std >= 0 && s.magnitude_std <= kAugBins))
    throw Error(str_cat("RandAugment's magnitude_std must be in [0, ", kAugBins, "] bins, not ", s.magnitude_std));
}

const char* aug_op_name(AugOp op) { return kOpNames[static_cast<int>(op)]; }

double aug_magnitude(AutoAugment policy, AugOp op, int bin, int bins, int width, int height) {
  const bool wide = policy == AutoAugment::trivialaugment;
  const auto lin = [&](double end) {
    return static_cast<double>(linspace_f32(0.0f, static_cast<float>(end), bins, bin));
  };
  switch (op) {
    case AugOp::shear_x:
    case AugOp::shear_y: return lin(wide ? 0.99 : 0.3);
    case AugOp::translate_x: return lin(wide ? 32.0 : 150.0 / 331.0 * width);
    case AugOp::translate_y: return lin(wide ? 32.0 : 150.0 / 331.0 * height);
    case AugOp::rotate: return lin(wide ? 135.0 : 30.0);
    case AugOp::brightness:
    case AugOp::color:
    case AugOp::contrast:
    case AugOp::sharpness: return lin(wide ? 0.99 : 0.9);
    case AugOp::posterize: {
      // 8 - round(bin / ((bins - 1) / k)) bits, k = 6 (wide) or 4: at most 6 or 4 bits dropped.
      const float q = static_cast<float>(bin) / static_cast<float>((bins - 1) / (wide ? 6.0 : 4.0));
      return 8 - static_cast<int>(std::nearbyint(q));
    }
    case AugOp::solarize: return static_cast<double>(linspace_f32(255.0f, 0.0f, bins, bin));
    default: return 0;
  }
}

int randaugment_bin(const AutoAugmentSpec& s, Rng& rng) {
  if (s.magnitude_std <= 0) return s.magnitude;  // draws nothing: torchvision's stream unchanged
  const double u1 = rng.uniform(), u2 = rng.uniform();
  const double z = std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * M_PI * u2);
  const long bin = std::lround(double(s.magnitude) + s.magnitude_std * z);
  return static_cast<int>(std::clamp<long>(bin, 0, kAugBins - 1));
}

int draw_aug_steps(const AutoAugmentSpec& s, int width, int height, Rng& rng, AugStep* out) {
  switch (s.policy) {
    case AutoAugment::none: return 0;
    case AutoAugment::autoaugment:
    case AutoAugment::autoaugment_cifar10:
    case AutoAugment::autoaugment_svhn: {
      const auto& table = s.policy == AutoAugment::autoaugment ? kImageNetPolicy
                          : s.policy == AutoAugment::autoaugment_cifar10 ? kCifar10Policy : kSvhnPolicy;
      const PolicyOp* pair = table[rng.below(25)];
      int n = 0;
      for (int i = 0; i < 2; ++i) {
        const double u = rng.uniform();
        const bool negative = rng.next_u64() >> 63;
        const PolicyOp& p = pair[i];
        if (u > p.p) continue;  // torchvision applies the op where its draw is <= p
        double m = p.bin < 0 ? 0 : aug_magnitude(s.policy, p.op, p.bin, kAutoAugmentBins, width, height);
        if (is_signed(p.op) && negative) m = -m;
        out[n++] = {p.op, m};
      }
      return n;
    }
    case AutoAugment::randaugment:
    case AutoAugment::trivialaugment: {
      const bool rand = s.policy == AutoAugment::randaugment;
      const int n = rand ? s.ops : 1;
      for (int i = 0; i < n; ++i) {
        const auto op = static_cast<AugOp>(rng.below(kRandOps));
        double m = 0;
        if (has_magnitude(op)) {
          const int bin = rand ? randaugment_bin(s, rng) : static_cast<int>(rng.below(kAugBins));
          m = aug_magnitude(s.policy, op, bin, kAugBins, width, height);
        }
        if (is_signed(op) && (rng.next_u64() >> 63)) m = -m;
        out[i] = {op, m};
      }
      return n;
    }
  }
  return 0;
}

}  // namespace rt::data

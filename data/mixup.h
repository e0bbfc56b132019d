// Mixup (Zhang et al., "mixup: Beyond Empirical Risk Minimization", 2018) and CutMix (Yun et al.,
// "CutMix: Regularization Strategy to Train Strong Classifiers with Localizable Features", 2019)
// within a batch, as timm and NVIDIA's ResNet-50 recipes apply them: one draw per batch, sample i
// paired with sample n-1-i (the batch reversed; it is already shuffled, so this is a random
// pairing), the loss the same blend of the two labels' (rt::Targets).
#pragma once

#include <cstdint>

#include "data/loader.h"
#include "nn/ops.h"

namespace rt::data {

// One batch's draw. Mixup: every pixel blended, weight `mix` on the image's own. CutMix: the box
// [top, top + height) x [left, left + width) taken from the partner, `mix` the share of the
// image's own pixels left (1 - box area / image area).
struct MixDraw {
  bool cutmix = false;
  double mix = 1.0;
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// lam ~ Beta(alpha, alpha) for mixup (mixup_alpha > 0) or CutMix (cutmix_alpha > 0); with both,
// either at even odds per batch (timm's switch_prob 0.5). CutMix's box has sides
// size * sqrt(1 - lam), its centre uniform over the image, clipped at the edges (then `mix` is
// recomputed from the clipped area). A pure function of its arguments: a resumed run draws the
// same, and ranks (and the passes of an accumulated step) draw their own.
MixDraw draw_mix(double mixup_alpha, double cutmix_alpha, int64_t image_size, uint64_t seed, int64_t step,
                 int64_t pass, int rank);

// Applies d to b in place (images of image_size x image_size, in both pixel forms that are
// filled): mixup blends image i with image n-1-i in float (8-bit pixels rounded to the nearest,
// halves up); CutMix swaps the box between the two. b.mixed[i] becomes label n-1-i and b.mix
// d.mix. Normalizing is affine per channel, so blending normalized floats equals normalizing
// blended pixels up to that rounding. Throws rt::Error for a weight outside [0, 1], a box outside
// the image, or a batch already mixed.
void mix_batch(Batch& b, const MixDraw& d, int64_t image_size);

// What the loss compares b's logits with: its labels, or the blend of a mixed batch's two.
inline Targets targets(const Batch& b) {
  return b.mixed.empty() ? Targets(b.labels.data()) : Targets(b.labels.data(), b.mixed.data(), b.mix);
}

}  // namespace rt::data

// Mixup (Zhang et al., "mixup: Beyond Empirical Risk Minimization", 2018) within a batch, as
// timm and NVIDIA's ResNet-50 recipes apply it: one weight per batch, lam ~ Beta(alpha, alpha),
// and sample i blended with sample n-1-i (the batch reversed), the loss the same blend of the two
// labels' (rt::Targets). The batch is already shuffled, so its reversal is a random pairing.
#pragma once

#include <cstdint>

#include "data/loader.h"
#include "nn/ops.h"

namespace rt::data {

// lam ~ Beta(alpha, alpha) (alpha > 0), a pure function of its arguments: a resumed run draws the
// same weights, and ranks (and the passes of an accumulated step) draw their own.
double mixup_weight(double alpha, uint64_t seed, int64_t step, int64_t pass, int rank);

// Blends b in place: image i becomes mix * image i + (1 - mix) * image n-1-i, computed in float
// (8-bit pixels rounded to the nearest value, halves up); b.mixed[i] becomes
// label n-1-i and b.mix = mix. Both pixel forms (images or pixels) are blended, whichever is
// filled. Normalizing is affine per channel, so blending normalized floats equals normalizing
// blended pixels up to that rounding. Throws rt::Error for mix outside [0, 1] or a batch
// already mixed.
void mixup(Batch& b, double mix);

// What the loss compares b's logits with: its labels, or the blend of a mixed batch's two.
inline Targets targets(const Batch& b) {
  return b.mixed.empty() ? Targets(b.labels.data()) : Targets(b.labels.data(), b.mixed.data(), b.mix);
}

}  // namespace rt::data

// The fused normalization constants and their per-byte tables.
#include "nn/normalize.h"

namespace rt {

NormParams norm_params(const float mean[3], const float std[3]) {
  NormParams p;
  for (int c = 0; c < 3; ++c) {
    p.scale[c] = 1.0f / (255.0f * std[c]);
    p.shift[c] = -mean[c] / std[c];
  }
  return p;
}

NormTable norm_table(const NormParams& p) {
  NormTable t;
  for (int c = 0; c < 3; ++c)
    for (int b = 0; b < 256; ++b) t.v[c][b] = norm_value(static_cast<uint8_t>(b), p.scale[c], p.shift[c]);
  return t;
}

}  // namespace rt

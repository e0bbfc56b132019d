// Dynamic loss scaling bookkeeping (see loss_scale.h).
#include "nn/loss_scale.h"

#include <cmath>
#include <utility>

#include "nn/error.h"

namespace rt {

void loss_scale_validate(const LossScaleConfig& c) {
  if (c.mode != "none" && c.mode != "static" && c.mode != "dynamic")
    throw Error(str_cat("mode must be none, static or dynamic (got ", c.mode, ")"));
  auto pos = [](double v) { return std::isfinite(v) && v > 0; };
  if (!pos(c.init)) throw Error(str_cat("init must be finite and > 0 (got ", c.init, ")"));
  if (!(pos(c.growth_factor) && c.growth_factor >= 1))
    throw Error(str_cat("growth_factor must be >= 1 (got ", c.growth_factor, ")"));
  if (!(pos(c.backoff_factor) && c.backoff_factor < 1))
    throw Error(str_cat("backoff_factor must be in (0, 1) (got ", c.backoff_factor, ")"));
  if (c.growth_interval < 1) throw Error(str_cat("growth_interval must be >= 1 (got ", c.growth_interval, ")"));
  if (!pos(c.min) || c.min > c.init)
    throw Error(str_cat("min must be > 0 and <= init (got ", c.min, ", init ", c.init, ")"));
}

LossScaler::LossScaler(LossScaleConfig cfg) : cfg_(std::move(cfg)) {
  loss_scale_validate(cfg_);
  scale_ = enabled() ? cfg_.init : 1.0;
}

bool LossScaler::update(bool overflow) {
  if (!dynamic()) return true;
  if (overflow) {
    ++skipped_;
    good_ = 0;
    const double next = scale_ * cfg_.backoff_factor;
    if (next < cfg_.min)
      throw Error(str_cat("loss scale: gradients are still non-finite at scale ", scale_, " (", skipped_,
                          " step(s) skipped so far); backing off further would pass loss_scale.min = ",
                          cfg_.min, ": more likely non-finite values in the model than an overflow (else lower "
                          "loss_scale.min)"));
    scale_ = next;
    return false;
  }
  if (++good_ >= cfg_.growth_interval) {
    // No ceiling: a scale too large for the gradients overflows and backs off again.
    const double next = scale_ * cfg_.growth_factor;
    if (std::isfinite(next)) scale_ = next;
    good_ = 0;
  }
  return true;
}

void LossScaler::restore(double scale, int64_t good_steps) {
  // A static scale is the configuration's, always: a resume with a lower init after an overflow
  // must get it, not the file's.
  if (!dynamic()) return;
  if (std::isfinite(scale) && scale > 0) scale_ = scale;
  good_ = good_steps < 0 ? 0 : good_steps;
}

}  // namespace rt

// Loss scaling for reduced-precision training (Micikevicius et al. 2018, "Mixed Precision
// Training"): the loss gradient is multiplied by a scale S so that small gradients survive 16-bit
// storage, and the gradients are divided by S before the optimizer. Dynamic scaling, as
// PyTorch's GradScaler and NVIDIA's Apex do it, halves S and skips the update when a gradient
// overflowed, and doubles S after a run of good steps. Pure bookkeeping: the backend does the
// multiplications and the overflow check.
#pragma once
#include <cstdint>
#include <string>

namespace rt {

struct LossScaleConfig {              // key prefix: loss_scale.
  std::string mode = "none";          // none | static (always init) | dynamic
  double init = 65536;                // the first scale (2^16, GradScaler's default)
  double growth_factor = 2;           // dynamic: S *= this after growth_interval good steps
  double backoff_factor = 0.5;        // dynamic: S *= this when a gradient overflowed
  int64_t growth_interval = 2000;     // dynamic: good steps in a row before S grows
  double min = 1;                     // dynamic: falling below this is an error (gradients that
                                      //   stay non-finite are a bug, not an overflow)
};

// Throws rt::Error naming the field when a value is out of range or the mode is unknown.
// Powers of two are not required, but only they make scaling exact in binary floating point.
void loss_scale_validate(const LossScaleConfig& cfg);

class LossScaler {
 public:
  explicit LossScaler(LossScaleConfig cfg);

  bool enabled() const { return cfg_.mode != "none"; }
  bool dynamic() const { return cfg_.mode == "dynamic"; }
  // The factor for this step's loss gradient (1 when disabled).
  double scale() const { return scale_; }

  // After the gradients of a step were checked: returns true when the optimizer may apply them.
  // Dynamic: an overflow skips the step and backs the scale off (throws rt::Error when it would
  // fall below cfg.min); a good step counts towards growth. Static and none: always true (the
  // caller's finiteness check decides what a non-finite gradient means).
  bool update(bool overflow);

  int64_t good_steps() const { return good_; }    // good steps since the scale last changed
  int64_t skipped_steps() const { return skipped_; }  // overflows so far in this process
  // Resume: the scale and good-step count a checkpoint saved (scale <= 0: keep cfg.init).
  void restore(double scale, int64_t good_steps);

 private:
  LossScaleConfig cfg_;
  double scale_ = 1;
  int64_t good_ = 0, skipped_ = 0;
};

}  // namespace rt

// Learning-rate schedules: linear warm-up followed by constant, step, multistep, cosine or poly.
#pragma once
#include <string_view>
#include <vector>

namespace rt {

enum class ScheduleKind { constant, step, multistep, cosine, poly };

struct ScheduleConfig {
  double base_lr = 0.1;               // peak lr (reached at the end of warm-up)
  double warmup_epochs = 0;           // length of the linear warm-up; 0 = none
  double warmup_start_factor = 0;     // warm-up starts at base_lr·factor (Goyal et al. 2017)
  ScheduleKind kind = ScheduleKind::step;  // decay after warm-up
  double step_size = 30;              // step: multiply by gamma every step_size epochs
  std::vector<double> milestones = {30, 60, 80};  // multistep: absolute epochs, increasing
  double gamma = 0.1;                 // step/multistep decay factor
  double power = 2.0;                 // poly exponent
  double total_epochs = 90;           // cosine/poly reach final_lr here
  double final_lr = 0;                // cosine/poly floor
};

// Learning rate at a fractional epoch (step / steps_per_epoch, so warm-up rises per step):
//
//   lr(e) = warm(e) · decay(e)
//   warm(e)  = f + (1 − f)·e / W  for e < W, else 1      (W = warmup_epochs, f = start factor)
//   decay(e) = constant:  base_lr
//              step:      base_lr · gamma^⌊e / step_size⌋
//              multistep: base_lr · gamma^(number of milestones ≤ e)
//              cosine:    final_lr + (base_lr − final_lr) · (1 + cos(π·t)) / 2
//              poly:      final_lr + (base_lr − final_lr) · (1 − t)^power
//   with t = clamp((e − W) / (total_epochs − W), 0, 1)  (t = 1 for e ≥ W when W = total_epochs).
//
// Epochs are measured from the start of training: step and multistep boundaries are absolute
// epochs (Goyal et al.: warm-up 5, decay at 30, 60, 80), and a boundary is already decayed at the
// boundary itself (as PyTorch's StepLR/MultiStepLR). Cosine and poly decay over the epochs after
// warm-up, [W, total_epochs], and stay at final_lr beyond. final_lr applies to cosine/poly only.
// Throws rt::Error for an invalid config or a negative or non-finite epoch.
double lr_at(const ScheduleConfig& cfg, double epoch);

// Throws rt::Error naming the field when the config is invalid: negative or non-finite values,
// step_size/gamma/power/total_epochs not > 0, milestones negative or not strictly increasing,
// warmup_epochs > total_epochs, final_lr > base_lr for cosine/poly.
void schedule_validate(const ScheduleConfig& cfg);

// "constant", "step", "multistep", "cosine", "poly"; throws rt::Error naming the bad value and
// listing the valid ones.
ScheduleKind schedule_kind_from_string(std::string_view s);
const char* schedule_kind_name(ScheduleKind k);

}  // namespace rt

// Learning-rate schedules as pure functions of the fractional epoch.
#include "nn/schedule.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <string>

#include "nn/error.h"

namespace rt {

namespace {

constexpr std::array<ScheduleKind, 5> kKinds = {ScheduleKind::constant, ScheduleKind::step,
                                                ScheduleKind::multistep, ScheduleKind::cosine,
                                                ScheduleKind::poly};

void check_non_negative(const char* field, double v) {
  if (!(v >= 0) || !std::isfinite(v))
    throw Error(str_cat("schedule: ", field, " must be finite and >= 0, got ", v));
}

void check_positive(const char* field, double v) {
  if (!(v > 0) || !std::isfinite(v))
    throw Error(str_cat("schedule: ", field, " must be finite and > 0, got ", v));
}

// Fraction of the decay period [W, total] elapsed at epoch e, clamped to [0, 1].
double decay_progress(const ScheduleConfig& cfg, double e) {
  const double span = cfg.total_epochs - cfg.warmup_epochs;
  if (span <= 0) return e >= cfg.warmup_epochs ? 1.0 : 0.0;
  return std::clamp((e - cfg.warmup_epochs) / span, 0.0, 1.0);
}

}  // namespace

void schedule_validate(const ScheduleConfig& cfg) {
  check_non_negative("base_lr", cfg.base_lr);
  check_non_negative("warmup_epochs", cfg.warmup_epochs);
  check_non_negative("warmup_start_factor", cfg.warmup_start_factor);
  if (cfg.warmup_start_factor > 1)  // a warm-up that starts above its peak (torch's LinearLR refuses it too)
    throw Error(str_cat("schedule: warmup_start_factor must be in [0, 1], got ", cfg.warmup_start_factor));
  check_positive("total_epochs", cfg.total_epochs);
  check_non_negative("final_lr", cfg.final_lr);
  if (cfg.warmup_epochs > cfg.total_epochs)
    throw Error(str_cat("schedule: warmup_epochs (", cfg.warmup_epochs,
                        ") exceeds total_epochs (", cfg.total_epochs, ")"));
  switch (cfg.kind) {
    case ScheduleKind::constant:
      break;
    case ScheduleKind::step:
      check_positive("step_size", cfg.step_size);
      check_positive("gamma", cfg.gamma);
      break;
    case ScheduleKind::multistep:
      check_positive("gamma", cfg.gamma);
      for (size_t i = 0; i < cfg.milestones.size(); ++i) {
        check_non_negative("milestones", cfg.milestones[i]);
        if (i > 0 && !(cfg.milestones[i] > cfg.milestones[i - 1]))
          throw Error(str_cat("schedule: milestones must be strictly increasing, got ",
                              cfg.milestones[i - 1], " then ", cfg.milestones[i]));
      }
      break;
    case ScheduleKind::cosine:
    case ScheduleKind::poly:
      if (cfg.kind == ScheduleKind::poly) check_positive("power", cfg.power);
      if (cfg.final_lr > cfg.base_lr)
        throw Error(str_cat("schedule: final_lr (", cfg.final_lr, ") exceeds base_lr (",
                            cfg.base_lr, ")"));
      break;
  }
}

double lr_at(const ScheduleConfig& cfg, double epoch) {
  schedule_validate(cfg);
  if (!(epoch >= 0) || !std::isfinite(epoch))
    throw Error(str_cat("schedule: epoch must be finite and >= 0, got ", epoch));
  double lr = cfg.base_lr;
  switch (cfg.kind) {
    case ScheduleKind::constant:
      break;
    case ScheduleKind::step:
      lr *= std::pow(cfg.gamma, std::floor(epoch / cfg.step_size));
      break;
    case ScheduleKind::multistep: {
      // Milestones are sorted: count those already reached (upper_bound: reached at equality).
      auto passed = std::upper_bound(cfg.milestones.begin(), cfg.milestones.end(), epoch) -
                    cfg.milestones.begin();
      lr *= std::pow(cfg.gamma, double(passed));
      break;
    }
    case ScheduleKind::cosine: {
      const double t = decay_progress(cfg, epoch);
      lr = cfg.final_lr + (cfg.base_lr - cfg.final_lr) * 0.5 * (1 + std::cos(std::numbers::pi * t));
      break;
    }
    case ScheduleKind::poly: {
      const double t = decay_progress(cfg, epoch);
      lr = cfg.final_lr + (cfg.base_lr - cfg.final_lr) * std::pow(1 - t, cfg.power);
      break;
    }
  }
  if (epoch < cfg.warmup_epochs) {
    const double f = cfg.warmup_start_factor;
    lr *= f + (1 - f) * epoch / cfg.warmup_epochs;
  }
  return lr;
}

ScheduleKind schedule_kind_from_string(std::string_view s) {
  for (ScheduleKind k : kKinds)
    if (s == schedule_kind_name(k)) return k;
  std::string valid;
  for (ScheduleKind k : kKinds) {
    if (!valid.empty()) valid += ", ";
    valid += schedule_kind_name(k);
  }
  throw Error(str_cat("schedule: unknown kind '", s, "' (valid: ", valid, ")"));
}

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::constant: return "constant";
    case ScheduleKind::step: return "step";
    case ScheduleKind::multistep: return "multistep";
    case ScheduleKind::cosine: return "cosine";
    case ScheduleKind::poly: return "poly";
  }
  return "?";
}

}  // namespace rt

// The weights' exponential moving average (train.ema), as NVIDIA's and timm's ResNet recipes keep
// one: updated after every applied optimizer step (or every train.ema_every-th), evaluated beside
// the model, checkpointed and resumed exactly. The average lives in the arena's memory (on the
// GPU for the CUDA backends) and covers the parameters, which every rank holds equal, and this
// rank's BN statistics, which ranks keep apart while training and average for evaluation and
// checkpoints, as the model's own.
#include <algorithm>

#include "trainer/trainer.h"

namespace rt::trainer {

double ema_decay(double decay, bool warmup, int64_t updates) {
  // TensorFlow's ExponentialMovingAverage with num_updates: early averages would otherwise hold
  // the initialisation for ~1 / (1 - decay) steps.
  return warmup ? std::min(decay, (1.0 + double(updates)) / (10.0 + double(updates))) : decay;
}

void Trainer::ema_start() {
  auto& arena = net_->arena();
  if (!has_ema()) {
    ema_params_ = Buffer<float>(arena.memory());
    ema_params_.resize(arena.size());
    ema_state_ = Buffer<float>(arena.memory());
    ema_state_.resize(arena.state().size());
  }
  ema_params_.copy_from(arena.params().data(), arena.size());
  ema_state_.copy_from(arena.state().data(), arena.state().size());
}

void Trainer::ema_update() {
  // After every ema_every-th optimizer step (torchvision's recipe averages every 32 steps, a
  // 32nd of the passes over the weights); the n-th update (n = earlier updates) is the same on
  // every rank and restored with the optimizer's step count on a resume.
  const int64_t every = cfg_.train.ema_every, steps = opt_->steps();
  if (steps % every != 0) return;
  // train.ema_copy_epochs: torchvision's script sets the average's update count back to 0 after
  // each update in its warm-up epochs, so each of those updates, and the first after them, copies
  // the weights (the previous update taken as `every` steps back: none was skipped for overflow).
  if (const int64_t copy = cfg_.train.ema_copy_epochs; copy > 0) {
    const int64_t epoch = step_ / steps_per_epoch_;  // this step's (step_ counts the ones before it)
    const int64_t previous = std::max<int64_t>(step_ - every, 0) / steps_per_epoch_;
    if (epoch < copy || previous < copy) {
      ema_start();
      return;
    }
  }
  const double d = ema_decay(cfg_.train.ema, cfg_.train.ema_warmup, steps / every - 1);
  const float w = float(1.0 - d);
  auto& arena = net_->arena();
  net_->backend().ema_update(ema_params_.data(), arena.params().data(), arena.size(), w);
  net_->backend().ema_update(ema_state_.data(), arena.state().data(), arena.state().size(), w);
}

void Trainer::ema_to_host(std::vector<float>& params, std::vector<float>& state) const {
  params.resize(ema_params_.size());
  state.resize(ema_state_.size());
  ema_params_.to_host(params.data(), 0, params.size());
  ema_state_.to_host(state.data(), 0, state.size());
}

EvalResult Trainer::evaluate_ema() {
  if (!has_ema()) throw Error("evaluate_ema: no moving average of the weights (train.ema is 0)");
  // The averaged weights in the arena for one evaluation (which averages the ranks' statistics
  // itself), then the model's own back: through the host, once per evaluation.
  auto& arena = net_->arena();
  std::vector<float> params(arena.size()), state(arena.state().size());
  arena.params_to_host(params);
  arena.state_to_host(state);
  arena.params_from(ema_params_);
  arena.state_from(ema_state_);
  const EvalResult r = evaluate();
  arena.params_from_host(params);
  arena.state_from_host(state);
  return r;
}

void Trainer::ema_for_checkpoint(std::vector<float>& ema, std::vector<float>& rank_state) {
  // Collective. The file's "ema" holds the parameters and the ranks' average of the statistics;
  // "ema_bnr" each rank's own (as "state" and "bn_ranks" hold the model's).
  std::vector<float> params, own;
  ema_to_host(params, own);
  ema = std::move(params);
  const std::vector<float> avg = average_over_ranks(own);
  ema.insert(ema.end(), avg.begin(), avg.end());
  rank_state = gather_to_rank0(own);
}

void Trainer::ema_from_checkpoint(std::vector<float>& ema, std::vector<float>& rank_state, bool own_state) {
  // Collective: rank 0's `ema` (parameters, then averaged statistics) and, when own_state, each
  // rank's statistics out of rank_state.
  auto& arena = net_->arena();
  const size_t np = arena.size(), ns = arena.state().size();
  ema.resize(np + ns);
  ctl_comm_->broadcast(ema.data(), ema.size(), DType::f32, 0);
  if (!has_ema()) ema_start();  // allocates
  ema_params_.from_host(ema.data(), 0, np);
  ema_state_.from_host(ema.data() + np, 0, ns);
  if (own_state) {
    const std::vector<float> own = scatter_from_rank0(rank_state, ns);
    ema_state_.from_host(own.data(), 0, ns);
  }
}

}  // namespace rt::trainer

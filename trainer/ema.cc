// The weights' exponential moving average (train.ema), as NVIDIA's and timm's ResNet recipes keep
// one: updated after every applied optimizer step, evaluated beside the model, checkpointed and
// resumed exactly. The average lives in the arena's memory (on the GPU for the CUDA backends) and
// covers the parameters, which every rank holds equal, and this rank's BN statistics, which ranks
// keep apart while training and average for evaluation and checkpoints, as the model's own.
#include <algorithm>
#include <cstring>

#include "comm/mpi_check.h"
#include "trainer/trainer.h"

namespace rt::trainer {

double ema_decay(double decay, bool warmup, int64_t updates) {
  // TensorFlow's ExponentialMovingAverage with num_updates: early averages would otherwise hold
  // the initialisation for ~1 / (1 - decay) steps.
  return warmup ? std::min(decay, (1.0 + double(updates)) / (10.0 + double(updates))) : decay;
}

namespace {

// dst <- src, both `n` floats in the arena's memory (nullptr: the host).
void copy_in(const MemorySpace* m, float* dst, const float* src, size_t n) {
  if (n == 0) return;
  if (m) m->copy(dst, src, n * sizeof(float));
  else std::memcpy(dst, src, n * sizeof(float));
}

void to_host(const MemorySpace* m, float* dst, const float* src, size_t n) {
  if (n == 0) return;
  if (m) m->to_host(dst, src, n * sizeof(float));
  else std::memcpy(dst, src, n * sizeof(float));
}

void from_host(const MemorySpace* m, float* dst, const float* src, size_t n) {
  if (n == 0) return;
  if (m) m->from_host(dst, src, n * sizeof(float));
  else std::memcpy(dst, src, n * sizeof(float));
}

}  // namespace

void Trainer::ema_start() {
  auto& arena = net_->arena();
  if (!has_ema()) {
    ema_params_ = Buffer<float>(arena.memory());
    ema_params_.resize(arena.size());
    ema_state_ = Buffer<float>(arena.memory());
    ema_state_.resize(arena.state().size());
  }
  copy_in(arena.memory(), ema_params_.data(), arena.params().data(), arena.size());
  copy_in(arena.memory(), ema_state_.data(), arena.state().data(), arena.state().size());
}

void Trainer::ema_update() {
  // The n-th update (n = the optimizer's steps before this one): the same on every rank, and
  // restored with the optimizer on a resume.
  const double d = ema_decay(cfg_.train.ema, cfg_.train.ema_warmup, opt_->steps() - 1);
  const float w = float(1.0 - d);
  auto& arena = net_->arena();
  net_->backend().ema_update(ema_params_.data(), arena.params().data(), arena.size(), w);
  net_->backend().ema_update(ema_state_.data(), arena.state().data(), arena.state().size(), w);
}

void Trainer::ema_to_host(std::vector<float>& params, std::vector<float>& state) const {
  const MemorySpace* m = net_->arena().memory();
  params.resize(ema_params_.size());
  state.resize(ema_state_.size());
  to_host(m, params.data(), ema_params_.data(), params.size());
  to_host(m, state.data(), ema_state_.data(), state.size());
}

EvalResult Trainer::evaluate_ema() {
  if (!has_ema()) throw Error("evaluate_ema: no moving average of the weights (train.ema is 0)");
  // The averaged weights in the arena for one evaluation (which averages the ranks' statistics
  // itself), then the model's own back: through the host, once per evaluation.
  auto& arena = net_->arena();
  const MemorySpace* m = arena.memory();
  std::vector<float> params(arena.size()), state(arena.state().size());
  arena.params_to_host(params);
  arena.state_to_host(state);
  copy_in(m, arena.params().data(), ema_params_.data(), arena.size());
  copy_in(m, arena.state().data(), ema_state_.data(), arena.state().size());
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
  const MemorySpace* m = arena.memory();
  from_host(m, ema_params_.data(), ema.data(), np);
  from_host(m, ema_state_.data(), ema.data() + np, ns);
  if (own_state && ns > 0) {
    std::vector<float> own(ns);
    MPI_CHECK(MPI_Scatter(rank_state.data(), int(ns), MPI_FLOAT, own.data(), int(ns), MPI_FLOAT, 0,
                          ctl_comm_->mpi()));
    from_host(m, ema_state_.data(), own.data(), ns);
  }
}

}  // namespace rt::trainer

// One training step: the batch (prefetched during the last step where it can be), forward and
// backward over the step's passes with the gradient buckets handed to the reducer as backward
// finishes them, loss scaling and clipping, the optimizer, then the step's record (metrics,
// timeline, progress). Emulated compute stands in for forward and backward where asked.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>
#include <utility>

#include "comm/mpi_check.h"
#include "data/mixup.h"
#include "nn/clock.h"
#include "nn/console.h"
#include "trainer/trainer.h"

namespace rt::trainer {
namespace {

// dst = src, n floats of the arena's memory: in the backend's stream order where it has one.
void copy_arena(const Arena<float>& a, float* dst, const float* src, size_t n) {
  if (const MemorySpace* m = a.memory()) m->copy(dst, src, n * sizeof(float));
  else std::copy_n(src, n, dst);
}

}  // namespace

void Trainer::take_batch(data::Batch& b, int64_t step, int64_t pass) {
  if (!train_loader_->next(b))
    throw Error(str_cat("data: the training loader ended epoch ", step / steps_per_epoch_, " after ",
                        step % steps_per_epoch_, " of ", steps_per_epoch_, " batches"));
  if (b.n != cfg_.train.batch)
    throw Error(str_cat("data: a training batch of ", b.n, " images (expected ", cfg_.train.batch, ")"));
  if (const bool u8 = cfg_.data.output == data::Output::u8;
      (u8 ? b.pixels.size() : b.images.size()) != pad_images_.size())
    throw Error(str_cat("data: a training batch of ", u8 ? b.pixels.size() : b.images.size(),
                        u8 ? " pixel bytes" : " floats", " for data.output ", u8 ? "u8" : "float", " (expected ",
                        pad_images_.size(), ")"));
  // Here, before a prefetched batch is staged for the device: its bytes go there mixed.
  if (const auto& t = cfg_.train; t.mixup > 0 || t.cutmix > 0) {
    const int64_t size = cfg_.data.image_size;
    data::mix_batch(b, data::draw_mix(t.mixup, t.cutmix, size, cfg_.seed, step, pass, rank_), size);
  }
}

void Trainer::prefetch_next() {
  // Only the next step of this epoch and this run: past either, the loader would have to be
  // repositioned first (start_epoch), which drops a prefetched batch anyway.
  const int64_t next = step_ + 1;
  if (!prefetch_ || next >= total_steps_ || next % steps_per_epoch_ == 0) return;
  const double t = now_s();
  take_batch(next_batch_, next);
  next_wait_s_ = now_s() - t;
  prefetch_t0_ = t;
  const bool u8 = cfg_.data.output == data::Output::u8;
  net_->backend().stage_input(u8 ? static_cast<const void*>(next_batch_.pixels.data()) : next_batch_.images.data(),
                              u8 ? next_batch_.pixels.size() : next_batch_.images.size() * sizeof(float));
  has_next_ = true;
  prefetch_t1_ = now_s();
}

void Trainer::train_step() {
  const double t0 = now_s();
  const int64_t epoch = step_ / steps_per_epoch_;
  const bool prefetched = has_next_;
  if (prefetched) {  // taken during the last step, its bytes already on their way to the device
    std::swap(batch_, next_batch_);
    has_next_ = false;
  } else {
    take_batch(batch_, step_);
  }
  epoch_skipped_ += batch_.skipped;  // counted as trained: a prefetched batch a stop leaves is not
  const double t1 = now_s();
  const double data_wait = prefetched ? next_wait_s_ : t1 - t0;
  double t_fwd = t1;  // the (last pass's) forward's end, as the host saw it
  double pass_wait = 0, earlier_loss = 0;  // the later passes' data waits; the earlier passes' losses
  prefetch_t0_ = prefetch_t1_ = 0;
  inject_fault();
  reducer_->begin_step(step_ + 1);
  if (bn_sync_) bn_sync_->begin_step(step_ + 1);
  // Nothing below waits for a device until the reducer does: forward, the logits' copy and
  // backward are queued back to back, and the loss and logits are read once they are long done.
  const bool emulated = cfg_.emulate.compute_ms > 0;
  if (emulated) {
    emulate_step(t1);
  } else {
    net_->backend().mark_compute(0);
    // The step's gradient is the mean over its passes: each pass's loss gradient is divided by
    // their number, and each backward adds the sum of the earlier ones (grad_sum_).
    const double seed = scaler_.scale() / double(passes_);
    for (int64_t pass = 0; pass < passes_; ++pass) {
      if (pass > 0) {
        const double t = now_s();
        take_batch(batch_, step_, pass);
        epoch_skipped_ += batch_.skipped;
        pass_wait += now_s() - t;
      }
      // Stochastic depth's masks: this rank's, this step's and pass's, drawn again on a resume.
      net_->set_noise_key(data::hash_key(cfg_.seed, uint64_t(step_), (uint64_t(pass) << 32) | uint64_t(rank_),
                                         uint64_t(data::Stream::drop_path)));
      if (cfg_.data.output == data::Output::u8)
        net_->queue_forward_u8(batch_.pixels.data(), norm_, data::targets(batch_), true);
      else
        net_->queue_forward(batch_.images.data(), data::targets(batch_), true);
      const size_t n = size_t(batch_.n);
      // Before backward reuses the logits' memory.
      net_->export_tensor_queued(net_->logits(), logits_.data() + size_t(pass) * n * size_t(classes_));
      // Training accuracy counts a mixed image as of the class it holds more of.
      const bool partner = !batch_.mixed.empty() && batch_.mix < 0.5;
      std::copy_n((partner ? batch_.mixed : batch_.labels).data(), n, step_labels_.data() + size_t(pass) * n);
      t_fwd = now_s();
      const float* earlier = pass > 0 ? grad_sum_.data() : nullptr;
      if (pass + 1 == passes_) {
        net_->backward(ready_, seed, earlier);  // the step's buckets go to the reducer
      } else {
        net_->backward({}, seed, earlier);  // ends with a sync: the next pass may reuse batch_
        earlier_loss += net_->last_loss();
        copy_arena(net_->arena(), grad_sum_.data(), net_->arena().grads().data(), grad_sum_.size());
      }
    }
    net_->backend().mark_compute(1);
    prefetch_next();  // while the device still runs backward
  }
  if (bn_sync_) bn_sync_->end_step();
  const double t2 = now_s();
  reducer_->wait();
  const double t3 = now_s();
  const double lr = lr_at(schedule_, double(step_) / double(steps_per_epoch_));
  const double scale = scaler_.scale();
  const size_t bad_grads = unscale_gradients();
  // Long computed by now (the gradients behind it are reduced). Emulated steps have none; 0 keeps
  // the divergence check quiet.
  const double loss = emulated ? 0.0 : (earlier_loss + net_->last_loss()) / double(passes_);
  // The averaged gradients are bitwise equal on every rank, so bad_grads is the same everywhere;
  // the loss is this rank's own. With non-finite gradients, a non-finite loss on any rank (a
  // divergence to diagnose, not an overflow to skip) must send every rank the same way, as
  // check_finite gathers from all: the ranks agree on it first.
  int losses_finite = std::isfinite(loss);
  if (bad_grads > 0 && world_ > 1) {
    const CtlWatch w = watch_ctl({"step ", step_ + 1, "'s agreement on finite losses"});
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &losses_finite, 1, MPI_INT, MPI_LAND, ctl_comm_->mpi()));
  }
  const bool apply = losses_finite ? scaler_.update(bad_grads > 0) : true;
  double grad_norm = -1;
  bool clipped = false;
  if (apply) {
    check_finite(loss, lr, bad_grads);  // before the update: the parameters stay as the last good step left them
    zero_frozen_gradients();
    grad_norm = clip_gradients(clipped);
    epoch_clipped_ += clipped;
    opt_->step(net_->arena().params().data(), net_->arena().grads().data(), lr);
    if (has_ema()) ema_update();
  } else {
    skipped_.push_back(step_ + 1);
    // Overflowed gradients have no finite norm: the record says so (-1) rather than leaving it out.
    if (cfg_.train.clip_grad_norm > 0 || cfg_.log.grad_norm) grad_norm = std::numeric_limits<double>::infinity();
    log_line(str_cat("step ", step_ + 1, ": ", bad_grads, " gradient value(s) overflowed at loss scale ", scale,
                     ": update skipped, scale now ", scaler_.scale()));
  }
  // A device backend queued the update: the host may read the parameters after this (checks,
  // checkpoints, fault drills), and the step's time includes it.
  net_->backend().sync();
  const double t4 = now_s();
  if (!emulated) {  // the logits arrived with the sync
    double unused = 0;
    count_correct(logits_.data(), step_labels_.data(), int(batch_.n * passes_), classes_, epoch_top1_, epoch_top5_,
                  unused);
  }
  ++step_;
  losses_.push_back(loss);
  epoch_loss_ += loss * double(batch_.n * passes_);
  epoch_samples_ += batch_.n * passes_;

  StepRecord r;
  r.step = step_;
  r.epoch = epoch;
  r.epoch_step = (step_ - 1) % steps_per_epoch_ + 1;
  r.loss = loss;
  r.lr = lr;
  r.step_s = t4 - t0;
  r.compute_s = t2 - t1 - pass_wait;
  r.data_wait_s = data_wait + pass_wait;
  r.exposed_comm_s = reducer_->last_step().exposed_comm_s;
  // A device backend's host calls only queue the work: its own clock times forward + backward,
  // which began on an idle device at t1 (the last step ended with a sync); what the reducer took
  // past the end of both backward and the host's prefetch is the exposed communication.
  if (const double dev = emulated ? -1 : net_->backend().compute_seconds(); dev >= 0) {
    r.compute_s = dev;
    r.exposed_comm_s = std::max(0.0, t3 - std::max(t2, t1 + dev));
  }
  r.total_comm_s = reducer_->last_step().total_comm_s;
  r.optimizer_s = t4 - t3;
  r.bn_sync_s = bn_sync_ ? bn_sync_->seconds() : -1;
  r.global_images = int64_t(config_global_batch(cfg_, world_));
  r.loss_scale = scale;
  r.skipped = !apply;
  r.grad_norm = grad_norm;
  r.clipped = clipped;
  metrics_->step(rank_, r);  // (train() wrote the start record)
  if (timeline_ && !timeline_->closed() && step_ > timeline_first_) {
    timeline_step(*timeline_, step_, {t0, t1, t_fwd, t2, t3, t4, prefetch_t0_, prefetch_t1_, emulated}, *reducer_);
    if (!timeline_->error().empty()) {  // any rank's: each writes its own file
      stderr_line(str_cat("ringtrain: rank ", rank_, ": log.timeline: ", timeline_->error(),
                          "; the timeline stops here, training goes on"));
    } else if (step_ == timeline_end_) {
      timeline_->close();
      const std::string& pattern = cfg_.log.timeline;  // one file per rank where it says {rank}
      const std::string mine = config_rank_file(pattern, 0);
      log_line(str_cat("timeline of steps ", timeline_first_ + 1, "-", timeline_end_, " written to ", mine,
                       mine == pattern ? "" : str_cat(" and the other ranks' ", pattern)));
    }
  }
  progress_->step(r, epoch_samples_ ? 100.0 * double(epoch_top1_) / double(epoch_samples_) : 0.0);
}

void Trainer::emulate_step(double t0) {
  auto& arena = net_->arena();
  if (arena.host_accessible()) {
    emulate_compute(cfg_.emulate, t0, arena.grads(), emulate_points_, rank_, step_ + 1, ready_);
    return;
  }
  // Written on the host, each part uploaded before it is reported.
  size_t done = 0;
  emulate_compute(cfg_.emulate, t0, emulate_host_, emulate_points_, rank_, step_ + 1, [&](size_t end) {
    arena.grads_from_host(std::span<const float>(emulate_host_).subspan(done, end - done), done);
    done = end;
    if (ready_) ready_(end);
  });
}

}  // namespace rt::trainer

// Numerical faults and injected ones: the per-step check for non-finite gradients, the diagnosis
// that names the step, rank and layer where they arose, the replicas' checksum comparison that
// names diverged ranks, and the debug.* faults that prove the job's reactions (a poisoned
// parameter, a stalled, killed or failing rank).
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "comm/mpi_check.h"
#include "data/mixup.h"
#include "nn/console.h"
#include "trainer/stop_signal.h"
#include "trainer/trainer.h"

namespace rt::trainer {

size_t count_nonfinite(const float* v, size_t n) {
  // On the bits: all-ones exponent is Inf or NaN. Integer work the compiler vectorises.
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, v + i, 4);
    bad += (b & 0x7f800000u) == 0x7f800000u;
  }
  return bad;
}

namespace {

// The parameter debug.param names, or the first one registered (the stem convolution's weight):
// the arena lays parameters out in reverse registration order.
const ParamInfo& fault_param(const Arena<float>& a, const std::string& name) {
  const auto& layout = a.layout();
  if (name.empty()) return layout.back();
  for (const ParamInfo& p : layout)
    if (p.name == name) return p;
  throw ConfigError(str_cat("debug.param: the model has no parameter '", name, "' (e.g. '", layout.back().name,
                            "', '", layout.front().name, "')"));
}

// What one rank saw, for the collective diagnosis.
struct Finding {
  double loss = 0;
  int32_t node = -1;       // first node whose forward output is non-finite (-1: none; -2: the input)
  int32_t pad = 0;
  uint64_t bad_params = 0; // non-finite parameter values of that node
};

}  // namespace

void Trainer::inject_fault() {
  const DebugConfig& d = cfg_.debug;
  if (d.fault == "none" || d.fault == "stall_eval" || d.fault == "stop_eval" || rank_ != d.rank || step_ + 1 != d.step)
    return;
  stderr_line(str_cat("ringtrain: rank ", rank_, " of ", world_, ": debug: injecting fault '", d.fault, "' at step ", d.step));
  if (d.fault == "nan" || d.fault == "inf") {
    const ParamInfo& p = fault_param(net_->arena(), d.param);
    const float bad =
        d.fault == "nan" ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    net_->arena().params_from_host({&bad, 1}, p.offset);
  } else if (d.fault == "stall") {
    for (;;) ::pause();  // never reaches the allreduce; only a signal ends it
  } else if (d.fault == "freeze") {
    // The whole process stops (as SIGSTOP from outside, a debugger) just after announcing this
    // step's gradient allreduce: the others see it arrive, then never hear from it again.
    comm::StallWatch* w = reducer_->stall_watch();
    if (!w) throw ConfigError("debug.fault freeze: needs the stall check (comm.stall_warning_s or comm.stall_abort_s)");
    w->on_arrive([frozen = false](int64_t) mutable {
      if (!std::exchange(frozen, true)) ::raise(SIGSTOP);
    });
  } else if (d.fault == "kill") {
    ::raise(SIGKILL);
  } else if (d.fault == "throw") {
    throw Error(str_cat("debug: injected failure at step ", d.step));
  } else if (d.fault == "stop") {
    // A notice at a chosen step (an epoch's end, say): the run stops after it as after any.
    if (!stop_handlers_installed()) throw ConfigError("debug.fault stop: no stop handlers here (the trainer program installs them)");
    ::raise(SIGUSR1);
  }
}

void Trainer::inject_ctl_fault() {
  const DebugConfig& d = cfg_.debug;
  if (d.fault != "freeze_ctl" || rank_ != d.rank || step_ != d.step) return;
  stderr_line(str_cat("ringtrain: rank ", rank_, " of ", world_, ": debug: injecting fault 'freeze_ctl' at the end of step ", d.step));
  ::raise(SIGSTOP);  // inside the end-of-step agreement, announced: as a process stopped there
}

void Trainer::inject_eval_fault() {
  const DebugConfig& d = cfg_.debug;
  if ((d.fault != "stall_eval" && d.fault != "stop_eval") || rank_ != d.rank || step_ != d.step) return;
  stderr_line(str_cat("ringtrain: rank ", rank_, " of ", world_, ": debug: injecting fault '", d.fault,
                      "' in the evaluation after step ", d.step));
  if (d.fault == "stop_eval") {  // a notice while the evaluation runs: it stops there
    if (!stop_handlers_installed())
      throw ConfigError("debug.fault stop_eval: no stop handlers here (the trainer program installs them)");
    ::raise(SIGUSR1);
    return;
  }
  for (;;) ::pause();  // as a validation read that never returns
}

void Trainer::check_finite(double loss, double lr, size_t bad_grads) {
  if (bad_grads == 0) {
    if (std::isfinite(loss)) return;
    // Only this rank's loss: its gradients were finite (or not checked), so no other rank knows;
    // it stops the job.
    if (!cfg_.check.finite)
      throw Error(str_cat("training diverged: the loss is ", loss, " at step ", step_ + 1, " (lr ", lr,
                          "); the gradients were not checked (check.finite is off: turn it on for a diagnosis "
                          "naming the rank and layer)"));
    throw Error(str_cat("training diverged: the loss is ", loss, " at step ", step_ + 1, " (lr ", lr,
                        ") while the averaged gradients are finite; try a lower optimizer.lr or a longer warm-up"));
  }
  // The averaged gradients are identical on every rank, so every rank is here: diagnose together.
  Finding mine;
  mine.loss = loss;
  mine.node = cfg_.data.output == data::Output::u8
                  ? net_->first_nonfinite_node_u8(batch_.pixels.data(), norm_, data::targets(batch_))
                  : net_->first_nonfinite_node(batch_.images.data(), data::targets(batch_));
  if (mine.node >= 0) {  // (not the input: no parameters made it)
    HostView<float> p = net_->arena().host_params();
    for (int id : net_->node(size_t(mine.node)).params) {
      const ParamInfo& pi = net_->arena().info(id);
      mine.bad_params += count_nonfinite(p.data() + pi.offset, pi.count);
    }
  }
  std::vector<Finding> all(static_cast<size_t>(world_));
  {
    const CtlWatch w = watch_ctl({"the diagnosis of step ", step_ + 1, "'s non-finite values"});
    ctl_comm_->allgather_bytes(&mine, sizeof mine, all.data());
  }

  std::string where;
  for (int r = 0; r < world_; ++r) {
    const Finding& f = all[size_t(r)];
    if (f.node == -1 && std::isfinite(f.loss)) continue;
    where += str_cat(where.empty() ? "" : "; ", "rank ", r, ": loss ", f.loss);
    if (f.node == Net<float>::kNonFiniteInput) {
      where += str_cat(", the input itself is non-finite as backend ", cfg_.backend, " holds it (data.mean, set in ",
                       config_origin(cfg_, "data.mean"), ", and data.std, set in ", config_origin(cfg_, "data.std"),
                       ", normalise pixels beyond its range)");
    } else if (f.node >= 0) {
      where += str_cat(", first non-finite output in forward: ", net_->node(size_t(f.node)).name);
      if (f.bad_params) where += str_cat(" (whose parameters hold ", f.bad_params, " non-finite value(s))");
    }
  }
  if (where.empty()) {
    where = "every rank's forward pass and loss are finite: they arose in backward";
    // A static scale does not back off: the likeliest cause is the scale itself.
    if (scaler_.enabled() && !scaler_.dynamic())
      where += str_cat(" (with the loss multiplied by loss_scale.init ", scaler_.scale(),
                       ", static: backward's values may pass the element type's range, fp16's at 65504; lower "
                       "loss_scale.init, or loss_scale.mode dynamic skips such steps)");
  }
  HostView<float> g = net_->arena().host_grads();
  std::string first_grad;  // lowest offset = the first parameter backward finished
  for (const ParamInfo& pi : net_->arena().layout())
    if (count_nonfinite(g.data() + pi.offset, pi.count)) {
      first_grad = pi.name;
      break;
    }
  throw Error(str_cat("non-finite gradients at step ", step_ + 1, " (epoch ", epoch_of(step_ + 1), ", lr ",
                      lr, "): ", bad_grads, " of ", g.size(), " averaged gradient values; ", where,
                      "; first non-finite gradient in backward order: ", first_grad,
                      ". Stopped before the update", last_checkpoint_.empty() ? "" : "; the last checkpoint is ",
                      last_checkpoint_));
}

void Trainer::check_consistency() {
  HostView<float> p = net_->arena().host_params();
  const uint64_t mine = checkpoint_hash(p.data(), (p.size() * sizeof(float) / 8) * 8);
  std::vector<uint64_t> all(static_cast<size_t>(world_));
  {
    const CtlWatch w = watch_ctl({"the parameter check of step ", step_});
    ctl_comm_->allgather_bytes(&mine, sizeof mine, all.data());
  }
  std::string bad;
  for (int r = 1; r < world_; ++r)
    if (all[size_t(r)] != all[0]) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  if (!bad.empty())
    throw CommError(str_cat("parameters diverged at step ", step_, ": rank(s) ", bad,
                            " differ from rank 0 (checksums compared every ", cfg_.check.every, " steps)"));
}

}  // namespace rt::trainer

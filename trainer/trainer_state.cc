// The trainer's persistent state: saving checkpoints (rank 0 writes), loading them (rank 0 reads,
// every rank receives the state by broadcast), finding the one to resume from, and averaging the
// ranks' BN statistics before a checkpoint or evaluation.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "comm/agreement.h"
#include "comm/mpi_check.h"
#include "data/dataset.h"
#include "nn/clock.h"
#include "nn/console.h"
#include "trainer/trainer.h"

namespace rt::trainer {
namespace {

// The metadata every rank needs after a load, as one broadcastable block.
struct LoadedMeta {
  int64_t step = 0, optimizer_steps = 0;
  double loss_scale = 0;
  int64_t loss_scale_good = 0;
  int64_t own_state = 0;  // 1: each rank continues its own BN statistics from the file
  int64_t ema = 0;        // 1: the file holds a moving average of the weights, taken up
  int64_t own_ema = 0;    // 1: ... with each rank's own statistics' average
  double best_top1 = 0;   // the run's best validation top-1 so far and its step
  int64_t best_step = 0;
  int64_t moment2 = 0;    // 1: the file holds AdamW's or LAMB's second moment, taken up
  int64_t epoch = 0, epoch_steps = 0;  // where the writing run was: whole epochs, then steps
  int64_t eval_pending = 0;              // 1: its stop skipped this step's evaluation
};

}  // namespace

// For a refusal of another model's file: which of the model's keys differ ("" when none does, or
// the file is of this very model).
std::string Trainer::model_changes(const Checkpoint& ck) const {
  if (ck.meta.model == fingerprint_) return "";
  const std::string changes = config_model_changes(ck.config_yaml, cfg_);
  return changes.empty() ? "" : "; model keys that differ: " + changes;
}

void Trainer::check_checkpoint_classes(const Checkpoint& ck, const std::string& path, bool for_training) const {
  const data::Split split = for_training ? data::Split::train : data::Split::val;
  const data::Loader* loader = for_training ? train_loader_.get() : val_loader_.get();
  // Lists and synthetic data go by number, and so do their runs' files ("0", "1", ...).
  const bool named_here = !cfg_.data.synthetic && (for_training ? cfg_.data.train_list : cfg_.data.val_list).empty();
  bool by_number = true;
  for (size_t i = 0; i < ck.classes.size() && by_number; ++i) by_number = ck.classes[i] == std::to_string(i);
  if (!loader || !named_here || by_number) return;
  const std::vector<std::string>& here = loader->class_names();
  if (here == ck.classes) return;
  throw CheckpointError(str_cat(path, ": written for other classes than ", data::split_source(cfg_.data, split),
                                " names (", ck.classes.size(), " and ", here.size(), "; ",
                                data::first_class_difference(ck.classes, here, "in the file", "here"),
                                "): the same label would mean another class (",
                                for_training ? "resume" : "evaluate",
                                " on the classes it was trained on, or fine-tune from its weights: --weights)"));
}

void Trainer::report(const JsonLine& line, const std::string& text, bool notice) {
  metrics().write(line);
  if (notice) this->notice(text);
  else log_line(text);
}

Trainer::DirLock::~DirLock() {
  if (fd < 0) return;
  ::close(fd);
  // A job refused at start leaves no folder behind that it made (Metrics removes its file alike).
  if (made.empty()) return;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(file).parent_path();
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec))
    if (it->path().filename() != ".lock") return;
  if (ec) return;
  std::filesystem::remove(file, ec);
  remove_made_folders(dir.string(), made);
}

void Trainer::lock_run_dir() {
  if (rank_ != 0 || use_ != Use::train) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = cfg_.run_dir;
  const std::string made = first_missing_folder(cfg_.run_dir);
  fs::create_directories(dir, ec);
  const std::string path = (dir / ".lock").string();
  const int fd = ec ? -1 : ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;  // a folder that cannot be made or written: the metrics and checkpoints say so
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (::fcntl(fd, F_SETLK, &fl) != 0) {
    const int err = errno;
    char holder[256] = {};
    if (::pread(fd, holder, sizeof holder - 1, 0) < 0) holder[0] = 0;
    ::close(fd);
    if (err != EACCES && err != EAGAIN) return;  // no locks here (ENOLCK): unguarded
    // Two jobs in one folder would interleave their records and resume from, set aside and prune
    // each other's checkpoints.
    throw CheckpointError(str_cat(cfg_.run_dir, ": in use by another training job (", holder[0] ? holder : "holder unknown",
                                  "; ", path, "): give this one another run_dir (run_dir set in ",
                                  config_origin(cfg_, "run_dir"), "), or let the other end first"));
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = str_cat("pid ", ::getpid(), " on ", host);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) < 0) {
    // the lock holds all the same; only its holder's name is missing
  }
  run_lock_.fd = fd;
  run_lock_.file = path;
  run_lock_.made = made;
}

void Trainer::prepare_checkpoint_dir() {
  if (rank_ != 0) return;
  // Made and tried now: a folder that cannot take a file would otherwise be found out at the
  // first save, after the work it was to keep.
  const std::string key = cfg_.checkpoint.dir.empty() ? "run_dir" : "checkpoint.dir";
  const auto fail = [&](const std::string& what, const std::string& why) {
    return CheckpointError(str_cat(ckpt_dir_, ": ", what, " (", why, "; ", key, " set in ", config_origin(cfg_, key),
                                   ")"));
  };
  std::error_code ec;
  std::filesystem::create_directories(ckpt_dir_, ec);
  if (ec) throw fail("cannot create the checkpoint folder", ec.message());
  const std::string probe = ckpt_dir_ + "/.probe.tmp";  // a name pruning removes
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw fail("cannot write in the checkpoint folder", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  std::vector<std::string> moved;
  int64_t best_kept = -1;  // the step of the best.rtck left in place
  const std::string to = checkpoint_set_aside(ckpt_dir_, step_, &moved, &best_kept);
  if (!to.empty())
    notice(str_cat(moved.size(), " checkpoint file(s) written after step ", step_, ", where this run ",
                     step_ ? "resumes (another history's, or damaged files passed over)" : "starts (an earlier run's)",
                     ", moved to ",
                     to, ": --resume auto and pruning keep to this run's"));
  // This history's best (the resumed file's record) is best.rtck again where its checkpoint is
  // still here: best.rtck may have gone with the later files, never have been made, or be an
  // older best (keep_best turned on by this run); pruning would otherwise take the file.
  const std::string best = checkpoint_best_path(ckpt_dir_);
  if (cfg_.checkpoint.keep_best && best_step_ > 0 && best_kept != best_step_) {
    const std::string record = checkpoint_path(ckpt_dir_, best_step_);
    if (std::filesystem::exists(record, ec)) {
      checkpoint_keep_best(record);
      log_line(str_cat("best checkpoint: ", record, " (validation top-1 ", fixed(best_top1_, 2), "% at step ",
                       best_step_, ", this run's record), now ", best));
    } else {
      notice(str_cat("warning: the best checkpoint so far, of step ", best_step_, " (validation top-1 ",
                       fixed(best_top1_, 2), "%), is no longer in ", ckpt_dir_, ": ", best,
                       " will be the next evaluation to beat it"));
    }
  }
}

// AdamW's and LAMB's update count of each tensor: the file's, or, from a file written before it
// kept them, none for a tensor whose moments are all zero (frozen so far) and the optimizer's
// step count for the others.
std::vector<int64_t> Trainer::loaded_tensor_steps(const Checkpoint& ck, std::span<const float> m,
                                                  std::span<const float> v, const std::string& path) const {
  const std::vector<ParamInfo>& layout = net_->arena().layout();
  if (!ck.tensor_steps.empty()) {
    if (ck.tensor_steps.size() != layout.size())
      throw CheckpointError(str_cat(path, ": corrupt: section 'tsteps' holds ", ck.tensor_steps.size(),
                                    " counts for the model's ", layout.size(), " tensors"));
    return ck.tensor_steps;
  }
  std::vector<int64_t> out;
  for (const ParamInfo& p : layout) {
    const auto zero = [&](std::span<const float> x) {
      return std::all_of(x.begin() + p.offset, x.begin() + p.offset + p.count, [](float e) { return e == 0; });
    };
    out.push_back(zero(m) && zero(v) ? 0 : ck.meta.optimizer_steps);
  }
  return out;
}

void Trainer::save_checkpoint() {
  // Collective: the file keeps the ranks' average of the BN statistics (for evaluation, on any
  // rank count) and, where ranks have sets of their own, each rank's (for an exact resume).
  auto& arena = net_->arena();
  std::vector<float> own;
  const std::vector<float> state = averaged_bn_state(own);
  const std::vector<float> rank_state = gather_to_rank0(own);
  std::vector<float> ema, ema_rank_state;
  if (has_ema()) ema_for_checkpoint(ema, ema_rank_state);
  const std::string path = checkpoint_path(ckpt_dir_, step_);
  if (rank_ == 0) {
    const double t0 = now_s();
    CheckpointMeta m;
    m.step = step_;
    m.epoch = step_ / steps_per_epoch_;
    m.position = {step_ / steps_per_epoch_, step_ % steps_per_epoch_ * passes_};  // in batches, as the loader counts
    m.optimizer_steps = opt_->steps();
    m.world = world_;
    m.batch = cfg_.train.batch;
    m.accumulate = passes_;
    m.model = fingerprint_;
    m.seed = cfg_.seed;
    if (scaler_.enabled()) {
      m.loss_scale = scaler_.scale();
      m.loss_scale_good = scaler_.good_steps();
    }
    m.best_top1 = best_top1_;
    m.best_step = best_step_;
    m.eval_pending = eval_pending_;
    m.data_samples = train_loader_->size();
    m.data_repeats = cfg_.data.repeated_augment;
    m.data_order = train_loader_->order_hash();
    HostView<float> params = arena.host_params();
    try {
      checkpoint_write(path, m, config_yaml_, params.span(), state, opt_->momentum(), rank_state,
                       checkpoint_layout(arena), ema, ema_rank_state, opt_->second_moment(),
                       train_loader_->class_names(), opt_->tensor_steps());
    } catch (const CheckpointError& e) {
      // checkpoint_write removed its temporary file and touched no finished checkpoint.
      throw CheckpointError(str_cat(e.what(), "; training stopped at step ", step_, ", ",
                                    last_checkpoint_.empty() ? std::string("no earlier checkpoint of this run")
                                                             : "the last checkpoint, " + last_checkpoint_ + ", is kept",
                                    " (free space or fix checkpoint.dir, then --resume auto)"));
    }
    // best.rtck now names this file; the one it named before goes once pruning has also taken
    // its ckpt- name (until then the two names share it).
    if (best_due_) checkpoint_keep_best(path);
    checkpoint_prune(ckpt_dir_, cfg_.checkpoint.keep);
    const double secs = now_s() - t0;
    JsonLine line("checkpoint");
    line.add("step", step_).add("path", path).add("write_s", secs);
    if (best_due_) line.add("best", checkpoint_best_path(ckpt_dir_));
    report(line, str_cat("checkpoint ", path, " (", fixed(secs, 2), " s)",
                         best_due_ ? str_cat(", the best so far (validation top-1 ", fixed(best_top1_, 2), "%): ",
                                             checkpoint_best_path(ckpt_dir_))
                                   : ""));
  }
  best_due_ = false;
  last_checkpoint_ = path;
  last_save_s_ = now_s();
}

CheckpointParts Trainer::parts_to_load(bool for_training) {
  // An evaluation holds neither the optimizer's state nor each rank's statistics in memory.
  CheckpointParts keep;
  keep.optimizer = keep.rank_state = for_training;
  return keep;
}

void Trainer::load_checkpoint(const std::string& path, bool for_training) {
  Checkpoint ck;
  if (rank_ == 0) ck = checkpoint_read(path, parts_to_load(for_training));
  restore_checkpoint(std::move(ck), path, for_training);
}

void Trainer::restore_checkpoint(Checkpoint ck, const std::string& path, bool for_training) {
  auto& arena = net_->arena();
  LoadedMeta lm;
  // An evaluation neither reads nor restores the optimizer's state.
  std::vector<float> momentum(for_training ? opt_->size() : 0), rank_state, ema, ema_rank_state, moment2;
  std::vector<int64_t> tensor_steps;  // AdamW's and LAMB's per-tensor update counts
  // From the settings, not second_moment(), which a device optimizer copies out whole.
  const bool wants_moment2 = cfg_.optimizer.sgd.kind != OptimizerKind::sgd;
  if (rank_ == 0) {
    if (ck.weights_only)
      throw CheckpointError(str_cat(path, ": holds weights only, no training state (a file of tools/torch_weights.py "
                                    "import): ", for_training ? "start a new run from it with --weights PATH"
                                                              : "evaluate it with --eval --weights PATH"));
    checkpoint_check_model(ck, path, fingerprint_, cfg_.model.name, model_changes(ck));
    check_checkpoint_classes(ck, path, for_training);
    const auto& m = ck.meta;
    if (for_training) {
      // Another rank count is fine at the same global batch: global step s then takes the same
      // samples, in the same micro-batch order of the epoch's permutation, on any rank count
      // (data/sharding.h), and the schedule, which counts global steps, continues unchanged.
      auto shape = [](int64_t w, int64_t b, int64_t k) {
        return str_cat(w, " rank(s) x batch ", b, k > 1 ? str_cat(" x ", k, " accumulated") : "");
      };
      if (m.world * m.batch * m.accumulate != int64_t(world_) * cfg_.train.batch * passes_)
        throw CheckpointError(str_cat(path, ": written by ", shape(m.world, m.batch, m.accumulate), " = ",
                                      m.world * m.batch * m.accumulate, " images a step; this run has ",
                                      shape(world_, cfg_.train.batch, passes_), " = ",
                                      int64_t(world_) * cfg_.train.batch * passes_,
                                      " (resume with the same global batch: ranks x train.batch x train.accumulate; "
                                      "or start a new schedule from its weights: --weights)"));
      if (m.accumulate < 1 || m.position.step % m.accumulate != 0 ||
          m.position.epoch * steps_per_epoch_ + m.position.step / m.accumulate != m.step)
        throw CheckpointError(str_cat(path, ": written at step ", m.step, " = epoch ", m.position.epoch,
                                      " + ", m.position.step, " batches, which does not fit this run's ",
                                      steps_per_epoch_, " steps per epoch (did the dataset change?)"));
      // The seed draws each epoch's permutation and every augmentation: another one would
      // finish this epoch from another order, some samples twice and others never.
      if (m.seed != cfg_.seed)
        throw CheckpointError(str_cat(path, ": written by a run with seed ", m.seed, "; this run's seed is ",
                                      cfg_.seed, " (resume with --set seed=", m.seed,
                                      ", or start a new run from its weights: --weights)"));
      // Mid-epoch, the rest of the epoch is the rest of the permutation of the data it was
      // written on: other data (as many samples, but not the same, or repeated otherwise) would
      // draw some samples twice and others never, as another seed would.
      if (m.position.step > 0 && m.data_samples > 0) {
        std::string changes;
        const auto add = [&](const std::string& c) { changes += (changes.empty() ? "" : "; ") + c; };
        if (m.data_samples != train_loader_->size())
          add(str_cat(m.data_samples, " training samples in the file, ", train_loader_->size(), " here"));
        if (m.data_repeats != cfg_.data.repeated_augment)
          add(str_cat("data.repeated_augment ", m.data_repeats, " in the file, ", cfg_.data.repeated_augment, " here"));
        if (m.data_samples == train_loader_->size() && m.data_order != 0 && train_loader_->order_hash() != 0 &&
            m.data_order != train_loader_->order_hash())
          add("as many samples, with other labels or file names in sample order (another copy or order of the data)");
        if (!changes.empty())
          throw CheckpointError(str_cat(path, ": written in the middle of epoch ", m.position.epoch + 1, " (",
                                        m.position.step / std::max<int64_t>(1, m.accumulate), " of its ",
                                        steps_per_epoch_, " steps) on other training data (", changes,
                                        ", from ", data::split_source(cfg_.data, data::Split::train),
                                        "): the rest of the epoch would take some samples twice and others never "
                                        "(resume with the data it was written on, or from a checkpoint at the end "
                                        "of an epoch; or start a new run from its weights: --weights)"));
      }
      if (m.world != world_)
        notice(str_cat("resuming on ", shape(world_, cfg_.train.batch, passes_), " from a checkpoint of ",
                         shape(m.world, m.batch, m.accumulate),
                         ": the same samples per step; every rank starts from the ranks' average BN statistics"));
    }
    // What this run trains otherwise than the run it resumes (train.epochs, optimizer.lr, an
    // augmentation): allowed, and said, so that a kink in the curves has its reason in the log.
    // The schedule is a function of the step and these keys: it is not saved, but recomputed.
    if (for_training) {
      const auto trains = [](const std::string& k) {
        for (const char* p : {"debug.", "eval.", "checkpoint.", "emulate."})
          if (k.rfind(p, 0) == 0) return false;
        return !config_key_per_rank(k);
      };
      if (const std::string changed = config_changes(ck.config_yaml, cfg_, trains, "before", "now"); !changed.empty())
        notice(str_cat("note: ", path, " resumed with other settings: ", changed,
                       " (the learning-rate schedule follows this run's)"));
    }
    // The optimizer's state is of its kind: Adam's two moments are no SGD momentum, nor the reverse.
    if (for_training && wants_moment2 != !ck.moment2.empty())
      throw CheckpointError(str_cat(
          path, ": written by a run whose optimizer ", ck.moment2.empty() ? "kept no" : "kept a",
          " second moment (", ck.moment2.empty() ? "sgd" : "adamw or lamb", "); this run's optimizer.kind is ",
          optimizer_kind_name(cfg_.optimizer.sgd.kind), " (resume with the optimizer it was written with, "
          "or start a new run from its weights: --weights)"));
    // Within a family too: LAMB's moments would drive AdamW's steps with no error to show it.
    if (const std::string kind = config_changes(ck.config_yaml, cfg_, [](const std::string& k) { return k == "optimizer.kind"; },
                                                "in the file", "here");
        for_training && !kind.empty())
      throw CheckpointError(str_cat(path, ": written by a run with another optimizer (", kind,
                                    "): its state is that optimizer's (resume with the optimizer it was written with, "
                                    "or start a new run from its weights: --weights)"));
    arena.params_from_host(ck.params);
    arena.state_from_host(ck.state);
    if (for_training) momentum = std::move(ck.momentum);
    if (wants_moment2 && !ck.moment2.empty()) {
      lm.moment2 = 1;
      moment2 = std::move(ck.moment2);
      if (for_training) tensor_steps = loaded_tensor_steps(ck, momentum, moment2, path);
    }
    lm.step = m.step;
    lm.epoch = m.position.epoch;
    lm.epoch_steps = m.position.step / std::max<int64_t>(1, m.accumulate);
    lm.optimizer_steps = m.optimizer_steps;
    lm.loss_scale = m.loss_scale;
    lm.loss_scale_good = m.loss_scale_good;
    lm.best_top1 = m.best_top1;
    lm.best_step = m.best_step;
    lm.eval_pending = m.eval_pending;
    // Training goes on with each rank's own statistics where the file has them and was written by
    // as many ranks as this run's; evaluation, other rank counts and files without them use the
    // average.
    if (for_training && !ck.rank_state.empty() && m.world == world_) {
      lm.own_state = 1;
      rank_state = std::move(ck.rank_state);
    }
    // The weights' moving average: continued by a run that keeps one, evaluated beside the
    // model by --eval, dropped by a run without train.ema.
    if (!ck.ema.empty() && (has_ema() || !for_training)) {
      lm.ema = 1;
      ema = std::move(ck.ema);
      if (lm.own_state && !ck.ema_rank_state.empty()) {
        lm.own_ema = 1;
        ema_rank_state = std::move(ck.ema_rank_state);
      }
    } else if (!ck.ema.empty()) {
      notice(str_cat(path, ": its moving average of the weights is not continued (train.ema is 0)"));
    } else if (has_ema() && for_training) {
      notice(str_cat(path, ": no moving average of the weights in it: train.ema starts from its weights"));
    }
    // A scale the file saved that this run does not take: say so, as a resume that changed it.
    if (for_training && lm.loss_scale > 0 && !scaler_.dynamic() && lm.loss_scale != scaler_.scale())
      notice(str_cat(path, ": its loss scale ", lm.loss_scale, " is not continued (loss_scale.mode ",
                       cfg_.loss_scale.mode, ", set in ", config_origin(cfg_, "loss_scale.mode"),
                       scaler_.enabled() ? str_cat(": the static scale ", scaler_.scale(), " applies") : std::string(),
                       ")"));
  }
  // Everyone receives rank 0's state: ranks need not see the checkpoint folder themselves.
  MPI_CHECK(MPI_Bcast(&lm, int(sizeof lm), MPI_BYTE, 0, ctl_comm_->mpi()));
  comm::broadcast_model(*ctl_comm_, arena, 0);
  if (lm.own_state) arena.state_from_host(scatter_from_rank0(rank_state, arena.state().size()));
  if (for_training) {
    ctl_comm_->broadcast(momentum.data(), momentum.size(), DType::f32, 0);
    opt_->restore(momentum, lm.optimizer_steps);
  }
  if (lm.ema) ema_from_checkpoint(ema, ema_rank_state, lm.own_ema);
  else if (has_ema() && for_training) ema_start();
  else ema_stop();  // --eval of a file without one: the model's figures alone
  if (lm.moment2) {
    moment2.resize(opt_->size());
    ctl_comm_->broadcast(moment2.data(), moment2.size(), DType::f32, 0);
    opt_->restore_second_moment(moment2);
    if (for_training) {
      tensor_steps.resize(arena.layout().size());
      MPI_CHECK(MPI_Bcast(tensor_steps.data(), int(tensor_steps.size()), MPI_INT64_T, 0, ctl_comm_->mpi()));
      try {  // counts the optimizer cannot take (out of range, too many groups): the file's fault
        opt_->restore_tensor_steps(tensor_steps);
      } catch (const Error& e) {
        throw CheckpointError(str_cat(path, ": ", e.what()));
      }
    }
  }
  scaler_.restore(lm.loss_scale, lm.loss_scale_good);
  if (for_training) {  // a resumed run goes on beating the record it had, not its own first figure
    best_top1_ = lm.best_top1;
    best_step_ = lm.best_step;
    eval_pending_ = lm.eval_pending != 0;
  }
  step_ = lm.step;
  epoch_started_ = false;
  last_checkpoint_ = path;
  // The writing run's epochs: an evaluation on another rank count has other epochs of its own.
  const auto count = [](int64_t n, const char* what) { return str_cat(n, " ", what, n == 1 ? "" : "s"); };
  const std::string loaded = str_cat("loaded ", path, ": ", count(step_, "step"), " done (", count(lm.epoch, "epoch"),
                                     " + ", count(lm.epoch_steps, "step"), ")");
  // An evaluation's record is its "eval" line, which names the checkpoint: no "resume" for it.
  if (for_training) report(JsonLine("resume").add("step", step_).add("path", path), loaded);
  else log_line(loaded);
}

void Trainer::load_weights(const std::string& path, bool for_eval) {
  auto& arena = net_->arena();
  if (rank_ == 0) {
    const Checkpoint ck = checkpoint_read(path, {.weights = true, .optimizer = false, .rank_state = false, .ema = false});
    if (for_eval) check_checkpoint_classes(ck, path, false);  // fine-tuning brings classes of its own
    const size_t total = arena.layout().size() + arena.state_layout().size();
    std::vector<std::string> kept, unused;
    if (ck.meta.model == fingerprint_ && !ck.weights_only) {
      arena.params_from_host(ck.params);
      arena.state_from_host(ck.state);
    } else {
      if (ck.layout.empty())  // refused, naming its model and this one
        checkpoint_check_model(ck, path, fingerprint_, cfg_.model.name,
                               model_changes(ck) +
                                   "; the file predates the tensor list (section 'layout') that --weights needs to "
                                   "take part of another model");
      HostView<float> params = arena.host_params(), state = arena.host_state();
      const std::string theirs = checkpoint_model_name(ck);
      // The model here may be only the default one: a file imported without --model names none.
      const std::string hint = theirs.empty() ? str_cat("; the file names no model (", cfg_.model.name,
                                                        " is this job's: set model.* as the weights were trained)")
                                              : model_changes(ck);
      if (for_eval) {
        checkpoint_copy_whole(ck, arena, params.span(), state.span(), path, cfg_.model.name, "--eval", hint);
      } else {
        kept = checkpoint_copy_matching(ck, arena, params.span(), state.span());
        unused = checkpoint_unused(ck, arena);
        // Fine-tuning replaces a classifier, not most of a network: a file that fits less than
        // half of this model's tensors is another model's (resnet18's for a resnet20 may share
        // nothing but an fc.bias).
        if (2 * kept.size() > total)
          throw CheckpointError(str_cat(path, ": only ", total - kept.size(), " of the ", total, " tensors of ",
                                        cfg_.model.name, " are in it under the same name and shape (it holds ",
                                        theirs.empty() ? "another model" : theirs, "; first left out: ",
                                        kept.front(), ")", hint));
      }
      params.commit();
      state.commit();
    }
    std::string text = str_cat("weights from ", path, ": ", total - kept.size(), " of ", total, " tensors");
    // Shared names (bn1, layer1.0.conv1, ...) can fit most of another architecture: say whose.
    if (const std::string theirs = checkpoint_model_name(ck); !theirs.empty() && theirs != cfg_.model.name)
      text += str_cat(" (the file holds ", theirs, ", this model is ", cfg_.model.name, ")");
    if (!kept.empty()) {
      text += "; as initialised: ";
      const size_t shown = std::min<size_t>(kept.size(), 8);
      for (size_t i = 0; i < shown; ++i) text += (i ? ", " : "") + kept[i];
      if (shown < kept.size()) text += str_cat(" and ", kept.size() - shown, " more");
    }
    if (!unused.empty())
      text += str_cat("; not used from the file: ", unused.size(), " tensor(s) this model has no place for (first: ",
                      unused.front(), ")");
    if (for_eval) log_line(text);
    else
      report(JsonLine("weights").add("path", path).add("tensors", int64_t(total - kept.size()))
                 .add("initialised", int64_t(kept.size())),
             text);
  }
  // Every rank starts from rank 0's: ranks need not see the file themselves.
  comm::broadcast_model(*ctl_comm_, arena, 0);
  if (has_ema() && !for_eval) ema_start();  // the average starts from the weights taken
  else ema_stop();
}

std::string Trainer::resume(const std::string& what) {
  if (what != "auto") {
    load_checkpoint(what);
    return what;
  }
  std::string path;
  Checkpoint ck;  // the search reads the one it chooses whole: kept, not read again
  if (rank_ == 0) {
    std::vector<std::string> skipped;
    path = checkpoint_find_latest(ckpt_dir_, &skipped, &ck, parts_to_load(true));
    for (const auto& s : skipped) notice("skipping a damaged checkpoint: " + s);
    // Checkpoints there, none readable: the run's progress is not to be dropped without a word
    // (this rank's error ends the job, the others waiting below included).
    if (path.empty() && !skipped.empty()) {
      std::string why;
      for (const auto& s : skipped) why += (why.empty() ? "" : "; ") + s;
      throw CheckpointError(str_cat("--resume auto: every checkpoint in ", ckpt_dir_, " is damaged (", why,
                                    "); nothing to resume from. To start afresh anyway, move them away or run "
                                    "without --resume"));
    }
  }
  path = comm::broadcast_string(std::move(path), 0, ctl_comm_->mpi());
  if (path.empty()) {
    notice(str_cat("--resume auto: no checkpoint in ", ckpt_dir_, ": starting fresh"));
    return "";
  }
  restore_checkpoint(std::move(ck), path, true);
  return path;
}

std::vector<float> Trainer::averaged_bn_state(std::vector<float>& own) {
  own.resize(net_->arena().state().size());
  net_->arena().state_to_host(own);
  return average_over_ranks(own);
}

std::vector<float> Trainer::average_over_ranks(const std::vector<float>& own) {
  std::vector<float> avg = own;
  if (world_ > 1 && !avg.empty()) {
    const CtlWatch w = watch_ctl(comm::StallLabel("the average of the ranks' batch-norm statistics"));
    ctl_reduce_->allreduce(avg, comm::ReduceOp::average);
  }
  return avg;
}

std::vector<float> Trainer::scatter_from_rank0(const std::vector<float>& all, size_t n) {
  std::vector<float> own(n);
  if (n > comm::kMpiMaxCount) throw Error("BN statistics too large for one MPI_Scatter");
  MPI_CHECK(MPI_Scatter(all.data(), int(n), MPI_FLOAT, own.data(), int(n), MPI_FLOAT, 0, ctl_comm_->mpi()));
  return own;
}

std::vector<float> Trainer::gather_to_rank0(const std::vector<float>& own) {
  std::vector<float> all;
  if (world_ == 1 || own.empty()) return all;
  if (own.size() > comm::kMpiMaxCount) throw Error("BN statistics too large for one MPI_Gather");
  if (rank_ == 0) all.resize(own.size() * size_t(world_));
  const CtlWatch w = watch_ctl(comm::StallLabel("the gather of the ranks' batch-norm statistics"));
  MPI_CHECK(MPI_Gather(own.data(), int(own.size()), MPI_FLOAT, all.data(), int(own.size()), MPI_FLOAT, 0,
                       ctl_comm_->mpi()));
  return all;
}

}  // namespace rt::trainer

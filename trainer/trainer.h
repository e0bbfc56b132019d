// The training run: builds the model, optimizer, gradient reducer and loaders from a Config and
// owns the loop (train, evaluate, checkpoint, resume, consistency checks, metrics).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/allreduce.h"
#include "comm/bn_sync.h"
#include "comm/communicator.h"
#include "comm/device_grads.h"
#include "comm/gradient_reducer.h"
#include "data/loader.h"
#include "nn/loss_scale.h"
#include "nn/net.h"
#include "nn/optimizer.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/metrics.h"
#include "trainer/timeline.h"

namespace rt::trainer {

// Validation (or training) accuracy over a whole split, summed over all ranks.
struct EvalResult {
  int64_t samples = 0;   // every decodable sample of the split exactly once
  int64_t skipped = 0;   // images of the split that could not be read or decoded (left out)
  int64_t top1 = 0, top5 = 0;
  double loss = 0;       // mean cross-entropy (no smoothing)
  double seconds = 0;
  bool interrupted = false;  // a stop signal came first (training only): no figures
  double top1_pct() const { return samples ? 100.0 * double(top1) / double(samples) : 0; }
  double top5_pct() const { return samples ? 100.0 * double(top5) / double(samples) : 0; }
};

// ", N undecodable left out" where evaluation skipped images, else nothing.
inline std::string skipped_note(const EvalResult& r) {
  return r.skipped ? str_cat(", ", r.skipped, " undecodable left out") : std::string();
}

// Replaceable parts, for tests: a loader with fixed data, a model without batch norm.
struct TrainerHooks {
  std::function<std::unique_ptr<data::Loader>(const data::DataConfig&, data::Split, int rank,
                                              int world, int batch)>
      make_loader;
  std::function<std::unique_ptr<Net<float>>(const Config&)> make_net;
};

// Makes the gradient reducer's device hooks for a backend whose ops run on a queue
// (Backend::stream(), e.g. a cudaStream_t). A GPU program registers one at start (trainer_cuda:
// cuda::make_device_grads); without it such a backend's gradients are reduced on the host.
using DeviceGradsFactory = std::unique_ptr<comm::DeviceGrads> (*)(void* stream, comm::DevicePath path);
void register_device_grads(DeviceGradsFactory make);

class Trainer {
 public:
  // Collective over `world`: builds everything, checks that the ranks agree (model fingerprint,
  // comm settings) and broadcasts rank 0's initial parameters. Sets the OpenMP thread count
  // before the model is built (oneDNN fixes its work split when a primitive is created).
  // MPI must be initialised with MPI_THREAD_SERIALIZED or higher when cfg.comm.overlap is on.
  // Use::evaluate (the program's --eval) opens no training loader: the training split need not
  // hold a global batch (a folder dataset still names its classes by the training folders).
  // train() is then refused.
  enum class Use { train, evaluate };
  Trainer(Config cfg, MPI_Comm world = MPI_COMM_WORLD, TrainerHooks hooks = {}, Use use = Use::train);
  ~Trainer();

  // Restores a checkpoint (rank 0 reads it, every rank receives it): parameters, BN statistics,
  // momentum, step counts and the data position. Throws CheckpointError naming the file.
  // for_training: also refuse a checkpoint written with another global batch or epoch length
  // (an exact resume needs them); evaluation accepts any checkpoint of this model.
  void load_checkpoint(const std::string& path, bool for_training = true);
  // Starts from a checkpoint's weights (--weights): parameters and BN statistics of the same name
  // and shape, from a checkpoint of any model that lists its tensors (or of this same model);
  // the rest keep their initialisation, which is reported. Step, momentum and schedule start
  // afresh. Collective; throws CheckpointError naming the file when nothing fits.
  // for_eval: every tensor must be in the file (an evaluation of half-initialised weights means
  // nothing), and the report is a log line, not a "weights" record.
  void load_weights(const std::string& path, bool for_eval = false);
  // "auto": the newest valid checkpoint in the checkpoint folder; returns "" (and starts fresh)
  // when there is none. Otherwise the path itself. Returns the path loaded.
  std::string resume(const std::string& what);

  // Trains until train.epochs (or train.steps) are done, from wherever the run stands, or until
  // a stop signal (stop_signal.h, once the handlers are installed): then after a checkpoint of
  // the step every rank finished, and stopped_by() names the signal.
  void train();
  int stopped_by() const { return stopped_by_; }
  // Distributed top-1/top-5 over the whole validation split. Collective.
  EvalResult evaluate();
  // train.ema (trainer/ema.cc): whether a moving average of the weights is kept (or, after
  // --eval's load_checkpoint, was in the file); the same evaluation of it (collective; throws
  // rt::Error without one); its parameters and this rank's BN statistics, read to the host.
  bool has_ema() const { return ema_params_.size() > 0; }
  EvalResult evaluate_ema();
  void ema_to_host(std::vector<float>& params, std::vector<float>& state) const;
  // Saves a checkpoint now (rank 0 writes; every rank hands over its BN statistics).
  // Rank 0, before the first step: makes the checkpoint folder, proves it writable and sets
  // aside the files in it written after the step this run starts from (checkpoint_set_aside).
  void prepare_checkpoint_dir();
  // Rank 0 of a training job, before anything reads the run folder: a lock on its .lock file
  // (POSIX, held for the Trainer's life), refused with CheckpointError naming the holder where
  // another training job holds it. Where the file system has no locks, nothing.
  void lock_run_dir();
  std::string model_changes(const Checkpoint& ck) const;
  // Refuses (CheckpointError naming the file) a checkpoint whose saved class names differ from
  // the ones this job's data gives its labels, where both name them.
  void check_checkpoint_classes(const Checkpoint& ck, const std::string& path, bool for_training) const;
  void save_checkpoint();
  // Writes one JSON line to this rank's metrics file (if any) and prints `text` on rank 0 (as a
  // notice: also with log.progress off).
  void report(const JsonLine& line, const std::string& text, bool notice = false);

  Net<float>& net() { return *net_; }
  Optimizer<float>& optimizer() { return *opt_; }
  const Config& config() const { return cfg_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  int64_t step() const { return step_; }
  int64_t best_step() const { return best_step_; }  // of the best validation top-1 so far (0: none)
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // The epoch (from 1, as the epoch records number them) of step `step` (from 1).
  int64_t epoch_of(int64_t step) const { return (step - 1) / steps_per_epoch_ + 1; }
  int64_t total_steps() const { return total_steps_; }
  // Loss of each step this process ran (this rank's batch), for tests and the golden regression.
  const std::vector<double>& losses() const { return losses_; }
  const std::string& last_checkpoint() const { return last_checkpoint_; }
  const LossScaler& loss_scaler() const { return scaler_; }
  // Steps (1-based) whose update this process skipped for a gradient overflow (dynamic scaling).
  const std::vector<int64_t>& skipped_steps() const { return skipped_; }
  // Throws CommError naming the ranks whose parameters differ from rank 0's. Collective.
  void check_consistency();

 private:
  void setup_threads();
  void train_step();
  void emulate_step(double t0);               // emulate.compute_ms: backward's stand-in
  void inject_fault();       // debug.fault, when this rank and step are due
  void inject_ctl_fault();   // debug.fault freeze_ctl: in the end-of-step agreement of debug.step
  void inject_eval_fault();  // debug.fault stall_eval: in the evaluation after debug.step
  // Throws naming step, ranks and layers; bad_grads: the non-finite gradient values counted.
  void check_finite(double loss, double lr, size_t bad_grads);
  // Divides the averaged gradients by the loss scale; returns their non-finite values (counted
  // only when something needs them: check.finite or dynamic scaling).
  size_t unscale_gradients();
  // train.clip_grad_norm: the step's gradient's L2 norm (-1 with clipping and log.grad_norm off);
  // `clipped`: whether it was above the limit and the gradients were scaled down to it.
  double clip_gradients(bool& clipped);
  // optimizer.freeze (trainer/gradients.cc): checks its names against the model and finds the
  // frozen tensors' runs of the gradient buffer (frozen_), where backward can stop and how much
  // of the buffer needs averaging (averaged_elems_); zeroes those gradients after the
  // allreduce.
  void plan_freeze();
  void zero_frozen_gradients();
  void freeze_bn_statistics();  // optimizer.freeze_bn_stats (gradients.cc): counts bn_frozen_
  // The training loader's next batch, that of `step`, into b; throws rt::Error when the epoch
  // ends early or the batch has the wrong size or kind.
  void take_batch(data::Batch& b, int64_t step, int64_t pass = 0);  // pass: of an accumulated step
  // With a backend that stages inputs: takes the next step's batch while this step's backward
  // runs on the device and hands its bytes to the backend (Backend::stage_input).
  void prefetch_next();
  void end_epoch(int64_t epoch, double epoch_start_s, bool epoch_end, bool run_end, bool stopping);
  // Evaluates (and the moving average), adds the figures to `line` and `text`, and keeps the
  // run's best and target bookkeeping (best_due_, target_due_). False, with nothing added or
  // kept, when a stop signal interrupted it.
  bool validate(JsonLine& line, std::string& text);
  // A resume of a checkpoint whose stop skipped the evaluation due at its step makes it first,
  // as the run would have; true when it reaches train.target_top1 (reported: nothing to train).
  bool evaluate_pending();
  // eval.every_steps: whether the step just trained is one to validate after.
  bool step_eval_due() const { return cfg_.eval.every_steps > 0 && step_ % cfg_.eval.every_steps == 0; }
  // That validation within an epoch: a "validation" record (pending, as at an epoch's end, when
  // the run is stopping or the stop interrupts it).
  void validate_mid_epoch(bool stopping);
  void report_target();
  // Collective: the stop signal any rank caught (stop_signal.h), or 0; save_due: a timed
  // checkpoint is due (checkpoint.every_minutes). `again`: a second look after the step's own
  // (after an evaluation or a save, which may take minutes), without the step's fault drill.
  int agreed_stop_signal(bool& save_due, bool again = false);
  int agreed_stop_signal_again() {
    bool unused = false;
    return agreed_stop_signal(unused, true);
  }
  // Reports the stop by `sig` after step_ (the record, the line saying how to continue).
  void report_stop(int sig);
  // Collective (agreement.cc): every rank runs rank 0's configuration (config_key_per_rank aside)
  // and sees the same number of samples and classes; else every rank throws ConfigError naming
  // the first rank that differs and how.
  void check_config_agreement();
  void check_data_agreement();
  void open_training_data();
  // make_loader (or the hook's), its data errors naming the key that gave the path and where.
  std::unique_ptr<data::Loader> open_loader(data::Split split);  // train_loader_ and steps_per_epoch_; throws naming the data
  // Rank 0, loading AdamW's or LAMB's state (trainer_state.cc): each tensor's update count.
  std::vector<int64_t> loaded_tensor_steps(const Checkpoint& ck, std::span<const float> m, std::span<const float> v,
                                           const std::string& path) const;
  // The stall check of the trainer's own collectives (the end-of-step agreement, epoch and
  // evaluation sums, batch-norm averages, checks), as of the gradients' allreduce: while the
  // returned object lives, a rank that never reaches the collective `what` is named and the job
  // stopped (comm.stall_*_s; agreement.cc). Every rank must watch the same collectives in order.
  // Some run every step: the label is static text and a number, nothing to allocate.
  struct CtlWatch {
    comm::StallWatch* w;
    explicit CtlWatch(comm::StallWatch* s) : w(s) {}
    CtlWatch(const CtlWatch&) = delete;
    CtlWatch& operator=(const CtlWatch&) = delete;
    ~CtlWatch();
  };
  CtlWatch watch_ctl(const comm::StallLabel& what);

  // Collective: copies this rank's own BN running statistics into `own` and returns their average
  // over the ranks (by the ring, so bitwise the same on every rank). The arena is left as it is.
  std::vector<float> averaged_bn_state(std::vector<float>& own);
  // Collective: the ranks' average of `own` (the same bits everywhere); every rank's `own` on
  // rank 0, rank 0's first (empty on the others, and on one rank); and back: rank r's n values
  // of rank 0's `all` (read on rank 0 only).
  std::vector<float> average_over_ranks(const std::vector<float>& own);
  std::vector<float> gather_to_rank0(const std::vector<float>& own);
  std::vector<float> scatter_from_rank0(const std::vector<float>& all, size_t n);
  // train.ema (trainer/ema.cc). ema_start: the average := the weights now (allocated at the
  // first call); ema_stop: none kept; ema_update: one update after an applied optimizer step;
  // the checkpoint's "ema" / "ema_bnr" sections out (collective; rank 0's are the file's) and in
  // (collective; rank 0's are read, own_state: each rank's statistics from rank_state).
  void ema_start();
  void ema_stop() { ema_params_ = Buffer<float>(), ema_state_ = Buffer<float>(); }
  void ema_update();
  void ema_for_checkpoint(std::vector<float>& ema, std::vector<float>& rank_state);
  // What load_checkpoint reads of a file; restore_checkpoint takes it (rank 0's `ck`, read with
  // those parts; the other ranks' is empty) and hands it to every rank.
  static CheckpointParts parts_to_load(bool for_training);
  void restore_checkpoint(Checkpoint ck, const std::string& path, bool for_training);
  void ema_from_checkpoint(std::vector<float>& ema, std::vector<float>& rank_state, bool own_state);
  data::Loader& val_loader();
  BackendOptions backend_options() const;  // cuda.* and this rank's place on its node
  Net<float>& eval_net();  // net_, or evaluation's own at data.eval_image_size (evaluate.cc)
  Metrics& metrics();  // the metrics file, the start record written before the first record
  void log_line(const std::string& s) const;  // rank 0's progress printout (log.progress)
  // Rank 0's warnings, notes and what needs the user's action or moved their files: printed with
  // the progress, or on stderr where log.progress is off (turning the display off is no reason
  // to miss them).
  void notice(const std::string& s) const;
  void make_bn_sync(MPI_Comm world);
  std::unique_ptr<Net<float>> build_net(const Config& c, bool inference_only);

  Config cfg_;
  TrainerHooks hooks_;
  int rank_ = 0, world_ = 1;
  std::unique_ptr<comm::Communicator> grad_comm_, ctl_comm_;  // gradient traffic; everything else
  std::unique_ptr<comm::Allreducer> ctl_reduce_;              // BN statistics (ring: bitwise equal)
  std::unique_ptr<comm::StallWatch> ctl_stall_;  // the stall check of ctl_comm_'s collectives
  int64_t ctl_calls_ = 0;                        // ... which it numbers
  double eval_s_ = 0;  // this process's time in evaluations during train(): not training's
  struct DirLock {  // the run folder's lock, released with the Trainer (after metrics_: declared before)
    int fd = -1;
    std::string file;  // <run_dir>/.lock
    std::string made;  // the outermost folder made for it ("" when none): removed if left empty
    DirLock() = default;
    DirLock(const DirLock&) = delete;
    DirLock& operator=(const DirLock&) = delete;
    ~DirLock();
  } run_lock_;
  Use use_ = Use::train;
  std::shared_ptr<comm::BnGroupSync> bn_sync_;  // model.bn_group's groups (null: none, 1 rank each)
  std::unique_ptr<Net<float>> net_;
  std::unique_ptr<Net<float>> eval_net_;  // evaluation's, when its side is not training's
  std::unique_ptr<Optimizer<float>> opt_;
  LossScaler scaler_;
  std::unique_ptr<comm::GradientReducer> reducer_;
  std::unique_ptr<data::Loader> train_loader_, val_loader_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<JsonLine> start_record_;  // until the first record: metrics() writes it then
  std::unique_ptr<Progress> progress_;
  std::function<void(size_t)> ready_;  // the reducer's callback, made once
  std::vector<size_t> emulate_points_;  // emulated backward's progress reports (emulate.compute_ms)
  std::vector<float> emulate_host_;     // ... and its gradients, when the arena is a device's
  comm::ModelFingerprint fingerprint_;
  ScheduleConfig schedule_;
  std::string config_yaml_, ckpt_dir_, last_checkpoint_;

  int64_t step_ = 0;                 // optimizer steps done
  int stopped_by_ = 0;               // the signal train() stopped for (0: none)
  int64_t steps_per_epoch_ = 0, total_steps_ = 0;  // optimizer steps
  int64_t passes_ = 1;               // train.accumulate: forward/backward passes (batches) per step
  bool epoch_started_ = false;       // the train loader is positioned inside the current epoch
  data::Batch batch_;                // reused: no allocation per step
  data::Batch next_batch_;           // prefetch_next's batch, when has_next_
  bool prefetch_ = false, has_next_ = false;
  double next_wait_s_ = 0;           // how long prefetch_next waited for it
  double prefetch_t0_ = 0, prefetch_t1_ = 0;  // when prefetch_next ran in this step (0: not)
  std::unique_ptr<Timeline> timeline_;  // log.timeline, on the ranks that write one
  double timeline_origin_ = 0;          // the clock after a barrier: t = 0 on every rank
  int64_t timeline_first_ = -1, timeline_end_ = -1;  // the window, 0-based step indices
  HostVector<float> logits_;  // in the backend's input_memory(): each pass of a step exports into it queued
  std::vector<int32_t> step_labels_;  // the step's labels, pass after pass, counted after its sync
  int64_t classes_ = 0;               // logits per sample
  Buffer<float> grad_sum_;  // train.accumulate > 1: the step's earlier passes' gradients (arena memory)
  std::vector<float> pad_images_;
  std::vector<uint8_t> pad_pixels_;  // evaluation's short batches, data.output u8
  NormParams norm_;                  // data.output u8: the normalization the backend applies
  std::vector<int32_t> pad_labels_;
  std::vector<float> eval_pad_images_;    // the same for eval_net_'s input
  std::vector<uint8_t> eval_pad_pixels_;
  std::vector<double> losses_;
  std::vector<int64_t> skipped_;
  Buffer<float> ema_params_, ema_state_;  // train.ema, in the arena's memory; empty: none
  // This epoch's running training statistics on this rank.
  double epoch_loss_ = 0;
  int64_t epoch_top1_ = 0, epoch_top5_ = 0, epoch_samples_ = 0;
  int64_t epoch_clipped_ = 0;  // steps whose gradient train.clip_grad_norm scaled down
  int64_t epoch_skipped_ = 0;  // undecodable images replaced in the batches this epoch trained
  int64_t epoch_from_ = 0;     // the epoch's first step in this run (0 unless resumed mid-epoch)
  std::vector<std::pair<size_t, size_t>> frozen_;  // optimizer.freeze: [begin, end) runs of the arena
  size_t averaged_elems_ = 0;  // gradients averaged across ranks: the arena less a frozen stem at its end
  size_t bn_frozen_ = 0;       // batch norm layers with frozen statistics (optimizer.freeze_bn_stats)
  // The best validation top-1 (%) of the run so far and its step (0: none yet), kept in the
  // checkpoints (checkpoint.keep_best, train.target_top1); best_due_: this step's evaluation beat
  // it and checkpoint.keep_best makes this step's checkpoint the best; target_due_: it reached
  // train.target_top1, and the run ends after this step's checkpoint.
  double best_top1_ = 0;
  int64_t best_step_ = 0;
  bool best_due_ = false, target_due_ = false;
  bool eval_pending_ = false;  // this step's evaluation was skipped by a stop (kept in the checkpoint)
  bool target_reached() const { return cfg_.train.target_top1 > 0 && best_step_ > 0 && best_top1_ >= cfg_.train.target_top1; }
  double run_start_s_ = 0;  // when train() began, for the time to the target
  double last_save_s_ = 0;  // when the last checkpoint was saved (or train() began)
};

// Counts, for n samples of `classes` logits each, how many have the label first (top-1) and
// within the first five (top-5); ties count against the label. Adds -log softmax[label] to loss.
void count_correct(const float* logits, const int32_t* labels, int n, int64_t classes,
                   int64_t& top1, int64_t& top5, double& loss);
// Inf and NaN values in v[0, n).
size_t count_nonfinite(const float* v, size_t n);
// The moving average's decay at its update number `updates` (0 first): `decay`, or with warm-up
// min(decay, (1 + updates) / (10 + updates)).
double ema_decay(double decay, bool warmup, int64_t updates);

}  // namespace rt::trainer

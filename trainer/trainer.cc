// The training loop: set-up, the run's epochs and their ends (statistics, evaluation,
// checkpoints), stop signals; each step itself is in step.cc.
#include "trainer/trainer.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include "comm/agreement.h"
#include "comm/cuda_aware.h"
#include "comm/mpi_check.h"
#include "data/dataset.h"
#include "nn/console.h"
#include "nn/resnet.h"
#include "nn/clock.h"
#include "trainer/stop_signal.h"

namespace rt::trainer {
namespace {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

std::string metrics_path(const Config& c, int rank) {
  const std::string& p = c.log.jsonl;
  if (p == "none") return "";
  if (p.empty()) return rank == 0 ? config_run_dir(c) + "/metrics.jsonl" : "";
  return config_rank_file(p, rank);
}

std::atomic<DeviceGradsFactory>& device_grads_slot() {
  static std::atomic<DeviceGradsFactory> f{nullptr};
  return f;
}
DeviceGradsFactory device_grads_factory() { return device_grads_slot().load(); }

}  // namespace

void register_device_grads(DeviceGradsFactory make) { device_grads_slot().store(make); }

Trainer::Trainer(Config cfg, MPI_Comm world, TrainerHooks hooks, Use use)
    : cfg_(std::move(cfg)), hooks_(std::move(hooks)), use_(use), scaler_(cfg_.loss_scale) {
  MPI_CHECK(MPI_Comm_rank(world, &rank_));
  MPI_CHECK(MPI_Comm_size(world, &world_));
  config_validate(cfg_);
  if (cfg_.debug.fault != "none" && cfg_.debug.rank >= world_)
    throw ConfigError(str_cat(config_origin(cfg_, "debug.rank"), ": debug.rank is ", cfg_.debug.rank,
                              " but the job has ", world_,
                              " rank(s)"));
  cfg_.run_dir = config_run_dir(cfg_);  // resolved, so a checkpoint's config names it
  cfg_.data.seed = cfg_.seed;
  config_yaml_ = config_to_yaml(cfg_);
  ckpt_dir_ = config_checkpoint_dir(cfg_);
  lock_run_dir();  // before the set-up's collectives: a refusal is this job's first word

  grad_comm_ = std::make_unique<comm::Communicator>(world);
  setup_threads();  // threads may differ per rank: no collective of its own
  ctl_comm_ = std::make_unique<comm::Communicator>(world);
  comm::CommConfig ctl_cfg = cfg_.comm;
  ctl_cfg.algorithm = "ring";  // bitwise-identical results on every rank by construction
  ctl_reduce_ = comm::make_allreducer(ctl_cfg, *ctl_comm_);
  check_config_agreement();  // first: what follows makes collectives by the settings
  if (world_ > 1 && (cfg_.comm.stall_warning_s > 0 || cfg_.comm.stall_abort_s > 0)) {
    ctl_stall_ = std::make_unique<comm::StallWatch>(ctl_comm_->mpi(), cfg_.comm.stall_warning_s,
                                                    cfg_.comm.stall_abort_s);
    ctl_comm_->set_stall_watch(ctl_stall_.get());
  }

  const int batch = int(cfg_.train.batch);
  passes_ = cfg_.train.accumulate;
  if (use_ == Use::evaluate) {
    steps_per_epoch_ = 1;  // nothing is trained: no epochs of training data to count
  } else {
    open_training_data();
    // train.steps stops a run early; it never runs past the epochs, where the schedule has ended.
    total_steps_ = cfg_.train.epochs * steps_per_epoch_;
    if (cfg_.train.steps > 0) total_steps_ = std::min(total_steps_, cfg_.train.steps);
  }
  schedule_ = config_schedule(cfg_, world_);

  make_bn_sync(world);
  if (use_ == Use::evaluate) {
    // Nothing is trained: the one network is set up for evaluation's side and batch, forward only
    // (no activation kept for a backward pass).
    Config c = cfg_;
    c.data.image_size = data::eval_image_size(cfg_.data);
    c.train.batch = config_eval_batch(cfg_);
    net_ = build_net(c, true);
  } else {
    net_ = build_net(cfg_, false);
  }
  auto& arena = net_->arena();
  if (bn_sync_) {  // the largest sum: forward's three per channel and the rows
    size_t channels = 0;
    for (const ParamInfo& p : arena.layout())
      if (p.kind == ParamKind::bn_gamma) channels = std::max(channels, p.count);
    bn_sync_->reserve(3 * channels + 1);
  }
  plan_freeze();
  opt_ = net_->backend().make_sgd(arena.layout(), cfg_.optimizer.sgd);
  fingerprint_ = comm::model_fingerprint(arena);
  comm::ModelFingerprint averaged = fingerprint_;  // what the reducer averages (plan_freeze)
  averaged.grad_elems = averaged_elems_;
  // The reducer first: its agreement check proves every rank built the same model and settings
  // before the broadcast below relies on equal buffer sizes.
  if (void* stream = net_->backend().stream(); stream && device_grads_factory()) {
    // Gradients stay on the device: backward reports them in stream order (no sync per layer)
    // and the reducer fences, then reduces them there (CUDA-aware MPI) or through a host mirror.
    auto hooks = device_grads_factory()(stream, comm::comm_device_path(cfg_.comm));
    reducer_ = std::make_unique<comm::GradientReducer>(*grad_comm_, cfg_.comm, std::move(hooks), arena.grads().data(),
                                                       averaged_elems_, DType::f32, averaged);
    net_->set_ready_sync(false);
  } else {
    if (!arena.host_accessible())
      throw Error(str_cat("backend ", net_->backend().name(), ": the parameter arena is in ", arena.memory()->name(),
                          ", which the host cannot read, and no device gradient hooks are registered "
                          "(register_device_grads) to reduce the gradients there"));
    reducer_ = std::make_unique<comm::GradientReducer>(*grad_comm_, cfg_.comm,
                                                       arena.grads().first(averaged_elems_), averaged);
  }
  ready_ = reducer_->ready_callback();
  if (cfg_.emulate.compute_ms > 0) {
    std::vector<size_t> offsets;
    for (const auto& p : arena.layout()) offsets.push_back(p.offset);
    emulate_points_ = emulate_ready_points(offsets, arena.grads().size());
    if (!arena.host_accessible()) emulate_host_.resize(arena.size());
  }
  // A device backend copies the next batch while this step computes (not when compute is
  // emulated: nothing is imported then).
  prefetch_ = cfg_.emulate.compute_ms <= 0 && net_->backend().can_stage_input();
  if (train_loader_) train_loader_->set_batch_memory(net_->backend().input_memory());  // page-locked for a GPU
  comm::broadcast_model(*ctl_comm_, arena, 0);
  if (cfg_.train.ema > 0) ema_start();

  // Reserved up front so that recording a loss never allocates inside the loop (bounded: very
  // long runs reallocate a few times).
  losses_.reserve(size_t(std::min<int64_t>(total_steps_, int64_t(1) << 20)));
  classes_ = net_->shape(net_->logits()).c;
  // Page-locked for a GPU, so that the step's queued exports of the logits do not wait.
  // Also evaluation's, whose batch (eval.batch) may be the larger.
  const int64_t logit_rows = std::max<int64_t>(passes_ * batch, config_eval_batch(cfg_));
  logits_ = HostVector<float>(size_t(logit_rows * classes_), HostAllocator<float>(net_->backend().input_memory()));
  step_labels_.assign(size_t(passes_ * batch), 0);
  if (passes_ > 1) {
    grad_sum_ = Buffer<float>(arena.memory());
    grad_sum_.resize(arena.size());
  }
  pad_images_.resize(size_t(net_->shape(0).numel()));
  if (cfg_.data.output == data::Output::u8) pad_pixels_.resize(pad_images_.size());
  norm_ = data::norm_params(cfg_.data);
  pad_labels_.assign(size_t(config_eval_batch(cfg_)), 0);
  // Where this run will evaluate, its validation data is opened now: a missing folder, classes
  // that differ from training's or too few samples stop the job before any training is lost.
  if (cfg_.eval.any() || use_ == Use::evaluate) val_loader();
  check_data_agreement();
  try {
    metrics_ = std::make_unique<Metrics>(metrics_path(cfg_, rank_));
  } catch (const Error& e) {
    const char* key = cfg_.log.jsonl.empty() ? "run_dir" : "log.jsonl";
    // An evaluation only adds a record: a run folder it cannot write (read-only storage, another
    // user's run) is no reason to refuse it.
    if (use_ != Use::evaluate) throw ConfigError(str_cat(e.what(), "; ", key, " set in ", config_origin(cfg_, key)));
    std::fprintf(stderr, "ringtrain: warning: %s: the evaluation's record is not kept (%s set in %s; --set log.jsonl=PATH)\n",
                 e.what(), key, config_origin(cfg_, key).c_str());
    metrics_ = std::make_unique<Metrics>();
  }
  progress_ = std::make_unique<Progress>(rank_ == 0 && cfg_.log.progress, stdout_is_terminal(),
                                         cfg_.log.interval, cfg_.train.epochs, steps_per_epoch_, total_steps_);
  // Written when training starts or with the first record (metrics()): a start that fails
  // before (a refused resume) leaves no record of a run that never was.
  // An evaluation's record leaves out what only training has (its steps, rate, optimizer,
  // gradient exchange), rather than stand-in values.
  const bool training = use_ != Use::evaluate;
  JsonLine start("start");
  start.add("rank", rank_).add("world", world_).add("nodes", grad_comm_->nodes());
  if (training) start.add("bn_group", bn_sync_ ? bn_sync_->ranks() : 1);
  start.add("model", cfg_.model.name).add("params", int64_t(arena.param_count())).add("threads", omp_get_max_threads())
      .add("batch", training ? cfg_.train.batch : config_eval_batch(cfg_));
  if (training)
    start.add("accumulate", passes_)
        .add("global_batch", int64_t(config_global_batch(cfg_, world_)))
        .add("steps_per_epoch", steps_per_epoch_)
        .add("total_steps", total_steps_)
        .add("base_lr", schedule_.base_lr)
        .add("optimizer", std::string(optimizer_kind_name(cfg_.optimizer.sgd.kind)))
        .add("lars", int64_t(cfg_.optimizer.sgd.lars))
        .add("loss", std::string(loss_kind_name(cfg_.train.loss)));
  start.add("eval_image_size", int64_t(data::eval_image_size(cfg_.data)));
  if (training) start.add("eval_batch", config_eval_batch(cfg_));
  if (training)
    start.add("comm", std::string(reducer_->algorithm()))
        // One rank averages nothing: no gradient travels, in any type.
        .add("comm_wire", std::string(world_ > 1 ? dtype_name(reducer_->wire_type()) : "none"))
        .add("device_path", std::string(reducer_->device_path() ? reducer_->device_path() : "host"))
        .add("buckets", int64_t(reducer_->num_buckets()))
        .add("emulate_compute_ms", cfg_.emulate.compute_ms);
  start.add("backend", net_->backend().name()).add("setup", net_->backend().setup_note());
  start_record_ = std::make_unique<JsonLine>(std::move(start));

  // An evaluation traces no steps: opening the run's timeline would empty its training trace.
  if (!cfg_.log.timeline.empty() && use_ != Use::evaluate) {
    // One origin for all ranks (their clocks differ across nodes): the end of a barrier.
    ctl_comm_->barrier();
    timeline_origin_ = now_s();
    if (const std::string path = config_rank_file(cfg_.log.timeline, rank_); !path.empty()) {
      std::error_code ec;
      if (const auto dir = std::filesystem::path(path).parent_path(); !dir.empty())
        std::filesystem::create_directories(dir, ec);
      if (ec)
        throw ConfigError(str_cat(config_origin(cfg_, "log.timeline"), ": log.timeline: cannot make the folder of ",
                                  path, " (", ec.message(), ")"));
      timeline_ = std::make_unique<Timeline>(path, "log.timeline", rank_, timeline_origin_);
    }
  }
}

Trainer::~Trainer() = default;

std::unique_ptr<data::Loader> Trainer::open_loader(data::Split split) {
  auto make_loader = hooks_.make_loader ? hooks_.make_loader : data::make_loader;
  try {
    const int64_t batch = split == data::Split::train ? cfg_.train.batch : config_eval_batch(cfg_);
    return make_loader(cfg_.data, split, rank_, world_, int(batch));
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    if (cfg_.data.synthetic) throw;
    // Where the path came from: a checkpoint's saved configuration names its own machine's data.
    const bool train = split == data::Split::train;
    const auto& d = cfg_.data;
    std::string key = "data.root";
    if (!(train ? d.train_shards : d.val_shards).empty()) key = train ? "data.train_shards" : "data.val_shards";
    else if (!(train ? d.train_list : d.val_list).empty()) key = train ? "data.train_list" : "data.val_list";
    const std::string origin = config_origin(cfg_, key);
    throw Error(str_cat(e.what(), " (", key, " set in ", origin,
                        origin.find("saved configuration") != std::string::npos
                            ? str_cat("; --set ", key, "=PATH where the data is here")
                            : std::string(),
                        ")"));
  }
}

void Trainer::open_training_data() {
  const int batch = int(cfg_.train.batch);
  train_loader_ = open_loader(data::Split::train);
  if (train_loader_->num_classes() > cfg_.model.classes)
    throw ConfigError(str_cat(config_origin(cfg_, "model.classes"), ": model.classes is ", cfg_.model.classes,
                              " but the training data (", data::split_source(cfg_.data, data::Split::train), ") has ",
                              train_loader_->num_classes(), " classes",
                              cfg_.data.train_list.empty() ? ""
                                                           : " (the largest label of data.train_list and "
                                                             "data.val_list, plus one)"));
  // Batches left over past the last whole step of an epoch are dropped, as a short batch is.
  steps_per_epoch_ = train_loader_->steps_per_epoch() / passes_;
  if (steps_per_epoch_ < 1)
    throw Error(str_cat("data: ", train_loader_->size(), " training samples are fewer than one global batch (",
                        world_, " ranks x ", batch, passes_ > 1 ? str_cat(" x ", passes_, " accumulated") : "",
                        ")"));
}

void Trainer::setup_threads() {
  int threads = cfg_.threads;
  if (threads == 0) {
    const char* env = std::getenv("OMP_NUM_THREADS");
    // The cores this process may use, shared among the ranks of this node (counted by the
    // communicator's set-up, which every rank makes: a split here only where threads is 0 would
    // be a collective that ranks with other settings skip).
    threads = env && std::atoi(env) > 0 ? std::atoi(env) : std::max(1, available_cores() / grad_comm_->local_size());
  }
  omp_set_num_threads(threads);
}

// model.bn_group: the groups, when a group holds more than one rank. Their sums run on the main
// thread during backward while the communication thread reduces gradient buckets: two threads
// in MPI at once, which needs MPI_THREAD_MULTIPLE.
void Trainer::make_bn_sync(MPI_Comm world) {
  const int group = cfg_.model.bn_group;
  if (const std::string e = comm::bn_group_error(group, world_); !e.empty())
    throw ConfigError(str_cat(config_origin(cfg_, "model.bn_group"), ": key 'model.bn_group' ", e));
  if ((group == 0 ? world_ : group) == 1) return;
  int provided = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Query_thread(&provided));
  if (cfg_.comm.overlap && provided < MPI_THREAD_MULTIPLE)
    throw ConfigError(str_cat(config_origin(cfg_, "model.bn_group"),
                              ": key 'model.bn_group' sums batch norm statistics during backward while "
                              "comm.overlap reduces gradients on another thread, which needs MPI initialised "
                              "with MPI_THREAD_MULTIPLE (this process has less); set comm.overlap: false"));
  bn_sync_ = std::make_shared<comm::BnGroupSync>(world, group, cfg_.comm);
}

// The model of config c: the hook's (tests), else the ResNet on the job's backend; training's
// takes the batch-norm groups, evaluation's runs forward only.
std::unique_ptr<Net<float>> Trainer::build_net(const Config& c, bool inference_only) {
  if (hooks_.make_net) return hooks_.make_net(c);
  ResNetConfig r = config_resnet(c);
  r.inference_only = inference_only;
  if (!inference_only) r.bn_sync = bn_sync_;
  return build_resnet<float>(r, make_backend<float>(cfg_.backend, backend_options()));
}

Metrics& Trainer::metrics() {
  if (start_record_) metrics_->write(*std::exchange(start_record_, nullptr));
  return *metrics_;
}

void Trainer::log_line(const std::string& s) const {
  if (rank_ == 0 && cfg_.log.progress) progress_->message(s);
}

void Trainer::notice(const std::string& s) const {
  if (rank_ != 0) return;
  if (cfg_.log.progress) progress_->message(s);
  else stderr_line(s);
}

void Trainer::train() {
  if (use_ == Use::evaluate) throw Error("train: this trainer was built to evaluate (Trainer::Use::evaluate)");
  if (step_ >= total_steps_) {
    if (eval_pending_ && cfg_.eval.any()) {
      // The run's last evaluation, which a stop interrupted: made now, and its checkpoint
      // written again without it pending.
      run_start_s_ = last_save_s_ = now_s();
      if (evaluate_pending()) return;
      if (!eval_pending_) {
        save_checkpoint();
        return;
      }
      if (const int stop = agreed_stop_signal_again()) report_stop(stop);  // stopped again
      return;
    }
    notice(str_cat("nothing to train: step ", step_, " of ", total_steps_, " already done",
                     eval_pending_ ? " (the evaluation the last run's stop skipped there: --eval the checkpoint)" : ""));
    return;
  }
  if (target_reached()) {
    notice(str_cat("nothing to train: validation top-1 ", fixed(best_top1_, 2), "% at step ", best_step_,
                     " reached train.target_top1 ", cfg_.train.target_top1, "%"));
    return;
  }
  prepare_checkpoint_dir();
  metrics();  // the start record now: a run that fails in its first step still has one
  run_start_s_ = last_save_s_ = now_s();
  const int64_t first_step = step_;
  log_line(str_cat("training ", cfg_.model.name, " (", net_->arena().param_count(), " parameters) on ", world_,
                   " rank(s) x batch ", cfg_.train.batch,
                   passes_ > 1 ? str_cat(" x ", passes_, " passes accumulated per step") : "", ", ",
                   steps_per_epoch_, " steps/epoch, ",
                   total_steps_ - step_, " steps to go, ", optimizer_kind_name(cfg_.optimizer.sgd.kind),
                   cfg_.optimizer.sgd.lars ? " with LARS" : "", " base lr ", schedule_.base_lr,
                   cfg_.optimizer.lr_scaling == "linear" ? ""
                   : cfg_.optimizer.lr_scaling == "sqrt" ? " (optimizer.lr x sqrt(global batch / 256))"
                                                         : " (optimizer.lr as given)",
                   ", ", cfg_.train.loss == LossKind::bce ? "BCE loss, " : "",
                   omp_get_max_threads(), " thread(s)/rank"));
  if (const std::string note = net_->backend().setup_note(); !note.empty()) log_line(note);
  if (cfg_.comm.algorithm == "mpi" && world_ > 1 && (cfg_.comm.stall_warning_s > 0 || cfg_.comm.stall_abort_s > 0)) {
    int provided = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&provided));
    if (provided < MPI_THREAD_MULTIPLE)  // the watchdog that watches MPI_Allreduce needs it
      notice("note: comm.algorithm mpi waits inside MPI_Allreduce, which the stall check can watch only with "
               "MPI_THREAD_MULTIPLE (this MPI gives less): comm.stall_warning_s and comm.stall_abort_s apply "
               "to ring, hierarchical and reducer only");
  }
  if (const std::string unread = inapplicable_keys(cfg_); !unread.empty())
    notice(str_cat("note: set but without effect in this configuration: ", unread));
  // Fine-tuning onto a smaller dataset with model.classes left at the pretrained count.
  if (const int64_t n = train_loader_->num_classes(); !cfg_.data.synthetic && n < cfg_.model.classes)
    notice(str_cat("note: model.classes ", cfg_.model.classes, " (set in ", config_origin(cfg_, "model.classes"),
                   ") for the ", n, " classes of ", data::split_source(cfg_.data, data::Split::train), ": ",
                   cfg_.model.classes - n, " outputs no label reaches"));
  if (cfg_.train.steps > total_steps_)
    notice(str_cat("train.steps ", cfg_.train.steps, " (set in ", config_origin(cfg_, "train.steps"),
                     ") is past the end of train.epochs: the run ends after epoch ", cfg_.train.epochs, ", step ",
                     total_steps_));
  if (const int threads = omp_get_max_threads(), cores = available_cores(); threads > cores)
    notice(str_cat("warning: ", threads, " threads per rank (threads, set in ",
                     config_origin(cfg_, "threads"), ") for the ", cores,
                     " cores rank 0 may use: threads that share a core wait for each other at every layer"));
  if (timeline_ && timeline_first_ < 0) {
    timeline_first_ = std::min(step_ + cfg_.log.timeline_skip, total_steps_);
    timeline_end_ = std::min(timeline_first_ + cfg_.log.timeline_steps, total_steps_);
    if (timeline_first_ == timeline_end_) {
      timeline_->close();
      notice(str_cat("warning: log.timeline_skip ", cfg_.log.timeline_skip, " passes the run's last step (",
                     total_steps_ - step_, " to go): the timeline traces no step"));
    }
  }
  if (reducer_->wire_type() != DType::f32 && world_ > 1)
    log_line(str_cat("gradients averaged as ", dtype_name(reducer_->wire_type()),
                     " (comm.compression): half the bytes on the wire, one rounding per ring hop"));
  if (net_->backward_from() > 0 || averaged_elems_ < net_->arena().size())
    log_line(str_cat("optimizer.freeze: backward stops at ", net_->node(net_->backward_from()).name, " (the ",
                     net_->backward_from(), " of ", net_->num_nodes(), " nodes before it skipped); ",
                     fixed(double(net_->arena().size() - averaged_elems_) * 4 / (1 << 20), 1),
                     " MiB of frozen gradients not averaged"));
  if (bn_sync_)
    log_line(str_cat("model.bn_group: batch norm statistics over groups of ", bn_sync_->ranks(), " ranks (",
                     bn_sync_->ranks() * cfg_.train.batch, " images)"));
  if (bn_frozen_ > 0)
    log_line(str_cat("optimizer.freeze_bn_stats: ", bn_frozen_,
                     " frozen batch norm layers normalize with their running statistics and keep them"));
  if (cfg_.emulate.compute_ms > 0)
    log_line(str_cat("compute emulated: ", cfg_.emulate.compute_ms, " ms per step (forward share ",
                     cfg_.emulate.forward_fraction, "), no forward or backward is run; losses read 0"));
  bool pending_made = false;  // and its result not yet in the checkpoint
  if (eval_pending_ && cfg_.eval.any()) {
    if (evaluate_pending()) return;
    pending_made = !eval_pending_;
  } else if (std::exchange(eval_pending_, false)) {
    notice(str_cat("the evaluation the last run's stop skipped at step ", step_,
                     " is not made: this run does not evaluate (eval.every_epochs 0, eval.every_steps 0, eval.at_end false)"));
  }
  // A stop asked during the set-up (a dataset generated, a checkpoint loaded) or that pending
  // evaluation is taken before any step: nothing new to save.
  if (stop_handlers_installed()) {
    if (const int stop = agreed_stop_signal_again()) {
      if (pending_made) save_checkpoint();  // else the next resume would make it again
      report_stop(stop);
      return;
    }
  }
  double epoch_start = now_s();
  while (step_ < total_steps_) {
    const int64_t epoch = step_ / steps_per_epoch_, in_epoch = step_ % steps_per_epoch_;
    if (!epoch_started_) {
      epoch_skipped_ = 0;
      train_loader_->start_epoch({epoch, in_epoch * passes_});  // the loader counts batches
      has_next_ = false;
      epoch_started_ = true;
      epoch_loss_ = 0;
      epoch_top1_ = epoch_top5_ = epoch_samples_ = epoch_clipped_ = 0;
      epoch_from_ = in_epoch;
      epoch_start = now_s();
    }
    train_step();
    const bool epoch_end = step_ % steps_per_epoch_ == 0, run_end = step_ == total_steps_;
    bool timed = false;  // checkpoint.every_minutes: rank 0's clock says a save is due
    int stop = run_end ? 0 : agreed_stop_signal(timed);
    if (cfg_.check.every > 0 && (step_ % cfg_.check.every == 0 || run_end)) check_consistency();
    // A stop mid-epoch reports the part trained, as train.steps' end does: the resumed run's
    // record covers only the rest.
    if (epoch_end || run_end || stop) {
      epoch_started_ = !epoch_end;
      end_epoch(epoch, epoch_start, epoch_end, run_end, stop != 0);
    }
    // eval.every_steps within an epoch (at an epoch's end, end_epoch's record has it).
    const bool mid_eval = !epoch_end && !run_end && step_eval_due();
    if (mid_eval) validate_mid_epoch(stop != 0);
    const auto& ck = cfg_.checkpoint;
    const bool target = std::exchange(target_due_, false);
    const bool save = stop || timed || best_due_ || target || (ck.every_steps > 0 && step_ % ck.every_steps == 0) ||
                      (ck.at_epoch_end && (epoch_end || run_end)) ||
                      // A run that saves periodically keeps its last step too, not only the last period's.
                      (run_end && (ck.every_steps > 0 || ck.every_minutes > 0));
    if (save) save_checkpoint();
    if (target) {
      report_target();
      return;
    }
    // An evaluation or a save may take minutes on real data: a stop asked meanwhile is taken now,
    // rather than after one more step and one more save (past a batch system's grace period).
    // At the run's end only where the stop interrupted its last evaluation: a stop, with the
    // evaluation pending in the checkpoint, rather than a finished run without its figures.
    if (!stop && (run_end ? eval_pending_ : epoch_end || mid_eval || save)) {
      if ((stop = agreed_stop_signal_again()) != 0 && !save) save_checkpoint();
    }
    if (stop) {
      report_stop(stop);
      return;
    }
  }
  // The run's end: what it took and the best it reached (that of earlier runs it resumed too).
  // The rate is training's: the evaluations' time is counted apart.
  const double secs = now_s() - run_start_s_, train_s = std::max(secs - eval_s_, 0.0);
  const double img_s = double(step_ - first_step) * double(config_global_batch(cfg_, world_)) / std::max(train_s, 1e-9);
  JsonLine line("end");
  line.add("step", step_).add("steps_run", step_ - first_step).add("train_s", secs).add("eval_s", eval_s_)
      .add("img_s", img_s);
  std::string best;
  if (best_step_ > 0) {
    line.add("best_val_top1", best_top1_).add("best_step", best_step_);
    best = str_cat("; best validation top-1 ", fixed(best_top1_, 2), "% at step ", best_step_, " (epoch ",
                   epoch_of(best_step_), ")");
  }
  report(line, str_cat("finished: ", step_ - first_step, " steps in ", format_duration(secs), " (", fixed(img_s, 1),
                       " img/s", eval_s_ > 0 ? str_cat(" in the ", format_duration(train_s), " not evaluating") : "",
                       ")", best));
}

void Trainer::report_stop(int sig) {
  stopped_by_ = sig;
  const char* name = stop_signal_name(sig);
  JsonLine line("stop");
  line.add("step", step_).add("signal", name).add("checkpoint", last_checkpoint_);
  if (last_checkpoint_.empty())  // stopped before a first step of a fresh run: nothing to keep
    report(line, str_cat("stopped by ", name, " before the first step: nothing trained, nothing saved"), true);
  else  // --resume PATH from another run's folder: auto would look in this run's
    report(line, str_cat("stopped by ", name, " after step ", step_, " of ", total_steps_, ": ", last_checkpoint_,
                         " holds it; continue with --resume ",
                         checkpoint_in(last_checkpoint_, ckpt_dir_) ? "auto" : last_checkpoint_),
           true);
}

int Trainer::agreed_stop_signal(bool& save_due, bool again) {
  // Collective, between steps (the communication thread is idle): every rank stops after the
  // same step, whichever ranks the signal reached, and saves a timed checkpoint after the same
  // step, when rank 0's clock says so (ranks' clocks need not agree). A few microseconds per step.
  const double every_s = cfg_.checkpoint.every_minutes * 60;
  save_due = false;
  if (!stop_handlers_installed() && every_s <= 0) return 0;
  int flags[2] = {stop_handlers_installed() ? stop_signal() : 0,
                  rank_ == 0 && every_s > 0 && now_s() - last_save_s_ >= every_s};
  if (world_ > 1) {
    const CtlWatch w = watch_ctl({"the end of step ", step_, " (where the ranks compare stop signals)"});
    if (!again) inject_ctl_fault();
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, ctl_comm_->mpi()));
  }
  save_due = flags[1] != 0;
  return flags[0];
}

BackendOptions Trainer::backend_options() const {
  // The node-local rank from MPI itself picks the GPU, whatever the launcher.
  BackendOptions o = cfg_.cuda;
  o.local_rank = grad_comm_->local_rank();
  o.local_size = grad_comm_->local_size();
  return o;
}

void Trainer::end_epoch(int64_t epoch, double epoch_start, bool epoch_end, bool run_end, bool stopping) {
  // This epoch's training statistics over all ranks (between steps: the main thread may use MPI).
  // With the images each rank replaced (undecodable: the next decodable sample of its share).
  double sums[5] = {epoch_loss_, double(epoch_top1_), double(epoch_top5_), double(epoch_samples_),
                    double(epoch_skipped_)};
  {
    const CtlWatch w = watch_ctl({"the end of epoch ", epoch + 1, " (its statistics' sums)"});
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums, 5, MPI_DOUBLE, MPI_SUM, ctl_comm_->mpi()));
  }
  const double n = std::max(1.0, sums[3]), secs = now_s() - epoch_start;
  JsonLine line("epoch");
  line.add("epoch", epoch + 1)
      .add("step", step_)
      .add("train_loss", sums[0] / n)
      .add("train_top1", 100 * sums[1] / n)
      .add("train_top5", 100 * sums[2] / n)
      .add("epoch_s", secs)
      .add("img_s", sums[3] / secs);
  std::string text = str_cat("epoch ", epoch + 1, "/", cfg_.train.epochs, ": train loss ", fixed(sums[0] / n, 4),
                             " top1 ", fixed(100 * sums[1] / n, 2), "% top5 ", fixed(100 * sums[2] / n, 2), "%");
  // Begun by a resume mid-epoch, or cut short (train.steps, a stop): the figures are of this
  // run's part of the epoch only, and say so.
  if (const int64_t last = step_ - epoch * steps_per_epoch_; epoch_from_ > 0 || last < steps_per_epoch_) {
    line.add("first_step_in_epoch", epoch_from_ + 1).add("last_step_in_epoch", last);
    text += str_cat(" (its steps ", epoch_from_ + 1, "-", last, " of ", steps_per_epoch_, " only: ",
                    epoch_from_ > 0 ? "resumed mid-epoch" : "", epoch_from_ > 0 && last < steps_per_epoch_ ? ", " : "",
                    last < steps_per_epoch_ ? (stopping ? "stopped mid-epoch" : "the run ends mid-epoch") : "", ")");
  }
  // Said every epoch, not only in the first one's warnings: a share of the data lost for good.
  if (const int64_t skipped = int64_t(sums[4]); skipped > 0) {
    line.add("train_skipped", skipped);
    text += str_cat(" (", skipped, " undecodable image(s) replaced by others of the ranks' shares)");
  }
  const int64_t every = cfg_.eval.every_epochs;
  const bool due = (epoch_end && every > 0 && (epoch + 1) % every == 0) || (run_end && cfg_.eval.at_end) ||
                   ((epoch_end || run_end) && step_eval_due());
  eval_pending_ = due && stopping;
  if (eval_pending_) {
    text += ", evaluation skipped (stopping: a resume makes it first)";
  } else if (due && !validate(line, text)) {
    eval_pending_ = true;
    text += ", evaluation interrupted (stopping: a resume makes it first)";
  }
  if (cfg_.train.clip_grad_norm > 0) {  // the steps of this epoch in this run: the same on every rank
    line.add("clipped_steps", epoch_clipped_);
    text += str_cat(", gradients clipped in ", epoch_clipped_, " step(s)");
  }
  const ProcessUsage u = process_usage();
  line.add("rss_mib", u.rss_mib).add("open_fds", u.open_fds);
  metrics().write(line);
  log_line(str_cat(text, ", ", format_duration(secs), " (", fixed(sums[3] / secs, 1), " img/s)"));
}

bool Trainer::validate(JsonLine& line, std::string& text) {
  const double eval_start = now_s();
  const EvalResult v = evaluate();
  const EvalResult e = has_ema() && !v.interrupted ? evaluate_ema() : EvalResult{};
  if (v.interrupted || e.interrupted) {
    eval_s_ += now_s() - eval_start;
    return false;
  }
  line.add("val_loss", v.loss).add("val_top1", v.top1_pct()).add("val_top5", v.top5_pct())
      .add("val_samples", v.samples).add("val_skipped", v.skipped).add("val_s", v.seconds);
  text += str_cat(", val loss ", fixed(v.loss, 4), " top1 ", fixed(v.top1_pct(), 2), "% top5 ",
                  fixed(v.top5_pct(), 2), "% (", v.samples, " images", skipped_note(v), ")");
  double score = v.top1_pct();
  if (has_ema()) {
    line.add("ema_val_loss", e.loss).add("ema_val_top1", e.top1_pct()).add("ema_val_top5", e.top5_pct());
    text += str_cat(", EMA loss ", fixed(e.loss, 4), " top1 ", fixed(e.top1_pct(), 2), "% top5 ",
                    fixed(e.top5_pct(), 2), "%");
    score = e.top1_pct();  // as timm: the average is what a run with one is judged by
  }
  eval_s_ += now_s() - eval_start;
  // The same figures on every rank (evaluate() sums over all), so every rank decides alike.
  if (best_step_ == 0 || score > best_top1_) {
    const bool reached_before = target_reached();
    best_top1_ = score;
    best_step_ = step_;
    best_due_ = cfg_.checkpoint.keep_best;
    if (best_due_) text += ", the best so far";
    target_due_ = !reached_before && target_reached();
  }
  return true;
}

void Trainer::validate_mid_epoch(bool stopping) {
  const int64_t epoch = epoch_of(step_);
  JsonLine line("validation");
  line.add("epoch", epoch).add("step", step_);
  std::string text = str_cat("step ", step_, " (epoch ", epoch, ", its step ", step_ - (epoch - 1) * steps_per_epoch_,
                             " of ", steps_per_epoch_, "): ");
  // As at an epoch's end: a stop takes precedence, and the resume makes the evaluation first.
  eval_pending_ = stopping;
  if (stopping) {
    log_line(text + "evaluation skipped (stopping: a resume makes it first)");
    return;
  }
  const size_t bare = text.size();
  if (!validate(line, text)) {
    eval_pending_ = true;
    log_line(text + "evaluation interrupted (stopping: a resume makes it first)");
    return;
  }
  metrics().write(line);
  log_line(text.erase(bare, 2));  // validate() put ", " before its figures
}

bool Trainer::evaluate_pending() {
  eval_pending_ = false;
  // At an epoch's end, or within one (eval.every_steps).
  const int64_t epoch = epoch_of(step_);  // the one the step ends or lies in
  JsonLine line("validation");
  line.add("epoch", epoch).add("step", step_);
  std::string text = step_ % steps_per_epoch_ ? str_cat("step ", step_, " (epoch ", epoch, ")")
                                              : str_cat("epoch ", epoch, "/", cfg_.train.epochs);
  text += ": the evaluation the last run's stop skipped";
  if (!validate(line, text)) {  // stopped again: still pending, in the checkpoint as it is
    eval_pending_ = true;
    return false;
  }
  metrics().write(line);
  log_line(text);
  // Its file again, its meta now holding the record (and keep_best's link made).
  if (best_due_ || target_due_) save_checkpoint();
  if (!std::exchange(target_due_, false)) return false;
  report_target();
  return true;
}

void Trainer::report_target() {
  // As MLPerf's runs: the time to the target is the figure of merit.
  const double secs = now_s() - run_start_s_;
  const int64_t epoch = epoch_of(step_);  // as the epoch records number it
  report(JsonLine("target").add("step", step_).add("epoch", epoch)
             .add("val_top1", best_top1_).add("target_top1", cfg_.train.target_top1)
             .add("train_s", secs).add("checkpoint", last_checkpoint_),
         str_cat("validation top-1 ", fixed(best_top1_, 2), "% reached train.target_top1 ",
                 cfg_.train.target_top1, "% at step ", step_, " (epoch ", epoch, ") after ", format_duration(secs),
                 " of this run: stopping (", last_checkpoint_, " holds it)"),
         true);
}

}  // namespace rt::trainer

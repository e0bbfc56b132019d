// The trainer's configuration: plain structs filled from a YAML file and `--set key=value`
// overrides. Every key, its type and its default are listed once, beside the field, here (or in
// the library struct the section maps onto: rt::data::DataConfig, rt::SgdConfig,
// rt::ScheduleConfig, rt::comm::CommConfig).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "comm/allreduce.h"
#include "data/loader.h"
#include "nn/error.h"
#include "nn/loss_scale.h"
#include "nn/optimizer.h"
#include "nn/resnet.h"
#include "nn/schedule.h"
#include "trainer/emulate.h"

namespace rt::trainer {

// A bad configuration: names the file and line (or the --set argument) and the key.
class ConfigError : public Error {
 public:
  using Error::Error;
};

struct ModelConfig {                  // key prefix: model.
  std::string name = "resnet50";      // resnet18/34/50/101/152, resnext50_32x4d, resnext101_32x4d,
                                      // resnext101_32x8d, resnext101_64x4d, wide_resnet50_2,
                                      // wide_resnet101_2, squeeze-and-excitation seresnet18/34/50/
                                      // 101/152, seresnext50_32x4d, seresnext101_32x4d/32x8d/64x4d,
                                      // ResNet-D resnet18d/26d/34d/50d/101d/152d, resnext50d_32x4d,
                                      // seresnext26d_32x4d, resnet26t/50t, ECA ecaresnet26t/50d/
                                      // 50t/101d, ecaresnetlight, CIFAR resnet20/32/44/56/110
  int64_t classes = 1000;             // classifier outputs (must cover the dataset's labels)
  double width = 1.0;                 // multiplies every channel count
  bool zero_init_residual = true;     // gamma = 0 on each branch's last BN (Goyal et al. 2017)
  std::string cifar_shortcut = "A";   // CIFAR models: A = zero-padded identity, B = projection
  double drop_path = 0.0;             // stochastic depth: the last residual block's drop rate,
                                      //   linear from 0 in the first (timm's drop_path_rate); 0 = off
  int bn_group = 1;                   // ranks whose batch norms share training statistics: 1 = each
                                      //   rank its own batch (DDP's default), 0 = all ranks
                                      //   (SyncBatchNorm), k = blocks of k consecutive ranks
};

// A small ImageNet-like folder dataset made at start when data.root does not exist yet.
struct GenerateConfig {               // key prefix: data.generate.
  int classes = 0;                    // 0: never generate (a missing root is an error)
  int train_per_class = 100;          // training images per class
  int val_per_class = 20;             // validation images per class
  int size = 64;                      // side of the stored images, pixels
  uint64_t seed = 1;                  // the images are a pure function of this seed
};

struct OptimConfig {                  // key prefix: optimizer.
  double lr = 0.1;                    // peak lr per 256 images: base_lr = lr * global batch / 256
  std::string lr_scaling = "linear";  // how lr (and final_lr) follow the global batch B: linear
                                      //   (lr * B / 256), sqrt (lr * sqrt(B / 256): timm's rule
                                      //   for adaptive optimizers) or none (lr as given)
  SgdConfig sgd;                      // momentum, nesterov, weight_decay, decay_bn_and_bias, lars...
  bool freeze_bn_stats = false;       // frozen BN layers (optimizer.freeze, a leading run of the
                                      //   network) normalize with their running statistics in
                                      //   training too and keep them: PyTorch's .eval() on them
};

struct TrainConfig {                  // key prefix: train.
  int64_t epochs = 90;                // length of the run (and of cosine/poly decay)
  int64_t steps = 0;                  // >0: stop after this many optimizer steps in total
  int64_t batch = 32;                 // images per rank per forward/backward pass
  int64_t accumulate = 1;             // passes per optimizer step (global batch = ranks * batch * this)
  LossKind loss = LossKind::softmax;  // cross_entropy (softmax) or bce (a sigmoid per class; nn/ops.h)
  double label_smoothing = 0.0;       // the targets' smoothing eps
  double bce_threshold = -1;          // bce: targets above this become 1, the rest 0 (timm's
                                      //   target_threshold, 0.2 in ResNet strikes back); < 0: soft
  double mixup = 0.0;                 // >0: mixup, weights ~ Beta(this, this) (data/mixup.h); 0 = off
  double cutmix = 0.0;                // >0: CutMix, the same; with mixup too, either per batch
  double ema = 0.0;                   // >0: also keep a moving average of the weights, this decay
  bool ema_warmup = true;             // decay min(ema, (1 + n) / (10 + n)) after n updates
  int64_t ema_every = 1;              // update the average after every this many optimizer steps
  int64_t ema_copy_epochs = 0;        // in the first this many epochs (and at the first update
                                      //   after) the average takes the weights as they are, as
                                      //   torchvision's reference script resets its average
                                      //   during the lr warm-up
  double clip_grad_norm = 0.0;        // >0: the step's gradient, when its L2 norm is above this,
                                      //   scaled to it (torch.nn.utils.clip_grad_norm_); 0 = off
  double target_top1 = 0.0;           // >0: stop once a validation top-1 (%) reaches this (the
                                      //   moving average's with train.ema), as MLPerf's runs; 0 = off
};

struct CheckpointConfig {             // key prefix: checkpoint.
  std::string dir;                    // "" = <run_dir>/checkpoints
  int64_t every_steps = 0;            // >0: also save every this many steps
  double every_minutes = 0;           // >0: also save when this long has passed since the last
                                      //   save (or the start), by rank 0's clock
  bool at_epoch_end = true;           // save after every epoch (and at the end of the run)
  int keep = 3;                       // newest checkpoints kept; older ones are deleted
  bool keep_best = false;             // also keep the checkpoint of the best validation top-1 so
                                      //   far (the moving average's with train.ema) as best.rtck
};

struct EvalConfig {                   // key prefix: eval.
  int64_t every_epochs = 1;           // validate after every this many epochs; 0 = never
  int64_t every_steps = 0;            // also after every this many steps (mid-epoch: a record of
                                      //   type "validation"; at an epoch's end in its record); 0 = never
  bool at_end = true;                 // validate after the last epoch whatever every_epochs says
  int64_t batch = 0;                  // images per rank per evaluation forward pass (also --eval's
                                      //   and --predict's); 0 = train.batch
  bool during_run() const { return every_epochs > 0 || every_steps > 0; }
  bool any() const { return during_run() || at_end; }
};

struct LogConfig {                    // key prefix: log.
  std::string jsonl;                  // metrics file; "{rank}" -> rank; "" = rank 0 only, at
                                      //   <run_dir>/metrics.jsonl; "none" = no file
  int64_t interval = 10;              // steps between progress updates (plain lines when piped)
  bool progress = true;               // rank 0 shows progress on stdout
  bool print_config = true;           // rank 0 prints the resolved configuration at start
  bool grad_norm = false;             // every step record carries the gradient's L2 norm (one
                                      //   more pass over the gradients; always with clipping)
  std::string timeline;               // Chrome trace of a window of steps; "{rank}" -> rank
                                      //   (else rank 0 only); "" = none
  int64_t timeline_skip = 0;          // steps of this run before the window (warm-up)
  int64_t timeline_steps = 20;        // steps in the window
};

struct CheckConfig {                  // key prefix: check.
  int64_t every = 200;                // every this many steps ranks compare a parameter checksum
  bool finite = true;                 // stop at the first non-finite gradient, naming the step,
                                      //   the rank and the layer where it arose (one pass/step)
};

// Faults injected on purpose, to prove that the job reacts to them (tests, fault drills).
struct DebugConfig {                  // key prefix: debug.
  std::string fault = "none";         // none | nan | inf | stall | stall_eval | kill | throw |
                                      //   stop (SIGUSR1 to itself, as a batch system's notice)
  int rank = 0;                       // the rank that misbehaves
  int64_t step = 1;                   // ... at the start of this step (1 = the first;
                                      //   stall_eval: in the evaluation after this step)
  std::string param;                  // nan/inf: the parameter poisoned ("" = the first
                                      //   convolution's weight), e.g. layer1.0.conv1.weight
};

struct Config {
  ModelConfig model;
  data::DataConfig data;              // data.*: root | train_list/val_list | train_shards/...
  GenerateConfig generate;
  OptimConfig optimizer;
  ScheduleConfig schedule;            // schedule.*; base_lr and total_epochs are derived
  TrainConfig train;
  LossScaleConfig loss_scale;         // loss_scale.*: mode, init, growth... (nn/loss_scale.h)
  comm::CommConfig comm;              // comm.*: algorithm, bucket_bytes, overlap, ...
  CheckpointConfig checkpoint;
  EvalConfig eval;
  LogConfig log;
  CheckConfig check;
  DebugConfig debug;
  EmulateConfig emulate;              // emulate.*: compute_ms, forward_fraction (trainer/emulate.h)
  BackendOptions cuda;                // cuda.*: conv_algos, deterministic, workspace_mib, algo_cache (nn/ops.h);
                                      //   read by the cuda backends only
  uint64_t seed = 0;                  // model initialisation and data order/augmentation
  // onednn (alias cpu) | onednn-direct | onednn-winograd | reference | cuda | cuda-tf32 | cuda-bf16 |
  // cuda-fp16 (GPU builds)
  std::string backend = "onednn";
  int threads = 0;                    // OpenMP threads per rank; 0 = OMP_NUM_THREADS, else
                                      //   the cores of this node divided among its ranks
  std::string run_dir;                // "" = runs/<config file name without .yaml>

  // Where each key got its value ("file.yaml:12" or "--set"), for error messages.
  std::map<std::string, std::string> origin;
  std::string source;                 // the config file, as given
};

// Reads a config file, then applies "key=value" overrides in order. Throws ConfigError naming
// file:line and key for an unreadable file, bad YAML, an unknown key or a value of the wrong type.
// Does not validate ranges: see config_validate.
Config config_load(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from YAML text (`name` stands in for the file in messages; used for checkpoints).
// Both resolve the defaults that depend on other keys: with backend cuda-fp16, loss_scale.mode
// unset in the text and the overrides becomes dynamic.
Config config_parse(const std::string& yaml, const std::string& name,
                    const std::vector<std::string>& overrides = {});
// Applies one "key=value" (value in YAML syntax: 0.1, true, [30, 60], text).
void config_set(Config& cfg, const std::string& assignment);

// Throws ConfigError naming where the key was set, the key and the value when a value is out of
// range or unknown (batch <= 0, an unknown model, backend, schedule kind or algorithm, ...).
// `cuda` throws "not built" in CPU builds.
void config_validate(const Config& cfg);

// How many data sources the config gives (root; the lists; the shard sets; synthetic): exactly
// one is valid.
int config_data_sources(const data::DataConfig& d);

// The resolved configuration as YAML (every key, in declaration order), for printing and for
// checkpoints; config_parse of it gives the same Config.
std::string config_to_yaml(const Config& cfg);

// Where `key` got its value ("file.yaml:12", "--set", or "file.yaml (default)"), for errors.
std::string config_origin(const Config& cfg, const std::string& key);

// Every known key, in order ("model.name", ...).
std::vector<std::string> config_keys();

// The model.* keys whose values differ between a checkpoint's saved configuration and `now`,
// as "model.width: 0.25 in the file, 0.5 here; ..."; "" when none do or the text does not parse.
std::string config_model_changes(const std::string& saved_yaml, const Config& now);
// The keys for which `compared(key)` is true whose values differ between `other_yaml` and `now`,
// as "<key>: <other's value> <other_label>, <now's> <now_label>; ..."; "" when none do or the
// text does not parse.
std::string config_changes(const std::string& other_yaml, const Config& now,
                           const std::function<bool(const std::string&)>& compared, const std::string& other_label,
                           const std::string& now_label);
// Whether ranks of one job may hold different values of `key`: how many threads, where the
// data, the run folder and the logs are (per node); what the data holds is compared apart.
bool config_key_per_rank(const std::string& key);

// Derived values.
// The keys whose values differ from a default Config's, in table order.
std::vector<std::string> config_changed_keys(const Config& cfg);
// The keys set away from their defaults that have no effect with the rest of the configuration,
// each with what reads it: "optimizer.beta1 (read by optimizer.kind adamw and lamb only); ...";
// "" when there are none. Compared with the defaults, not by origin: a saved configuration sets
// every key.
std::string inapplicable_keys(const Config& cfg);
double config_global_batch(const Config& cfg, int world);     // world * batch * accumulate
int64_t config_eval_batch(const Config& cfg);                 // eval.batch, or train.batch where 0
double config_base_lr(const Config& cfg, int world);          // lr * config_lr_factor
// What optimizer.lr and schedule.final_lr are multiplied by at this global batch B (by
// optimizer.lr_scaling): B / 256, sqrt(B / 256) or 1.
double config_lr_factor(const Config& cfg, int world);
ScheduleConfig config_schedule(const Config& cfg, int world);  // base_lr, total_epochs filled
ResNetConfig config_resnet(const Config& cfg);
std::string config_run_dir(const Config& cfg);
std::string config_checkpoint_dir(const Config& cfg);
// The file a rank writes for a per-rank path key (log.jsonl, log.timeline): "{rank}" becomes the
// rank; without it only rank 0 writes the file ("" for the others).
std::string config_rank_file(const std::string& pattern, int rank);

}  // namespace rt::trainer

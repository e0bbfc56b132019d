// Checkpoints: the whole training state in one self-checking binary file, written atomically.
//
// File format, version 1 (all integers little-endian; the file is read and written on x86-64):
//
//   offset  size  field
//   0       8     magic "RTCKPT01"
//   8       4     version (u32) = 1
//   12      4     number of sections (u32)
//   16      8     payload bytes (u64): everything after this 32-byte header
//   24      8     payload checksum (u64): FNV-1a 64 taken over the payload as consecutive
//                 little-endian u64 words (h = (h ^ w) * 0x100000001b3, h0 = 0xcbf29ce484222325)
//   32      ...   payload: sections, each
//                   8 bytes  tag, ASCII, NUL-padded ("meta", "config", "params", ...)
//                   8 bytes  length L of the data (u64)
//                   L bytes  data, then zero padding to a multiple of 8
//
// Sections (in this order; a reader finds them by tag and refuses a file that lacks one of the
// first four; a file without "momentum" is a weights file, see Checkpoint::weights_only):
//   "meta"      20 x i64: format of CheckpointMeta below (step, epoch, data position, optimizer
//               step count, ranks, per-rank batch, the model fingerprint's six fields, seed, the
//               loss scale as f64 bits and its good-step count (both 0 without loss scaling),
//               passes per step, the run's best validation top-1 so far as f64 bits and its
//               step (checkpoint.keep_best, train.target_top1; both 0 before any evaluation), flags
//               (bit 0: a stop skipped the evaluation due at this step, which a resume makes first;
//               0 in files written before it existed))
//   "config"    the run's resolved configuration as YAML text (config_to_yaml)
//   "params"    the flat parameter buffer, f32, fingerprint.grad_elems values (padding included)
//   "state"     BN running statistics, f32, fingerprint.state_elems values (averaged over ranks)
//   "momentum"  the optimizer's momentum buffer, f32, laid out like "params" (AdamW's and LAMB's
//               first moment)
//   "moment2"   optional (optimizer.kind adamw, lamb): their second moment, laid out the same
//   "bn_ranks"  optional (runs of 2 or more ranks): each rank's own BN running statistics, f32,
//               world x state_elems values, rank 0's first. Ranks keep their own statistics while
//               training (each normalises its own batches); a resume on the same ranks continues
//               them exactly, while "state", their average, serves evaluation on any rank count.
//   "ema"       optional (train.ema): the weights' moving average, f32, grad_elems parameters
//               laid out like "params", then state_elems BN statistics (their moving average,
//               averaged over the ranks like "state")
//   "ema_bnr"   optional ("ema" of 2 or more ranks): each rank's own moving average of its BN
//               statistics, laid out like "bn_ranks"
//   "layout"    optional (files written since it exists): where each tensor lies, one text line
//               each, "p" (parameter) or "s" (BN statistic), name, offset, count, dims, separated
//               by tabs, the dims by commas, e.g. "p\tfc.weight\t0\t2048000\t1000,2048"; lets
//               --weights take tensors by name from a checkpoint of another model
//   "tsteps"    optional (optimizer.kind adamw, lamb): how many updates each parameter tensor has
//               had, i64, one per tensor in layout order (torch.optim's per-parameter "step":
//               their bias corrections count it; a layer frozen for a while has had fewer). A file
//               without it gives each tensor whose moments are all zero 0, the others the
//               optimizer's step count
//   "data"      optional (files written since it exists): 3 x i64, the training data the position
//               counts in: its sample count, data.repeated_augment and a hash of its labels in
//               sample order (0: not known, as for synthetic data); a mid-epoch resume on other
//               data is refused, as the rest of the epoch would come from another order
//   "classes"   optional: the training data's class names in label order, each followed by a NUL
//               (folder and shard sets name them; list files and synthetic data by number), so
//               that --predict names classes wherever the file goes
//
// The data loader's RNG is a pure function of (seed, epoch) and the model has no other random
// state, so the data position (epoch, batches consumed) is all the randomness a resume needs.
// A file is named ckpt-<step, 10 digits>.rtck; it is first written as .ckpt-<step>.rtck.tmp in the
// same folder, fsynced, renamed over the final name, and the folder is fsynced: a crash leaves
// either the old set of checkpoints or the new one, never a half-written file under a final name.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/agreement.h"
#include "data/loader.h"
#include "nn/arena.h"
#include "nn/error.h"

namespace rt::trainer {

// A checkpoint that cannot be used: missing, truncated, corrupt, or from another model.
// The message names the file.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

struct CheckpointMeta {
  int64_t step = 0;              // optimizer steps completed in the run
  int64_t epoch = 0;             // epoch the next step belongs to
  data::Position position;       // where each rank's loader resumes
  int64_t optimizer_steps = 0;   // Sgd::steps() (0: momentum not yet initialised)
  int64_t world = 1;             // ranks that wrote it (resuming on another count is allowed)
  int64_t batch = 0;             // per-rank batch
  int64_t accumulate = 1;        // passes per step (train.accumulate); position counts batches
  comm::ModelFingerprint model;  // refuses a checkpoint of another model
  uint64_t seed = 0;
  double loss_scale = 0;         // LossScaler::scale() (0: none saved; a resume starts at init)
  int64_t loss_scale_good = 0;   // LossScaler::good_steps()
  double best_top1 = 0;          // the run's best validation top-1 (%) so far ...
  int64_t best_step = 0;         // ... and the step it was measured at (0: none yet)
  bool eval_pending = false;     // a stop skipped the evaluation due at this step: the resume makes it
  int64_t data_samples = 0;      // section "data" (all 0: a file without it)
  int64_t data_repeats = 0;
  uint64_t data_order = 0;
};

// One line of the "layout" section.
struct CheckpointTensor {
  bool state = false;          // a BN statistic in "state", else a parameter in "params"
  std::string name;            // e.g. "layer1.0.conv1.weight", "layer1.0.bn1.running_mean"
  std::vector<int64_t> dims;   // a parameter's canonical dims; {count} for a statistic
  uint64_t offset = 0, count = 0;
};

struct Checkpoint {
  CheckpointMeta meta;
  std::string config_yaml;
  std::vector<float> params, state, momentum;
  std::vector<float> moment2;           // "moment2", or empty
  std::vector<int64_t> tensor_steps;    // "tsteps", or empty
  std::vector<float> rank_state;        // "bn_ranks", or empty
  std::vector<float> ema;               // "ema" (params then state), or empty
  std::vector<float> ema_rank_state;    // "ema_bnr", or empty
  std::vector<CheckpointTensor> layout;  // "layout", or empty
  std::vector<std::string> classes;      // "classes" (always kept: it is small), or empty
  // No "momentum" section: weights only (tools/torch_weights.py import writes such files, with a
  // fingerprint of sizes alone): --weights and --eval --weights take its tensors by name; a resume
  // refuses it.
  bool weights_only = false;
};

// The arena's tensors as the "layout" section lists them (for any element type), the section's
// text, and its reading: throws CheckpointError naming the path and line of a malformed entry or
// one outside "params" (`params` values) or "state" (`state` values).
template <class T>
std::vector<CheckpointTensor> checkpoint_layout(const Arena<T>& arena) {
  std::vector<CheckpointTensor> out;
  for (const ParamInfo& p : arena.layout()) out.push_back({false, p.name, p.dims, p.offset, p.count});
  for (const StateInfo& s : arena.state_layout()) out.push_back({true, s.name, {int64_t(s.count)}, s.offset, s.count});
  return out;
}
std::string checkpoint_layout_text(std::span<const CheckpointTensor> layout);
std::vector<CheckpointTensor> checkpoint_layout_parse(const std::string& text, size_t params, size_t state,
                                                      const std::string& path);

// --weights: copies each of the arena's tensors that `ck` holds under the same name with the same
// dims into `params` / `state` (host buffers laid out as the arena's) and returns the others, as
// "name (why)", left as they were.
// Defined for float (the trainer) and double (the reference backend in double, in tests).
template <class T>
std::vector<std::string> checkpoint_copy_matching(const Checkpoint& ck, const Arena<T>& arena,
                                                  std::type_identity_t<std::span<T>> params,
                                                  std::type_identity_t<std::span<T>> state);

// The tensors `ck` lists that the arena has none of by that name (another model's: a CIFAR
// ResNet's projection shortcuts, resnet34's blocks beyond resnet18's), as "name [dims]".
template <class T>
std::vector<std::string> checkpoint_unused(const Checkpoint& ck, const Arena<T>& arena);

// --eval and --predict (`purpose`): every tensor of the arena copied as checkpoint_copy_matching
// does, and none of the file's left over; else CheckpointError naming `path`, `model` and the
// first tensor at fault, `hint` added (where another model's tensors would be scored without a word).
template <class T>
void checkpoint_copy_whole(const Checkpoint& ck, const Arena<T>& arena, std::type_identity_t<std::span<T>> params,
                           std::type_identity_t<std::span<T>> state, const std::string& path, const std::string& model,
                           const std::string& purpose, const std::string& hint = "");

// Writes atomically (see above); an empty `momentum` writes a weights file (no "momentum"
// section), an empty optional section is left out. Throws CheckpointError naming the path on any
// I/O error.
void checkpoint_write(const std::string& path, const CheckpointMeta& meta, const std::string& config_yaml,
                      std::span<const float> params, std::span<const float> state,
                      std::span<const float> momentum, std::span<const float> rank_state = {},
                      std::span<const CheckpointTensor> layout = {}, std::span<const float> ema = {},
                      std::span<const float> ema_rank_state = {}, std::span<const float> moment2 = {},
                      std::span<const std::string> classes = {}, std::span<const int64_t> tensor_steps = {});

// Which sections checkpoint_read keeps; the others are read and checked (checksum, sizes) but not
// held, their vectors left empty: a resume's peak memory is what it uses, not the file and more.
struct CheckpointParts {
  bool weights = true;     // "params", "state", "layout"
  bool optimizer = true;   // "momentum", "moment2", "tsteps"
  bool rank_state = true;  // "bn_ranks" (and "ema_bnr" with `ema`)
  bool ema = true;         // "ema"
  static CheckpointParts none() { return {false, false, false, false}; }  // meta and config
};

// Reads and verifies (magic, version, length, checksum, sections, sizes). Throws CheckpointError
// naming the path and what is wrong ("truncated: 1000 bytes, the header promises 5000", ...).
Checkpoint checkpoint_read(const std::string& path, const CheckpointParts& keep = {});

// model.name in the checkpoint's saved configuration; "" where it has none.
std::string checkpoint_model_name(const Checkpoint& ck);

// Throws CheckpointError naming the path when ckpt was written for a model with another
// fingerprint (names both models when the configs say which), `why` appended to the message.
void checkpoint_check_model(const Checkpoint& ckpt, const std::string& path,
                            const comm::ModelFingerprint& model, const std::string& model_name,
                            const std::string& why = "");

// "dir/ckpt-0000001234.rtck".
std::string checkpoint_path(const std::string& dir, int64_t step);
// Checkpoint files in dir, newest (highest step) first; empty when dir does not exist.
std::vector<std::string> checkpoint_list(const std::string& dir);
// The newest checkpoint that reads back intact, or "" when there is none. Damaged newer ones are
// reported through `skipped` (one line each) and passed over. With `found`, the one chosen is
// left there as read with `keep` (the search reads it whole anyway: a resume need not read it again).
std::string checkpoint_find_latest(const std::string& dir, std::vector<std::string>* skipped = nullptr,
                                   Checkpoint* found = nullptr, const CheckpointParts& keep = CheckpointParts::none());
// Deletes all but the newest `keep` checkpoints (and stale temporary files) in dir.
void checkpoint_prune(const std::string& dir, int keep);
// checkpoint.keep_best: "dir/best.rtck", which checkpoint_list, --resume auto and pruning pass over.
std::string checkpoint_best_path(const std::string& dir);
// Whether the file `path` lies in the folder `dir` (both as the file system resolves them):
// where --resume auto would find it.
bool checkpoint_in(const std::string& path, const std::string& dir);
// Makes the finished checkpoint `path` also dir/best.rtck, atomically (a hard link, or a copy
// where the file system has none, under a temporary name renamed over the old one; the folder
// fsynced): a crash leaves the old best or the new one. Throws CheckpointError naming the file.
void checkpoint_keep_best(const std::string& path);

// Moves the checkpoints of `dir` written after `step` (and best.rtck where it is one of them or
// unreadable) into a new folder dir/superseded-<UTC time>: a run that starts over in a used run
// folder, or goes back to an older checkpoint, would otherwise have --resume auto and pruning take
// those later files of another history for its own. Nothing is deleted. Returns the new folder
// ("" when nothing was moved), the files moved through `moved`; throws CheckpointError naming
// the file it cannot move. `best_step`: the step of the best.rtck left in place (-1: none).
std::string checkpoint_set_aside(const std::string& dir, int64_t step, std::vector<std::string>* moved = nullptr,
                                 int64_t* best_step = nullptr);
// fsync of a folder, so that the renames in it last; throws CheckpointError naming it.
void checkpoint_fsync_dir(const std::string& dir);

// FNV-1a 64 over little-endian u64 words (n must be a multiple of 8), continuing from h.
uint64_t checkpoint_hash(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

}  // namespace rt::trainer

// The per-rank input pipeline as the trainer sees it: a dataset (folder, list file, packed shards
// or synthetic), this rank's share of each epoch's shared permutation, decode + augment threads
// and a bounded queue of ready batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/autoaugment.h"
#include "data/image.h"
#include "nn/host_memory.h"
#include "nn/normalize.h"

namespace rt::data {

enum class Split : uint8_t { train, val };

// What a batch carries: normalized floats for a backend that takes them as they are, or the
// augmented 8-bit pixels for one that normalizes them itself (a quarter of the bytes to copy, no
// float pass on the CPU).
enum class Output : uint8_t { f32, u8 };

// Plain settings; the trainer fills them from YAML. Defaults written once, here.
struct DataConfig {
  std::string root;             // ImageNet layout: root/train/<class>/*, root/val/<class>/*
  std::string train_list;       // alternative: list file, one "path label" per line (paths relative
  std::string val_list;         //   to the list file's folder unless absolute)
  std::string train_shards;     // alternative: packed shards (a shard set's index file)
  std::string val_shards;
  bool synthetic = false;       // random tensors, no I/O (benchmarks)
  int64_t synthetic_samples = 1281167;  // per split "epoch" in synthetic mode (ImageNet-1k train size)
  int synthetic_classes = 1000;
  int image_size = 224;         // output height = width (training; evaluation too unless below)
  int eval_image_size = 0;      // evaluation's side; 0 = image_size (a larger one: FixRes's effect)
  int eval_resize = 0;          // evaluation: short side resized to this, then the centre crop;
                                //   0 = eval side * 256 / 224
  int repeated_augment = 1;     // >1: each epoch draws n / this samples, each this many times
                                //   (on different ranks, differently augmented): RASampler
  int threads = 0;              // decode threads per rank; 0 = cores available to this rank
  int queue_depth = 4;          // ready batches buffered ahead of the model
  float mean[3] = {0.485f, 0.456f, 0.406f};  // RGB, applied after scaling pixels to [0, 1]
  float std[3] = {0.229f, 0.224f, 0.225f};
  float min_scale = 0.08f;      // random-resized-crop area range
  float max_scale = 1.0f;
  double min_ratio = 3.0 / 4.0; // random-resized-crop aspect ratio (w / h) range
  double max_ratio = 4.0 / 3.0;
  bool flip = true;             // random horizontal flip (training only)
  Interpolation interpolation = Interpolation::bilinear;  // training crops' resize: bilinear
                                //   (torchvision's), bicubic, or random (either, per crop: timm's)
  Interpolation eval_interpolation = Interpolation::bilinear;  // evaluation's: bilinear or bicubic
  AutoAugmentSpec auto_augment; // AutoAugment, RandAugment or TrivialAugmentWide (training only)
  float random_erasing = 0;     // probability of erasing a random box of a training crop
  uint64_t seed = 0;            // permutation of epoch e: seeded by (seed, e); augmentation too
  Output output = Output::f32;  // f32: Batch::images; u8: Batch::pixels (normalize with norm_params)
  // Not a config key: a model's class names (its checkpoint's), which label a validation folder
  // whose root has no train/ to name them (an evaluation on the validation split alone).
  std::vector<std::string> known_classes;
};

// The side of the evaluation split's images, and what their short side is resized to first.
inline int eval_image_size(const DataConfig& c) { return c.eval_image_size > 0 ? c.eval_image_size : c.image_size; }
inline int eval_resize(const DataConfig& c) {
  return c.eval_resize > 0 ? c.eval_resize : eval_image_size(c) * 256 / 224;
}

// The normalization the float output applies and 8-bit pixels still need (mean/std fused).
inline NormParams norm_params(const DataConfig& cfg) { return rt::norm_params(cfg.mean, cfg.std); }

// One batch. Output::f32: images in the layout the CPU backends take (float NCHW, RGB,
// normalized). Output::u8: pixels, the same crop and flip before normalization (out of the 8-bit
// pixel p, channel c, the float output holds norm_value(p, scale[c], shift[c]) of norm_params).
struct Batch {
  HostVector<float> images;     // n * 3 * size * size (Output::f32; else empty)
  HostVector<uint8_t> pixels;   // n * size * size * 3, NHWC RGB (Output::u8; else empty)
  std::vector<int32_t> labels;  // n
  std::vector<int64_t> indices; // n: global sample index of each image (a substitute's own index)
  int n = 0;                    // samples in this batch (the last evaluation batch may be short)
  // Its images that could not be read or decoded: training's replaced by others of the share,
  // evaluation's left out. Per batch, where skipped() counts what the decode threads met, ahead
  // of what was taken: a run that stops mid-epoch counts the batches it trained.
  int skipped = 0;
  // After mixup (data/mixup.h): each image a blend, weight `mix` on its own and 1 - mix on its
  // partner's, whose label mixed[i] is; empty when the batch was not mixed.
  std::vector<int32_t> mixed;
  double mix = 1.0;
};

// Where a rank stands in an epoch, for checkpoints: restoring it yields the rest of the epoch
// unchanged.
struct Position {
  int64_t epoch = 0;
  int64_t step = 0;             // batches already consumed in this epoch
};

class Loader {
 public:
  virtual ~Loader() = default;
  // Samples in the whole split (all ranks) and classes.
  virtual int64_t size() const = 0;
  virtual int num_classes() const = 0;
  // Batches this rank yields per epoch. Training: floor(size / (world * batch)), the same on every
  // rank (the ragged tail dropped evenly). Evaluation: ceil of this rank's exact share / batch; the
  // shares of all ranks cover every sample exactly once, so step counts may differ by one.
  virtual int64_t steps_per_epoch() const = 0;
  // Starts (or restarts) producing epoch pos.epoch from batch pos.step; decode threads begin at once.
  virtual void start_epoch(Position pos) = 0;
  // Blocks for the next batch of the epoch; false at its end. Rethrows a worker thread's error.
  // Swaps buffers with `out` (no copy): what `out` held before is recycled for a later batch, so
  // pass the same Batch each step and keep no pointers into it across calls. Calling next()
  // before any start_epoch() starts epoch 0 at step 0.
  virtual bool next(Batch& out) = 0;
  virtual Position position() const = 0;
  // Seconds the last next() blocked waiting for a batch (0 when one was ready).
  virtual double last_wait_s() const = 0;
  // Images that failed to decode and were skipped so far (each warned about once, by path).
  // Training fills the place of a skipped image with the next decodable sample of the rank's
  // share (with that sample's own label), so batches stay full; evaluation omits it (n shrinks).
  virtual int64_t skipped() const = 0;
  // Class names in label order (folder and shard sets; "0", "1", ... for lists and synthetic).
  virtual const std::vector<std::string>& class_names() const = 0;
  // A hash of the split's samples in order, each one's label and file name (not its folder,
  // which may differ between nodes); 0: not known, as for synthetic data. Tells apart datasets
  // of as many samples listed in another order, whose epochs would draw other samples at the
  // same positions.
  virtual uint64_t order_hash() const { return 0; }
  // The largest label of the split's samples (below num_classes() where two list files share
  // one class count, or a split lacks the top classes).
  virtual int32_t max_label() const { return num_classes() - 1; }
  // Where the batches' images and pixels are allocated (nullptr, the default: the heap), e.g. a
  // backend's input_memory(), which it copies to the device from without the host waiting. Set
  // before start_epoch(): the buffers move there as they are next filled, once. A loader that
  // ignores it stays correct, only slower to copy from.
  virtual void set_batch_memory(HostMemory* m) {}
};

// Builds the loader for one split, batch size and (rank, world). Errors (missing root, empty
// class folder, bad list line, fewer samples than ranks) throw rt::Error naming the path or line.
std::unique_ptr<Loader> make_loader(const DataConfig& cfg, Split split, int rank, int world,
                                    int batch);

}  // namespace rt::data

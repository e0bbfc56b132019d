// The per-rank loader: decode threads fill a ring of `queue_depth` batch slots, sample by sample,
// in step order; next() hands slots out in order. Work items are single samples (not whole
// batches) so all threads help finish the oldest batch first and the first batch of an epoch is
// ready after batch / threads decodes rather than batch.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "data/dataset.h"
#include "data/image.h"
#include "data/loader.h"
#include "data/rng.h"
#include "data/sharding.h"
#include "nn/console.h"
#include "nn/error.h"

namespace rt::data {
namespace {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

// Synthetic image: uniformly random bytes (NHWC RGB), normalized like decoded pixels, so both
// outputs carry the same image.
void synthetic_image(Rng& rng, int size, const NormTable& t, float* out_f, uint8_t* out_u8) {
  const size_t hw = static_cast<size_t>(size) * size;
  uint64_t r = 0;
  for (size_t k = 0; k < 3 * hw; ++k, r >>= 8) {
    if (k % 8 == 0) r = rng.next_u64();
    const uint8_t p = static_cast<uint8_t>(r);
    if (out_u8) out_u8[k] = p;
    if (out_f) out_f[(k % 3) * hw + k / 3] = t.v[k % 3][p];
  }
}

// The settings one split's loader works with: evaluation's images have their own side.
DataConfig split_config(DataConfig c, Split split) {
  if (split == Split::val) c.image_size = eval_image_size(c);
  return c;
}

class PipelineLoader final : public Loader {
 public:
  PipelineLoader(const DataConfig& cfg, Split split, int rank, int world, int batch)
      : cfg_(split_config(cfg, split)), rank_(rank), batch_(batch) {
    if (cfg_.image_size < 1)
      throw Error(str_cat("data: ", split == Split::val && cfg.eval_image_size > 0 ? "eval_image_size" : "image_size",
                          " must be >= 1, got ", cfg_.image_size));
    if (cfg.queue_depth < 1) throw Error(str_cat("data: queue_depth must be >= 1, got ", cfg.queue_depth));
    if (!(cfg.random_erasing >= 0 && cfg.random_erasing <= 1))
      throw Error(str_cat("data: random_erasing must be a probability in [0, 1], got ", cfg.random_erasing));
    try {
      auto_augment_validate(cfg.auto_augment);
    } catch (const Error& e) {
      throw Error(str_cat("data: ", e.what()));
    }
    if (cfg.synthetic) {
      if (cfg.synthetic_classes < 1) throw Error("data: synthetic_classes must be >= 1");
      size_ = cfg.synthetic_samples;
      for (int c = 0; c < cfg.synthetic_classes; ++c) classes_.push_back(std::to_string(c));
    } else {
      if (!have_image_decoder())
        throw Error("data: this build has no image decoder (OpenCV was not found when it was built): "
                    "only data.synthetic: true works, not data.root or data.*_list");
      ds_ = open_dataset(cfg, split);
      size_ = ds_->size();
      classes_ = ds_->class_names();
      bad_ = std::vector<std::atomic<uint8_t>>(static_cast<size_t>(size_));
      order_hash_ = ds_->order_hash();
      max_label_ = 0;
      for (int64_t i = 0; i < size_; ++i) max_label_ = std::max(max_label_, ds_->label(i));
    }
    const bool train = split == Split::train;
    spec_ = ShardSpec{size_, world, batch, train, cfg.seed, train ? cfg.repeated_augment : 1};
    try {
      shard_check(spec_, rank);
    } catch (const Error& e) {  // which split's samples: the message alone would not say
      throw Error(str_cat(e.what(), " (", split_source(cfg, split), ")"));
    }
    steps_ = data::steps_per_epoch(spec_, rank);
    if (train && steps_ == 0)
      throw Error(str_cat("data: train split has ", size_, " samples, fewer than world * batch = ",
                          int64_t{world} * batch, ": no full batch for any rank"));
    aug_ = make_augment_spec(cfg_.image_size, train, cfg.min_scale, cfg.max_scale, cfg.flip, cfg.mean,
                             cfg.std);
    if (!train) aug_.resize = eval_resize(cfg);
    if (train) aug_.auto_augment = cfg.auto_augment, aug_.random_erasing = cfg.random_erasing;
    aug_.min_ratio = cfg.min_ratio;
    aug_.interpolation = train ? cfg.interpolation : cfg.eval_interpolation;
    aug_.max_ratio = cfg.max_ratio;
    threads_ = cfg.threads > 0 ? cfg.threads : available_cores();
    slots_.resize(static_cast<size_t>(cfg.queue_depth));
  }

  ~PipelineLoader() override { stop_workers(); }

  int64_t size() const override { return size_; }
  int num_classes() const override { return static_cast<int>(classes_.size()); }
  const std::vector<std::string>& class_names() const override { return classes_; }
  uint64_t order_hash() const override { return order_hash_; }
  int32_t max_label() const override { return ds_ ? max_label_ : num_classes() - 1; }
  void set_batch_memory(HostMemory* m) override {
    std::lock_guard<std::mutex> lock(mu_);
    batch_memory_ = m;
  }
  int64_t steps_per_epoch() const override { return steps_; }
  Position position() const override { return {epoch_, next_step_}; }
  double last_wait_s() const override { return last_wait_; }
  int64_t skipped() const override { return skipped_.load(); }

  void start_epoch(Position pos) override {
    if (pos.epoch < 0 || pos.step < 0 || pos.step > steps_)
      throw Error(str_cat("data: cannot start at epoch ", pos.epoch, " step ", pos.step, ": epochs have ",
                          steps_, " steps"));
    stop_workers();
    if (!started_ || pos.epoch != epoch_) share_ = EpochShare(spec_, rank_, pos.epoch);
    started_ = true;
    epoch_ = pos.epoch;
    next_step_ = task_step_ = pos.step;
    task_j_ = 0;
    stop_ = false;
    error_ = nullptr;
    for (Slot& s : slots_) s.step = -1, s.ready = false;
    const int n = static_cast<int>(std::min<int64_t>(threads_, std::max<int64_t>(1, (steps_ - pos.step) * batch_)));
    for (int t = 0; t < n; ++t) workers_.emplace_back([this] { worker(); });
  }

  bool next(Batch& out) override {
    if (!started_) start_epoch({0, 0});
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    if (next_step_ >= steps_) {
      last_wait_ = 0;
      return false;
    }
    Slot& slot = slots_[static_cast<size_t>(next_step_ % cfg_.queue_depth)];
    ready_cv_.wait(lock, [&] { return error_ || (slot.ready && slot.step == next_step_); });
    if (error_) std::rethrow_exception(error_);
    std::swap(out.images, slot.batch.images);
    std::swap(out.pixels, slot.batch.pixels);
    std::swap(out.labels, slot.batch.labels);
    std::swap(out.indices, slot.batch.indices);
    out.n = slot.batch.n;
    out.skipped = slot.batch.skipped;
    out.mixed.clear();  // fresh images: not mixed (yet)
    out.mix = 1.0;
    slot.ready = false;
    slot.step = -1;
    ++next_step_;
    lock.unlock();
    work_cv_.notify_all();
    last_wait_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return true;
  }

 private:
  struct Slot {
    Batch batch;
    int64_t step = -1;
    int64_t first = 0;      // share position of the batch's first sample
    int remaining = 0;      // samples not yet written
    bool ready = false;
    std::vector<uint8_t> ok;  // evaluation: which samples decoded
  };

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  // Sizes a slot for `step` (under mu_); buffers keep their capacity, so after the first lap this
  // allocates nothing.
  void prepare_slot(Slot& s, int64_t step) {
    int64_t first = 0, last = 0;
    share_.batch_range(step, &first, &last);
    const int n = static_cast<int>(last - first);
    const size_t pixels = static_cast<size_t>(cfg_.image_size) * cfg_.image_size * 3;
    s.step = step;
    s.first = first;
    s.remaining = n;
    s.ready = false;
    s.batch.n = n;
    s.batch.skipped = 0;
    // A buffer swapped in from a caller's fresh Batch may be on the heap: replaced once, here.
    rehome(s.batch.images, batch_memory_);
    rehome(s.batch.pixels, batch_memory_);
    s.batch.images.resize(cfg_.output == Output::f32 ? pixels * n : 0);
    s.batch.pixels.resize(cfg_.output == Output::u8 ? pixels * n : 0);
    s.batch.labels.resize(static_cast<size_t>(n));
    s.batch.indices.resize(static_cast<size_t>(n));
    s.ok.assign(static_cast<size_t>(n), 1);
  }

  void worker() {
    decode_thread_init();
    DecodeScratch scratch;
    std::vector<uint8_t> bytes;
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_ && !error_ && task_step_ < steps_) {
      if (task_step_ >= next_step_ + cfg_.queue_depth) {  // its slot still holds an unread batch
        work_cv_.wait(lock);
        continue;
      }
      Slot& slot = slots_[static_cast<size_t>(task_step_ % cfg_.queue_depth)];
      if (task_j_ == 0) prepare_slot(slot, task_step_);
      const int j = task_j_;
      if (++task_j_ >= slot.batch.n) task_j_ = 0, ++task_step_;
      lock.unlock();
      bool ok = false, substituted = false;
      try {
        ok = fill(slot, j, scratch, bytes, substituted);
      } catch (...) {
        lock.lock();
        if (!error_) error_ = std::current_exception();
        ready_cv_.notify_all();
        return;
      }
      lock.lock();
      slot.ok[static_cast<size_t>(j)] = ok;
      slot.batch.skipped += !ok || substituted;
      if (--slot.remaining == 0) {
        compact(slot);
        slot.ready = true;
        ready_cv_.notify_all();
      }
    }
  }

  // Decodes the j-th sample of a slot's batch; on a bad image, training substitutes the next
  // decodable sample of the share (wrapping; `substituted` says so), evaluation reports false.
  bool fill(Slot& slot, int j, DecodeScratch& scratch, std::vector<uint8_t>& bytes, bool& substituted) {
    const size_t pixels = static_cast<size_t>(cfg_.image_size) * cfg_.image_size * 3;
    float* out_f = cfg_.output == Output::f32 ? slot.batch.images.data() + pixels * j : nullptr;
    uint8_t* out_u8 = cfg_.output == Output::u8 ? slot.batch.pixels.data() + pixels * j : nullptr;
    const int64_t k = slot.first + j;
    int64_t index = share_.sample(k);
    bool ok = produce(index, share_.copy(k), out_f, out_u8, scratch, bytes);
    if (!ok) {
      skipped_.fetch_add(1);
      if (!spec_.train) return false;
      substituted = true;
      for (int64_t t = 1; t < share_.size() && !ok; ++t) {
        const int64_t other = (k + t) % share_.size();
        index = share_.sample(other);
        if (!bad_[static_cast<size_t>(index)].load())
          ok = produce(index, share_.copy(other), out_f, out_u8, scratch, bytes);
      }
      if (!ok) {
        std::lock_guard lk(why_mu_);
        throw Error(str_cat("data: rank ", rank_, ": no image of its share of epoch ", epoch_,
                            " could be read and decoded (the last one skipped ", last_why_, ")"));
      }
    }
    slot.batch.labels[static_cast<size_t>(j)] = label(index);
    slot.batch.indices[static_cast<size_t>(j)] = index;
    return true;
  }

  // Synthetic validation samples are other draws than training's (epochs from 0 there, from -1
  // down here): evaluating on training's first epoch would measure memory, not accuracy.
  int64_t synthetic_split_key(int64_t epoch) const { return spec_.train ? epoch : -1 - epoch; }

  int32_t label(int64_t index) const {
    if (ds_) return ds_->label(index);
    Rng rng(cfg_.seed, synthetic_split_key(0), index, Stream::synthetic_label);
    return static_cast<int32_t>(rng.below(classes_.size()));
  }

  // One sample's pixels; false (after one warning per file) when it cannot be read or decoded.
  // copy: which of a repeated sample's copies (repeated augmentation), each augmented its own way.
  bool produce(int64_t index, int copy, float* out_f, uint8_t* out_u8, DecodeScratch& scratch,
               std::vector<uint8_t>& bytes) {
    if (!ds_) {
      Rng rng(cfg_.seed, synthetic_split_key(epoch_), index, Stream::synthetic_image);
      synthetic_image(rng, cfg_.image_size, aug_.norm, out_f, out_u8);
      return true;
    }
    std::atomic<uint8_t>& bad = bad_[static_cast<size_t>(index)];
    if (bad.load()) return false;  // known bad: do not read it again
    Rng rng(cfg_.seed, epoch_, index + int64_t{copy} * size_, Stream::augment);
    std::string why = "cannot be read";
    if (ds_->read(index, bytes)) {
      if (decode_augment(bytes.data(), bytes.size(), aug_, rng, scratch, out_f, out_u8)) return true;
      int w = 0, h = 0;
      bool jpeg = false;
      const std::string problem = header_problem(bytes.data(), bytes.size(), &w, &h, &jpeg);
      why = "cannot be decoded: " + (bytes.empty()            ? std::string("an empty file")
                                     : problem.empty() ? "the decoder rejected its data"
                                                       : problem);
    }
    if (bad.exchange(1) == 0) {
      // A folder gone mid-run would otherwise print a line for every file of the share.
      const int n = warned_.fetch_add(1);
      if (n < kListedSkips)
        stderr_line(str_cat("data: warning: rank ", rank_, ": skipping ", ds_->name(index), ": ", why));
      else if (n == kListedSkips)
        stderr_line(str_cat("data: warning: rank ", rank_, ": ", kListedSkips, " files skipped; more are counted, not listed (the next: ",
                            ds_->name(index), ": ", why, ")"));
      std::lock_guard lk(why_mu_);
      last_why_ = why;
    }
    return false;
  }

  // Evaluation: moves the decoded samples of a batch with skipped ones to the front (n shrinks).
  void compact(Slot& s) {
    const size_t pixels = static_cast<size_t>(cfg_.image_size) * cfg_.image_size * 3;
    Batch& b = s.batch;
    int w = 0;
    for (int r = 0; r < b.n; ++r) {
      if (!s.ok[static_cast<size_t>(r)]) continue;
      if (w != r) {
        if (!b.images.empty()) std::memmove(&b.images[pixels * w], &b.images[pixels * r], pixels * sizeof(float));
        if (!b.pixels.empty()) std::memmove(&b.pixels[pixels * w], &b.pixels[pixels * r], pixels);
        b.labels[static_cast<size_t>(w)] = b.labels[static_cast<size_t>(r)];
        b.indices[static_cast<size_t>(w)] = b.indices[static_cast<size_t>(r)];
      }
      ++w;
    }
    if (w == b.n) return;
    b.n = w;
    if (!b.images.empty()) b.images.resize(pixels * w);
    if (!b.pixels.empty()) b.pixels.resize(pixels * w);
    b.labels.resize(static_cast<size_t>(w));
    b.indices.resize(static_cast<size_t>(w));
  }

  const DataConfig cfg_;
  const int rank_, batch_;
  std::unique_ptr<Dataset> ds_;  // null in synthetic mode
  uint64_t order_hash_ = 0;
  int32_t max_label_ = 0;
  std::vector<std::string> classes_;
  int64_t size_ = 0, steps_ = 0;
  ShardSpec spec_;
  AugmentSpec aug_;
  int threads_ = 1;
  std::vector<std::atomic<uint8_t>> bad_;  // samples known not to decode (skipped without reading)
  std::atomic<int64_t> skipped_{0};
  static constexpr int kListedSkips = 20;  // files named on stderr before the rest are only counted
  std::atomic<int> warned_{0};
  std::mutex why_mu_;
  std::string last_why_;  // why the last file skipped was

  // Epoch state; guarded by mu_ while workers run.
  EpochShare share_;
  bool started_ = false;
  int64_t epoch_ = 0, next_step_ = 0;  // next_step_: the batch next() hands out next
  int64_t task_step_ = 0;              // the batch and sample the next free worker decodes
  int task_j_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<Slot> slots_;
  HostMemory* batch_memory_ = nullptr;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_, ready_cv_;
  double last_wait_ = 0;
};

}  // namespace

std::unique_ptr<Loader> make_loader(const DataConfig& cfg, Split split, int rank, int world,
                                    int batch) {
  return std::make_unique<PipelineLoader>(cfg, split, rank, world, batch);
}

}  // namespace rt::data

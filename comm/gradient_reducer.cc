// Gradient buckets and the communication thread that allreduces them during backward.
#include "comm/gradient_reducer.h"

#include <algorithm>

#include "comm/mpi_check.h"

namespace rt::comm {

namespace {
double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
  }
}
std::unique_ptr<DeviceGrads> non_null(std::unique_ptr<DeviceGrads> d) {
  if (!d) throw CommError("GradientReducer: the device hooks are null");
  return d;
}
}  // namespace

GradientReducer::GradientReducer(Communicator& comm, const CommConfig& cfg, void* grads,
                                 size_t count, DType t, const ModelFingerprint& model,
                                 const ReduceKernels& k)
    : GradientReducer(comm, cfg, nullptr, grads, count, t, model, &k) {}

GradientReducer::GradientReducer(Communicator& comm, const CommConfig& cfg,
                                 std::unique_ptr<DeviceGrads> device, void* grads, size_t count,
                                 DType t, const ModelFingerprint& model)
    : GradientReducer(comm, cfg, non_null(std::move(device)), grads, count, t, model, nullptr) {}

GradientReducer::GradientReducer(Communicator& comm, const CommConfig& cfg,
                                 std::unique_ptr<DeviceGrads> device, void* grads, size_t count,
                                 DType t, const ModelFingerprint& model, const ReduceKernels* k)
    : comm_(comm), cfg_(cfg), grads_(static_cast<char*>(grads)), count_(count), dtype_(t),
      dev_(std::move(device)), work_(grads_), wire_(compression_wire_type(cfg.compression, t)) {
  if (model.grad_elems != count || model.dtype != t)
    throw CommError(str_cat("GradientReducer: the buffer (", count, " ", dtype_name(t),
                            ") is not the model's gradient buffer (", model.grad_elems, " ",
                            dtype_name(model.dtype), ")"));
  if (cfg_.bucket_bytes == 0) throw CommError("comm: bucket_bytes must be positive");
  comm_check_agreement(comm_, model, cfg_);
  // Buckets hold whole 64-byte lines, so every bucket but the last starts aligned.
  const size_t esz = dtype_size(t), line = 64 / esz;
  const size_t per = std::max(line, cfg_.bucket_bytes / esz / line * line);
  for (size_t off = 0; off < count; off += per) buckets_.push_back({off, std::min(per, count - off)});
  times_.resize(buckets_.size());

  // Device buffers: the hooks allocate what the steps use now; the staged ring runs on the host
  // mirror with the CPU kernels, the direct one on the buffer with device kernels and scratch.
  // One rank never touches the buffer (reduce_bucket): no mirror, streams or scratch for it.
  const MemorySpace* scratch = nullptr;
  if (dev_ && solo()) {
    k = &cpu_reduce_kernels();
  } else if (dev_) {
    fence_.assign(buckets_.size(), 0);
    if (staged()) {
      // Compressed: 16-bit values on the bus as on the wire, when the hooks convert there.
      wire_on_device_ = wire_ != t && dev_->stage_as(wire_, 1.0f / float(comm_.size()));
      ticket_.assign(buckets_.size(), 0);
    }
    dev_->setup(grads_, count * esz, buckets_.size());
    if (staged()) {
      work_ = dev_->host();
      k = &cpu_reduce_kernels();
    } else {
      k = &dev_->kernels();
      scratch = dev_->scratch_space();
    }
  }
  CommConfig run_cfg = cfg_;  // the waiting policy of the thread that will make the calls
  if (cfg_.overlap) run_cfg.idle_sleep_us = cfg_.overlap_idle_sleep_us;
  allreducer_ = make_allreducer(run_cfg, comm_, *k, scratch);
  kernels_ = k;
  if (wire_ != t) {
    if (!allreducer_->supports(wire_) || !k->supports(wire_))
      throw CommError(str_cat("comm: compression ", cfg_.compression, " needs an algorithm that sums ",
                              dtype_name(wire_), ", which '", allreducer_->name(),
                              "' cannot here: use ring, reducer or nccl"));
    // One bucket at a time, where the kernels work (device scratch on the direct path); one
    // rank reduces nothing, so it needs none, nor do hooks that convert on the device.
    if (!solo() && !wire_on_device_) {
      wire_buf_ = Buffer<char>(scratch);
      size_t most = 0;
      for (const Range& r : buckets_) most = std::max(most, r.len);
      wire_buf_.resize(most * dtype_size(wire_));
    }
  }
  allreducer_->reserve(wire_);  // scratch in device memory: allocated now, not in a step
  if (comm_.size() > 1 && (cfg_.stall_warning_s > 0 || cfg_.stall_abort_s > 0)) {
    stall_ = std::make_unique<StallWatch>(comm_.mpi(), cfg_.stall_warning_s, cfg_.stall_abort_s);
    comm_.set_stall_watch(stall_.get());
  }
  if (!k->supports(t))
    throw CommError(str_cat("GradientReducer: gradient type ", dtype_name(t), " not supported"));

  if (threaded()) {
    int provided = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&provided));
    if (provided < MPI_THREAD_SERIALIZED)
      throw CommError(str_cat(
          "comm overlap: the communication thread calls MPI while backward runs, which needs "
          "MPI_Init_thread with MPI_THREAD_SERIALIZED or higher (this process has ",
          thread_level_name(provided), "); initialise MPI so, or set overlap: false"));
    thread_ = std::thread([this] { comm_loop(); });
  }
}

GradientReducer::~GradientReducer() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (stall_) comm_.set_stall_watch(nullptr);
}

void GradientReducer::start_step_locked() {
  active_ = true;
  fenced_ = 0;
  timed_ = 0;
  ready_ = 0;
  next_ = 0;
  comm_s_ = 0;
  step_start_ = Clock::now();
}

// The reporting thread is the only one that starts steps, so it may test active_ unlocked.
void GradientReducer::start_step_if_idle() {
  if (active_) return;
  std::lock_guard<std::mutex> lk(mu_);
  start_step_locked();
}

// Device buffers: one fence for the buckets that grads[0, n) completes (none if it completes
// none, so a step records at most one per bucket), and on the staged path their downloads queued
// behind it at once, so that they overlap backward and the reduction of earlier buckets. Runs on
// the reporting thread before ready_ publishes n, which is what makes fence_ and ticket_ visible.
void GradientReducer::fence_upto(size_t n) {
  size_t covered = fenced_;
  while (covered < buckets_.size() && buckets_[covered].offset + buckets_[covered].len <= n) ++covered;
  if (covered == fenced_) return;
  const uint64_t token = dev_->record();
  const size_t esz = dtype_size(dtype_);
  for (size_t b = fenced_; b < covered; ++b) {
    fence_[b] = token;
    if (staged()) ticket_[b] = dev_->download(buckets_[b].offset * esz, buckets_[b].len * esz, token);
  }
  fenced_ = covered;
}

void GradientReducer::begin_step(int64_t step) {
  std::lock_guard<std::mutex> lk(mu_);
  if (active_) throw CommError("GradientReducer: begin_step() before the previous step's wait()");
  label_step_ = step;
  start_step_locked();
}

// Reporting thread: the time at which buckets up to grads[0, n) became complete.
void GradientReducer::time_ready_upto(size_t n) {
  auto complete = [&] { return timed_ < buckets_.size() && buckets_[timed_].offset + buckets_[timed_].len <= n; };
  if (!complete()) return;  // most reports complete no bucket: no clock read for them
  const Clock::time_point now = Clock::now();
  while (complete()) times_[timed_++].ready = now;
}

void GradientReducer::on_ready(size_t n) {
  start_step_if_idle();
  if (dev_ && !solo()) fence_upto(std::min(n, count_));
  time_ready_upto(std::min(n, count_));  // before ready_ publishes it: ready precedes start
  {
    std::lock_guard<std::mutex> lk(mu_);
    ready_ = std::max(ready_, std::min(n, count_));
  }
  if (threaded()) work_cv_.notify_one();
}

void GradientReducer::reduce_bucket(size_t b) {
  BucketTimes& bt = times_[b];
  bt.start = bt.fenced = bt.end = Clock::now();
  if (solo()) return;  // the average over one rank is the buffer itself: nothing to wait for or copy
  const Range r = buckets_[b];
  const size_t esz = dtype_size(dtype_);
  // The device's own work first (this rank is not yet waiting for the others).
  if (staged()) dev_->download_wait(ticket_[b]);
  else if (dev_) dev_->wait(fence_[b]);
  if (dev_) bt.fenced = Clock::now();
  if (stall_ && b == 0) {
    ++steps_;
    stall_->arrive(steps_, StallLabel("the gradient allreduce of step ", label_step_ > 0 ? label_step_ : steps_));
    label_step_ = 0;  // a step without begin_step(): the reducer's count
  } else if (stall_) {
    stall_->rearm();  // backward ran since the last bucket: not a wait
  }
  if (wire_on_device_) {  // already divided by the ranks and rounded, on the device
    allreducer_->allreduce(work_ + r.offset * dtype_size(wire_), r.len, wire_, ReduceOp::sum);
  } else if (wire_ == dtype_) {
    allreducer_->allreduce(work_ + r.offset * esz, r.len, dtype_, ReduceOp::average);
  } else {
    // As DDP's compress hooks: divided by the ranks before rounding to the 16-bit type, so that
    // fp16's running sums are of the average's magnitude, not ranks times it. (Compressed
    // gradients are fp32: compression_wire_type.)
    compressed_allreduce(*allreducer_, *kernels_, wire_, wire_buf_.data(),
                         reinterpret_cast<float*>(work_ + r.offset * esz), r.len, 1.0f / float(comm_.size()));
  }
  if (staged()) {
    dev_->upload(r.offset * esz, r.len * esz);
    if (b + 1 == buckets_.size()) dev_->upload_wait();  // before wait() may return
  }
  if (stall_ && b + 1 == buckets_.size()) stall_->leave();
  bt.end = Clock::now();
  comm_s_ += seconds(bt.end - bt.start);  // only the thread doing the reduce touches comm_s_ now
}

void GradientReducer::comm_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] {
      return stop_ || (active_ && !error_ && next_ < buckets_.size() &&
                       ready_ >= buckets_[next_].offset + buckets_[next_].len);
    });
    if (stop_) return;
    const size_t b = next_;
    lk.unlock();
    std::exception_ptr err;
    try {
      reduce_bucket(b);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    if (err) error_ = err;
    else ++next_;
    if (err || next_ == buckets_.size()) done_cv_.notify_all();
  }
}

void GradientReducer::wait() {
  const auto t_wait = Clock::now();
  start_step_if_idle();
  if (dev_ && !solo()) fence_upto(count_);  // the buckets no report completed
  time_ready_upto(count_);
  std::unique_lock<std::mutex> lk(mu_);
  last_ = StepTimes{};
  last_.compute_s = seconds(t_wait - step_start_);
  last_.buckets = buckets_.size();
  last_.buckets_done_before_wait = next_;
  ready_ = count_;
  if (threaded()) {
    work_cv_.notify_one();
    done_cv_.wait(lk, [&] { return error_ || next_ == buckets_.size(); });
  } else {
    lk.unlock();  // no other thread: the buckets are reduced here, one after another
    for (size_t b = 0; b < buckets_.size(); ++b) reduce_bucket(b);
    lk.lock();
    next_ = buckets_.size();
  }
  active_ = false;
  last_.total_comm_s = comm_s_;
  last_.exposed_comm_s = solo() ? 0.0 : seconds(Clock::now() - t_wait);  // one rank sends nothing
  if (error_) std::rethrow_exception(error_);  // stays set: the collective sequence is broken
}

}  // namespace rt::comm

// Gradient buckets overlapped with backward: the flat gradient buffer (backward order) is cut
// into buckets, and a communication thread allreduces (averages) each bucket as soon as backward
// reports it complete, while backward goes on with the earlier layers.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "comm/agreement.h"
#include "comm/allreduce.h"
#include "comm/communicator.h"
#include "comm/device_grads.h"
#include "comm/ring_schedule.h"
#include "comm/stall.h"

namespace rt::comm {

// One step's timing, in seconds.
struct StepTimes {
  double compute_s = 0;       // begin_step() to wait(): backward (and whatever the caller did)
  double exposed_comm_s = 0;  // time wait() blocked: communication not hidden behind compute
  double total_comm_s = 0;    // time spent inside bucket allreduces (with their device waits and
                              // copies), hidden or not
  size_t buckets = 0;
  size_t buckets_done_before_wait = 0;  // how many finished while backward was still running
};

// Thread use. With overlap, a communication thread makes every MPI call of a step (between
// begin_step() and wait() returning), concurrently with the main thread's compute: the program
// must initialise MPI with MPI_Init_thread(..., MPI_THREAD_SERIALIZED or higher, ...) and must
// not call MPI from another thread during a step (between steps, e.g. for a loss average, it
// may). MPI_THREAD_MULTIPLE is not needed. Without overlap, wait() makes the calls on the
// caller's thread and plain MPI_Init (or FUNNELED) suffices.
class GradientReducer {
 public:
  using Clock = std::chrono::steady_clock;
  // One bucket's times in the last step: ready (the report, or wait(), that completed it), start
  // (the reducing thread took it), fenced (the device work it waits for was done, or its download
  // landed; = start for host buffers), end (averaged, and on the staged path uploaded).
  struct BucketTimes {
    Clock::time_point ready, start, fenced, end;
  };

  // Collective: runs comm_check_agreement(comm, model, cfg), so a rank with another model or other
  // settings makes every rank throw here. grads: the flat gradient buffer (count elements of type
  // t), which must stay valid for the reducer's lifetime.
  GradientReducer(Communicator& comm, const CommConfig& cfg, void* grads, size_t count, DType t,
                  const ModelFingerprint& model, const ReduceKernels& k = cpu_reduce_kernels());
  GradientReducer(Communicator& comm, const CommConfig& cfg, std::span<float> grads,
                  const ModelFingerprint& model, const ReduceKernels& k = cpu_reduce_kernels())
      : GradientReducer(comm, cfg, grads.data(), grads.size(), DType::f32, model, k) {}
  // The same for a buffer in device memory that the reducer reaches only through `device` (see
  // comm/device_grads.h), which it owns and sets up here: the host never touches grads. on_ready(n)
  // may come before the device has produced grads[0, n): it records a fence, and the bucket is
  // reduced only after it. Direct path: the allreduce runs on grads with device.kernels() and
  // scratch in device.scratch_space(). Staged path: each complete bucket is downloaded to the host
  // mirror at once (behind its fence), averaged there with the CPU kernels and uploaded; wait()
  // returns when every upload has landed.
  GradientReducer(Communicator& comm, const CommConfig& cfg, std::unique_ptr<DeviceGrads> device,
                  void* grads, size_t count, DType t, const ModelFingerprint& model);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Starts a step (the compute clock). Optional: the first on_ready() of a step starts one too.
  // `step` (> 0) is the caller's number for it, which stall messages use (a resumed run's steps
  // do not start at 1); else the reducer counts its own.
  void begin_step(int64_t step = 0);
  // The stall check of the steps' allreduces (null without comm.stall_*_s), for fault drills.
  StallWatch* stall_watch() { return stall_.get(); }
  // grads[0, n) is final (n grows within a step). Wakes the communication thread when a bucket
  // is complete. Cheap; called from Net::backward's on_ready.
  void on_ready(size_t n);
  // The callback to pass to Net::backward.
  std::function<void(size_t)> ready_callback() {
    return [this](size_t n) { on_ready(n); };
  }
  // Ends the step: marks the whole buffer ready, blocks until every bucket is averaged over all
  // ranks, and records the step's times. Rethrows a communication error of this step. With one
  // rank there is nothing to average: no bucket is fenced, copied or reduced, and device
  // gradients may still be being written when it returns (their consumers are queued after them).
  void wait();

  const StepTimes& last_step() const { return last_; }
  // Per bucket, valid after wait() until the next step starts (sized at set-up: no allocation).
  const std::vector<BucketTimes>& last_bucket_times() const { return times_; }
  size_t num_buckets() const { return buckets_.size(); }
  Range bucket(size_t i) const { return buckets_[i]; }
  const char* algorithm() const { return allreducer_->name(); }
  // The type buckets travel and are summed in (cfg.compression; the gradient type without it).
  DType wire_type() const { return wire_; }
  // The device path, or nullptr for a host buffer.
  const char* device_path() const { return dev_ ? device_path_name(dev_->path()) : nullptr; }

 private:
  GradientReducer(Communicator& comm, const CommConfig& cfg, std::unique_ptr<DeviceGrads> device,
                  void* grads, size_t count, DType t, const ModelFingerprint& model,
                  const ReduceKernels* k);
  void comm_loop();
  void reduce_bucket(size_t b);
  void start_step_locked();
  void start_step_if_idle();
  void fence_upto(size_t n);
  void time_ready_upto(size_t n);
  bool staged() const { return dev_ && dev_->path() == DevicePath::staged; }
  bool solo() const { return comm_.size() == 1; }
  // The communication thread runs the buckets (comm.overlap), unless one rank has nothing to
  // send: its hand-offs would cost a wake-up per bucket and show as exposed communication.
  bool threaded() const { return cfg_.overlap && !solo(); }

  Communicator& comm_;
  CommConfig cfg_;
  char* grads_;
  size_t count_;
  DType dtype_;
  std::unique_ptr<DeviceGrads> dev_;  // null: grads is host memory (before allreducer_, which
                                      // may hold its kernels)
  char* work_;                        // where the allreduce runs: grads_, or the staged mirror
  bool wire_on_device_ = false;       // staged compression: the mirror holds wire_ values
  const ReduceKernels* kernels_ = nullptr;  // the allreducer's, for compression's conversions
  DType wire_;                        // compression: buckets go as this type through wire_buf_,
  Buffer<char> wire_buf_;             // one bucket's worth, where the kernels work (one bucket
                                      // is reduced at a time)
  std::unique_ptr<Allreducer> allreducer_;
  std::vector<Range> buckets_;  // contiguous slices in buffer (= backward) order
  std::unique_ptr<StallWatch> stall_;  // names the ranks a step waits for (cfg stall_*_s)
  int64_t steps_ = 0;                  // steps whose reduction has begun
  int64_t label_step_ = 0;             // the current step's number in messages
  // Device buffers, per bucket: the fence of the report that completed it, and (staged) its
  // download. Written by the reporting thread before it publishes ready_, read after.
  std::vector<uint64_t> fence_, ticket_;
  size_t fenced_ = 0;                  // buckets fenced in this step (reporting thread only)
  // Each field written by one thread: ready by the reporting thread (timed_ is its cursor),
  // start/fenced/end by the reducing one before it publishes next_.
  std::vector<BucketTimes> times_;
  size_t timed_ = 0;

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  bool active_ = false, stop_ = false;
  size_t ready_ = 0;      // grads_[0, ready_) final in this step
  size_t next_ = 0;       // buckets [0, next_) reduced in this step
  double comm_s_ = 0;     // this step's time inside allreduces
  std::exception_ptr error_;
  Clock::time_point step_start_;
  StepTimes last_;
  std::thread thread_;    // last member: started once everything above exists
};

}  // namespace rt::comm

// A host stand-in for a GPU behind comm::DeviceGrads, so that the reducer's device paths run
// under mpirun without one. "Streams" are worker threads that run queued tasks in order, late:
// backward's writes land on the compute stream some time after on_ready reports them, copies run
// on their own streams. A reducer that skips a fence, a download wait or an upload wait therefore
// reads or leaves data that is not there yet (the device buffer and the mirror are NaN-poisoned
// between steps), and every violation the fake can see itself is counted and described.
#pragma once
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/device_grads.h"
#include "comm/reduce.h"
#include "nn/error.h"

namespace rt::test {

// Runs tasks in the order queued, on a thread of its own, like a CUDA stream.
class FakeStream {
 public:
  FakeStream() : thread_([this] { loop(); }) {}
  ~FakeStream() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void enqueue(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      q_.push_back(std::move(f));
    }
    cv_.notify_all();
  }
  void sync() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return q_.empty() && !busy_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      auto f = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
      lk.unlock();
      f();
      lk.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // last: started once the members above exist
};

// A host scratch space that counts its allocations (the direct path must allocate only at set-up).
class CountingSpace final : public MemorySpace {
 public:
  std::string name() const override { return "counting host"; }
  void* allocate(size_t bytes) const override {
    ++allocs;
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    std::memset(p, 0, bytes);
    return p;
  }
  void deallocate(void* p, size_t) const noexcept override { std::free(p); }
  void copy(void* dst, const void* src, size_t bytes) const override { std::memcpy(dst, src, bytes); }
  void zero(void* p, size_t bytes) const override { std::memset(p, 0, bytes); }
  void to_host(void* h, const void* src, size_t bytes) const override { std::memcpy(h, src, bytes); }
  void from_host(void* dst, const void* h, size_t bytes) const override { std::memcpy(dst, h, bytes); }
  bool host_accessible() const override { return true; }
  mutable int allocs = 0;
};

class FakeDeviceGrads final : public comm::DeviceGrads {
 public:
  // What happened, in order, for the test's checks of a step.
  struct Event {
    enum Kind { record, wait, download, download_wait, upload, upload_wait } kind;
    uint64_t id;           // token or ticket
    size_t offset, bytes;  // download / upload
    size_t covered;        // record, wait, download: the bytes of backward's writes queued
                           // before the fence (recorded, waited, or the download is behind)
  };

  // converts: the staged path accepts stage_as (compression converted on the "device").
  explicit FakeDeviceGrads(comm::DevicePath path, bool converts = false) : path_(path), converts_(converts) {}
  ~FakeDeviceGrads() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;  // a download still waiting for its fence (a failed step) gives up
    }
    cv_.notify_all();
  }
  comm::DevicePath path() const override { return path_; }

  DType staged_wire() const { return wire_; }  // what stage_as accepted (f32: nothing)
  bool stage_as(DType wire, float scale) override {
    if (!converts_ || path_ != comm::DevicePath::staged) return false;
    wire_ = wire;
    scale_ = scale;
    return true;
  }
  void setup(void* device, size_t bytes, size_t) override {
    attach(device, bytes);
    ++setups;
    if (path_ == comm::DevicePath::staged) mirror_.assign(staged_bytes(bytes), 0);
  }
  // The buffer backward writes into, for a test whose reducer may not call setup (one rank).
  void attach(void* device, size_t bytes) {
    device_ = static_cast<char*>(device);
    bytes_ = bytes;
  }
  int setups = 0;

  // Backward's side: the write fill(device + begin) of bytes [begin, end) runs on the compute
  // stream after `lag` (a slow kernel); the test reports on_ready at once.
  void produce(size_t begin, size_t end, std::chrono::microseconds lag, std::function<void(char*)> fill) {
    queued_ = end;
    compute_.enqueue([=, this] {
      if (lag.count()) std::this_thread::sleep_for(lag);
      fill(device_ + begin);
      std::lock_guard<std::mutex> lk(mu_);
      written_ = end;
    });
  }
  // The host waiting for backward's writes (a backend's sync()).
  void sync() { compute_.sync(); }
  // Between steps (after wait()): nothing of backward's is written or fenced yet, the mirror
  // holds nothing valid (NaN, so that a missing download shows), and the log starts empty.
  void new_step() {
    compute_.sync();
    std::lock_guard<std::mutex> lk(mu_);
    queued_ = written_ = waited_ = 0;
    log_.clear();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (wire_ != DType::f32) std::fill(mirror_.begin(), mirror_.end(), char(0xff));  // a bf16 and fp16 NaN
    else for (size_t i = 0; i + 4 <= mirror_.size(); i += 4) std::memcpy(&mirror_[i], &nan, 4);
  }

  uint64_t record() override {
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t t = recorded_++;
    log_.push_back({Event::record, t, 0, 0, queued_});
    cover_.push_back(queued_);
    compute_.enqueue([this, t] {
      std::lock_guard<std::mutex> lk2(mu_);
      passed_ = t + 1;
      cv_.notify_all();
    });
    return t;
  }
  void wait(uint64_t token) override {
    std::unique_lock<std::mutex> lk(mu_);
    if (fail_wait_) throw Error("fake device: injected fence failure");
    if (token >= recorded_) return violate("wait for fence ", token, ", never recorded");
    cv_.wait(lk, [&] { return passed_ > token; });
    log_.push_back({Event::wait, token, 0, 0, cover_[token]});
    waited_ = std::max(waited_, cover_[token]);  // what the host may now touch in the device buffer
  }

  // Direct path: the CPU kernels, checking that the bytes they touch were fenced.
  const comm::ReduceKernels& kernels() const override { return checking_; }
  const MemorySpace* scratch_space() const override { return &scratch; }

  char* host() override { return mirror_.data(); }
  uint64_t download(size_t offset, size_t bytes, uint64_t after) override {
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t id = downloads_++;
    log_.push_back({Event::download, id, offset, bytes, after < cover_.size() ? cover_[after] : 0});
    down_.enqueue([=, this] {
      std::unique_lock<std::mutex> lk2(mu_);
      cv_.wait(lk2, [&] { return passed_ > after || stopping_; });  // cudaStreamWaitEvent
      if (stopping_) return;
      if (written_ < offset + bytes) violate("download of bytes ", offset, "..", offset + bytes,
                                             " ran with only ", written_, " written");
      lk2.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(id % 3 == 0 ? 300 : 20));
      if (wire_ != DType::f32)
        comm::cpu_reduce_kernels().convert(wire_, mirror_.data() + staged_bytes(offset), DType::f32, device_ + offset,
                                           bytes / 4, scale_);
      else
        std::memcpy(mirror_.data() + offset, device_ + offset, bytes);
      lk2.lock();
      downloaded_ = id + 1;
      cv_.notify_all();
    });
    return id;
  }
  void download_wait(uint64_t ticket) override {
    std::unique_lock<std::mutex> lk(mu_);
    if (fail_download_) throw Error("fake device: injected copy failure");
    cv_.wait(lk, [&] { return downloaded_ > ticket; });
    log_.push_back({Event::download_wait, ticket, 0, 0, 0});
  }
  void upload(size_t offset, size_t bytes) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      log_.push_back({Event::upload, uploads_++, offset, bytes, 0});
    }
    up_.enqueue([=, this] {
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // lands late
      if (wire_ != DType::f32)
        comm::cpu_reduce_kernels().convert(DType::f32, device_ + offset, wire_, mirror_.data() + staged_bytes(offset),
                                           bytes / 4, 1.0f);
      else
        std::memcpy(device_ + offset, mirror_.data() + offset, bytes);
    });
  }
  void upload_wait() override {
    up_.sync();
    std::lock_guard<std::mutex> lk(mu_);
    log_.push_back({Event::upload_wait, 0, 0, 0, 0});
  }

  // The step's events, and clears them; and the violations so far.
  std::vector<Event> take_log() {
    std::lock_guard<std::mutex> lk(mu_);
    return std::exchange(log_, {});
  }
  std::vector<std::string> violations() {
    std::lock_guard<std::mutex> lk(mu_);
    return violations_;
  }
  void fail_next_download_wait() { fail_download_ = true; }
  void fail_next_wait() { fail_wait_ = true; }

  CountingSpace scratch;

 private:
  size_t staged_bytes(size_t bytes) const { return bytes / 4 * dtype_size(wire_); }
  template <class... A>
  void violate(const A&... a) {  // mu_ held
    if (violations_.size() < 20) violations_.push_back(str_cat(a...));
  }

  class CheckingKernels final : public comm::ReduceKernels {
   public:
    explicit CheckingKernels(FakeDeviceGrads& f) : f_(f) {}
    void reduce_add(DType t, void* dst, const void* src, size_t n) const override {
      check(dst, n * dtype_size(t), "reduce_add");
      comm::cpu_reduce_kernels().reduce_add(t, dst, src, n);
    }
    void scale(DType t, void* buf, size_t n, float s) const override {
      check(buf, n * dtype_size(t), "scale");
      comm::cpu_reduce_kernels().scale(t, buf, n, s);
    }
    void convert(DType to, void* dst, DType from, const void* src, size_t n,
                 float s) const override {
      check(dst, n * dtype_size(to), "convert (to)");
      check(src, n * dtype_size(from), "convert (from)");
      comm::cpu_reduce_kernels().convert(to, dst, from, src, n, s);
    }
    bool supports(DType t) const override { return comm::cpu_reduce_kernels().supports(t); }

   private:
    void check(const void* p, size_t bytes, const char* what) const {
      const char* c = static_cast<const char*>(p);
      if (c < f_.device_ || c >= f_.device_ + f_.bytes_) return;  // scratch
      std::lock_guard<std::mutex> lk(f_.mu_);
      const size_t end = size_t(c - f_.device_) + bytes;
      if (end > f_.waited_) f_.violate(what, " on bytes up to ", end, " with only ", f_.waited_, " fenced");
    }
    FakeDeviceGrads& f_;
  };

  comm::DevicePath path_;
  bool converts_;
  DType wire_ = DType::f32;  // stage_as
  float scale_ = 1;
  char* device_ = nullptr;
  size_t bytes_ = 0;
  std::vector<char> mirror_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t queued_ = 0;      // backward's writes queued (reporting thread)
  size_t written_ = 0;     // ... and done on the compute stream
  size_t waited_ = 0;      // written_ as of the last wait(): what the host may touch
  std::vector<size_t> cover_;  // per fence token: the bytes queued before it
  uint64_t recorded_ = 0, passed_ = 0, downloads_ = 0, downloaded_ = 0, uploads_ = 0;
  bool fail_download_ = false, fail_wait_ = false, stopping_ = false;
  std::vector<Event> log_;
  std::vector<std::string> violations_;
  CheckingKernels checking_{*this};
  // Last: their threads run tasks that use the members above, so they stop first.
  FakeStream compute_, down_, up_;
};

}  // namespace rt::test

// A stand-in for a device whose memory the host cannot touch, so that CPU tests prove host code
// reaches a device arena only through MemorySpace copies. SealedSpace's pages are mapped
// PROT_NONE and opened (read-write) only while its own copies run and while the backend's "device
// work" runs (SealedSpace::Open around each op); any other host dereference faults, and the
// SIGSEGV handler names the cause before the process dies.
#pragma once
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "nn/error.h"
#include "nn/ops.h"

namespace rt::test {

class SealedSpace final : public MemorySpace {
 public:
  SealedSpace() { install_fault_message(); }
  std::string name() const override { return "sealed test memory"; }
  void* allocate(size_t bytes) const override {
    std::lock_guard<std::mutex> lk(mu_);
    const size_t len = round_up(bytes);
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error("sealed space: mmap failed");
    maps_[p] = len;
    if (open_ == 0) protect(p, len, PROT_NONE);
    return p;  // anonymous pages start zeroed
  }
  void deallocate(void* p, size_t) const noexcept override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = maps_.find(p);
    if (it == maps_.end()) return;
    ::munmap(p, it->second);
    maps_.erase(it);
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    Open o(*this);
    std::memmove(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) const override {
    Open o(*this);
    std::memset(p, 0, bytes);
  }
  void to_host(void* host_dst, const void* src, size_t bytes) const override {
    Open o(*this);
    std::memcpy(host_dst, src, bytes);
    ++to_host_calls;
  }
  void from_host(void* dst, const void* host_src, size_t bytes) const override {
    Open o(*this);
    std::memcpy(dst, host_src, bytes);
    ++from_host_calls;
  }
  bool host_accessible() const override { return false; }

  // While one lives, every allocation of the space is readable and writable: the device at work.
  class Open {
   public:
    explicit Open(const SealedSpace& s) : s_(s) { s_.set_open(+1); }
    ~Open() { s_.set_open(-1); }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    const SealedSpace& s_;
  };

  mutable int64_t to_host_calls = 0, from_host_calls = 0;

 private:
  static size_t round_up(size_t bytes) {
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    return (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  }
  static void protect(void* p, size_t len, int prot) {
    if (::mprotect(p, len, prot) != 0) throw Error("sealed space: mprotect failed");
  }
  void set_open(int d) const {
    std::lock_guard<std::mutex> lk(mu_);
    const int before = open_;
    open_ += d;
    if ((before == 0) != (open_ == 0))
      for (const auto& [p, len] : maps_) protect(p, len, open_ ? PROT_READ | PROT_WRITE : PROT_NONE);
  }
  static void install_fault_message() {
    struct sigaction sa {};
    sa.sa_handler = [](int) {
      static const char m[] =
          "\nsealed test memory: the host dereferenced memory it may reach only through "
          "MemorySpace::to_host / from_host (a device's)\n";
      (void)!::write(2, m, sizeof m - 1);
      ::signal(SIGSEGV, SIG_DFL);  // the faulting access runs again and ends the process
    };
    ::sigaction(SIGSEGV, &sa, nullptr);
  }

  mutable std::mutex mu_;
  mutable std::map<void*, size_t> maps_;
  mutable int open_ = 0;
};

// The reference backend as a device: activations, gradient slots and the arena in a SealedSpace,
// each op and activation transfer run with the space open. The optimizer and the gradient
// scale-and-check are Backend's defaults, which go through host copies for such memory.
class SealedBackend final : public Backend<float> {
 public:
  // queue: claim a stream, so that a trainer reduces the gradients through device hooks.
  explicit SealedBackend(bool queue = false) : ref_(make_backend<float>("reference")), queue_(queue) {}
  std::string name() const override { return "sealed-reference"; }
  size_t act_size(const Shape& s) const override { return ref_->act_size(s); }
  void act_import(const float* x, const Shape& s, float* d) const override {
    SealedSpace::Open o(space_);
    ref_->act_import(x, s, d);
  }
  void act_export(const float* x, const Shape& s, float* d) const override {
    SealedSpace::Open o(space_);
    ref_->act_export(x, s, d);
  }
  void accumulate(float* y, const float* x, size_t n) const override {
    SealedSpace::Open o(space_);
    ref_->accumulate(y, x, n);
  }
  const MemorySpace* act_memory() const override { return &space_; }
  const MemorySpace* param_memory() const override { return &space_; }
  void* stream() const override { return queue_ ? const_cast<SealedBackend*>(this) : nullptr; }
  const SealedSpace& space() const { return space_; }

  std::unique_ptr<ConvOp<float>> make_conv(const ConvDesc& d) override {
    return std::make_unique<Conv>(ref_->make_conv(d), space_);
  }
  std::unique_ptr<BatchNormOp<float>> make_batchnorm(const BatchNormDesc& d) override {
    return std::make_unique<Bn>(ref_->make_batchnorm(d), space_);
  }
  std::unique_ptr<ReluOp<float>> make_relu(const ReluDesc& d) override {
    return std::make_unique<Relu>(ref_->make_relu(d), space_);
  }
  std::unique_ptr<MaxPoolOp<float>> make_maxpool(const MaxPoolDesc& d) override {
    return std::make_unique<MaxPool>(ref_->make_maxpool(d), space_);
  }
  std::unique_ptr<GlobalAvgPoolOp<float>> make_global_avgpool(const GlobalAvgPoolDesc& d) override {
    return std::make_unique<Pool<GlobalAvgPoolOp<float>>>(ref_->make_global_avgpool(d), space_);
  }
  std::unique_ptr<AvgPoolOp<float>> make_avgpool(const AvgPoolDesc& d) override {
    return std::make_unique<Pool<AvgPoolOp<float>>>(ref_->make_avgpool(d), space_);
  }
  std::unique_ptr<LinearOp<float>> make_linear(const LinearDesc& d) override {
    return std::make_unique<Linear>(ref_->make_linear(d), space_);
  }
  std::unique_ptr<AddOp<float>> make_add(const AddDesc& d) override {
    return std::make_unique<Add>(ref_->make_add(d), space_);
  }
  std::unique_ptr<PadShortcutOp<float>> make_pad_shortcut(const PadShortcutDesc& d) override {
    return std::make_unique<Pad>(ref_->make_pad_shortcut(d), space_);
  }
  std::unique_ptr<SoftmaxXentOp<float>> make_softmax_xent(const SoftmaxXentDesc& d) override {
    return std::make_unique<Xent>(ref_->make_softmax_xent(d), space_);
  }

 private:
  using O = SealedSpace::Open;
  template <class Op>
  struct Held : Op {
    Held(std::unique_ptr<Op> in, const SealedSpace& s) : in(std::move(in)), s(s) {}
    std::unique_ptr<Op> in;
    const SealedSpace& s;
  };
  struct Conv final : Held<ConvOp<float>> {
    using Held::Held;
    void forward(const float* x, const float* w, const float* b, float* y) override {
      O o(s);
      in->forward(x, w, b, y);
    }
    void backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db) override {
      O o(s);
      in->backward(x, w, dy, dx, dw, db);
    }
  };
  struct Bn final : Held<BatchNormOp<float>> {
    using Held::Held;
    void forward_train(const float* x, const float* g, const float* b, float* y, float* m,
                       float* v) override {
      O o(s);
      in->forward_train(x, g, b, y, m, v);
    }
    void forward_eval(const float* x, const float* g, const float* b, const float* m, const float* v,
                      float* y) override {
      O o(s);
      in->forward_eval(x, g, b, m, v, y);
    }
    void backward(const float* x, const float* g, const float* y, const float* dy, float* dx, float* dg,
                  float* db) override {
      O o(s);
      in->backward(x, g, y, dy, dx, dg, db);
    }
  };
  struct Relu final : Held<ReluOp<float>> {
    using Held::Held;
    void forward(const float* x, float* y) override {
      O o(s);
      in->forward(x, y);
    }
    void backward(const float* y, const float* dy, float* dx) override {
      O o(s);
      in->backward(y, dy, dx);
    }
  };
  struct MaxPool final : Held<MaxPoolOp<float>> {
    using Held::Held;
    void forward(const float* x, float* y, bool train) override {
      O o(s);
      in->forward(x, y, train);
    }
    void backward(const float* x, const float* y, const float* dy, float* dx) override {
      O o(s);
      in->backward(x, y, dy, dx);
    }
  };
  // Global and windowed average pooling: forward(x, y), backward(dy, dx).
  template <class Op>
  struct Pool final : Held<Op> {
    using Held<Op>::Held;
    using Held<Op>::in;
    using Held<Op>::s;
    void forward(const float* x, float* y) override {
      O o(s);
      in->forward(x, y);
    }
    void backward(const float* dy, float* dx) override {
      O o(s);
      in->backward(dy, dx);
    }
  };
  struct Linear final : Held<LinearOp<float>> {
    using Held::Held;
    void forward(const float* x, const float* w, const float* b, float* y) override {
      O o(s);
      in->forward(x, w, b, y);
    }
    void backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db) override {
      O o(s);
      in->backward(x, w, dy, dx, dw, db);
    }
  };
  struct Add final : Held<AddOp<float>> {
    using Held::Held;
    void forward(const float* a, const float* b, float* y) override {
      O o(s);
      in->forward(a, b, y);
    }
    void backward(const float* y, const float* dy, float* dx) override {
      O o(s);
      in->backward(y, dy, dx);
    }
  };
  struct Pad final : Held<PadShortcutOp<float>> {
    using Held::Held;
    void forward(const float* x, float* y) override {
      O o(s);
      in->forward(x, y);
    }
    void backward(const float* dy, float* dx) override {
      O o(s);
      in->backward(dy, dx);
    }
  };
  struct Xent final : Held<SoftmaxXentOp<float>> {
    using Held::Held;
    void forward(const float* logits, const Targets& t) override {
      O o(s);
      in->forward(logits, t);
    }
    double loss() override { return in->loss(); }
    void backward(const Targets& t, float* dlogits, double scale) override {
      O o(s);
      in->backward(t, dlogits, scale);
    }
  };
  SealedSpace space_;
  std::unique_ptr<Backend<float>> ref_;
  bool queue_;
};

}  // namespace rt::test

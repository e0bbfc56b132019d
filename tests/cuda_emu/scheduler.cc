// The emulator's scheduler: a block's threads as fibers (Boost.Context) on the calling OS thread. A
// fiber runs until it reaches a barrier or ends; when none can run, the barriers whose threads have
// all arrived open, and if none can open, the block is deadlocked and the launch fails.
#include <sys/mman.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

#include <boost/context/fiber.hpp>
#include <exception>
#include <memory>
#include <mutex>
#include <typeindex>
#include <unordered_map>
#include <vector>

#include "nn/error.h"
#include "tests/cuda_emu/emu.h"
#include "tests/cuda_emu/runtime.h"

namespace rt_emu {
namespace {

constexpr size_t kStackBytes = 256 << 10;  // per fiber; kernels keep a few hundred bytes of locals
constexpr unsigned kMaxThreads = 1024;     // per block, as every GPU since Fermi
constexpr size_t kMaxSharedBytes = 48 << 10;

enum class State { runnable, at_block_barrier, at_warp_barrier, done };

namespace bctx = boost::context;

struct Fiber {
  bctx::fiber self;  // the thread while suspended (empty while it runs and once it ended)
  bctx::fiber back;  // while it runs: the scheduler, resumed when it waits
  State state = State::runnable;
};

// Stacks for kMaxThreads fibers, reserved once per OS thread; pages are touched only as used.
class Stacks {
 public:
  Stacks() {
    base_ = mmap(nullptr, kStackBytes * kMaxThreads, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base_ == MAP_FAILED) throw rt::Error("cuda emulator: cannot reserve fiber stacks");
  }
  ~Stacks() { munmap(base_, kStackBytes * kMaxThreads); }
  void* stack(unsigned i) const { return static_cast<char*>(base_) + size_t(i) * kStackBytes; }

 private:
  void* base_;
};

// Boost.Context's stack allocator concept over one of those stacks (they outlive every fiber).
struct ReservedStack {
  void* bottom;
  bctx::stack_context allocate() const {
    bctx::stack_context s;
    s.size = kStackBytes;
    s.sp = static_cast<char*>(bottom) + kStackBytes;  // stacks grow down from here
    return s;
  }
  void deallocate(bctx::stack_context&) const noexcept {}
};

// AddressSanitizer tracks the stack it runs on: a switch it is not told of makes it take frames on
// the other stack for overflows, and an exception thrown there leaves them poisoned. So every
// switch is announced (start before, finish after), and a fiber's last one says it ends (no save).
struct StackSpan {
  const void* bottom = nullptr;
  size_t size = 0;
};
#if defined(__SANITIZE_ADDRESS__)
// Switches to `to`, running on `span`; returns the fiber that switched back here.
bctx::fiber switch_to(bctx::fiber&& to, StackSpan span) {
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, span.bottom, span.size);
  bctx::fiber back = std::move(to).resume();
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
  return back;
}
// First thing in a fiber: the span of the stack that switched to it.
StackSpan entered() {
  StackSpan from;
  __sanitizer_finish_switch_fiber(nullptr, &from.bottom, &from.size);
  return from;
}
// Last thing in a fiber, before it returns to `span`.
void leaving(StackSpan span) { __sanitizer_start_switch_fiber(nullptr, span.bottom, span.size); }
#else
bctx::fiber switch_to(bctx::fiber&& to, StackSpan) { return std::move(to).resume(); }
StackSpan entered() { return {}; }
void leaving(StackSpan) {}
#endif

// Thrown at a waiting thread of a failed block, so that its fiber unwinds and ends here rather
// than through Boost's forced unwinding, which ASan is not told of.
struct Abandoned {};

struct Block {
  const std::function<void()>* body = nullptr;
  dim3 dim;
  unsigned threads = 0;
  std::vector<Fiber> fibers;
  std::vector<unsigned char> slots;  // kWarpSlotBytes per thread, for shuffles
  const Stacks* stacks = nullptr;
  StackSpan scheduler;  // the calling thread's stack, where the fibers return
  unsigned current = 0;
  std::exception_ptr error;
  bool direct = false;  // threads run one after another on the calling thread, no fibers
  bool waited = false;  // some thread reached a barrier
  bool abandon = false;  // the block failed: waiting threads throw Abandoned when resumed
};

// Whether each kernel (by the type of its launch) reached a barrier in its first launch, which
// runs as fibers. Later launches of a kernel that did not run its threads straight on the calling
// thread, one after another: a fiber switch, cheap as it is, costs more than most kernels' threads,
// and most kernels never wait. A kernel that then reaches a barrier after all fails its launch
// instead of running wrongly.
std::mutex g_kernels_mu;
std::unordered_map<std::type_index, bool>& uses_barriers() {
  static std::unordered_map<std::type_index, bool> m;
  return m;
}

thread_local Builtins tl_builtins;
thread_local Block* tl_block = nullptr;

Block& block() {
  if (!tl_block) throw rt::Error("cuda emulator: a device-only call outside a kernel");
  return *tl_block;
}

// Thread t's fiber: runs the kernel body for it; an exception ends the fiber and is rethrown by
// the scheduler (it cannot unwind past the fiber's first frame). Boost's forced_unwind (a fiber
// destroyed while suspended, which abandon() prevents) must pass.
bctx::fiber fiber_main(Block& b, unsigned t, bctx::fiber&& scheduler) {
  b.scheduler = entered();
  b.fibers[t].back = std::move(scheduler);
  try {
    if (!b.abandon) (*b.body)();  // a thread first resumed to be abandoned never starts
  } catch (const bctx::detail::forced_unwind&) {
    throw;
  } catch (const Abandoned&) {
  } catch (...) {
    if (!b.error) b.error = std::current_exception();
  }
  b.fibers[t].state = State::done;
  leaving(b.scheduler);
  return std::move(b.fibers[t].back);  // ends the fiber, resuming the scheduler
}

void set_thread(Block& b, unsigned t) {
  b.current = t;
  tl_builtins.thread_idx = {t % b.dim.x, (t / b.dim.x) % b.dim.y, t / (b.dim.x * b.dim.y)};
}

// Scheduler side: runs thread t until it waits or ends.
void resume(Block& b, unsigned t) {
  set_thread(b, t);
  b.fibers[t].self =
      switch_to(std::move(b.fibers[t].self), {b.stacks->stack(t), kStackBytes});
}

void wait(State s) {
  Block& b = block();
  if (b.direct)
    throw rt::Error("cuda emulator: a kernel that reached no barrier in its first launch reached "
                    "one in a later launch; run it first where it waits");
  b.waited = true;
  const unsigned self = b.current;
  Fiber& f = b.fibers[self];
  f.state = s;
  f.back = switch_to(std::move(f.back), b.scheduler);  // the scheduler resumes it as `self` again
  if (b.abandon) throw Abandoned{};
}

// Opens every barrier whose threads have all arrived; false when none could open.
bool open_barriers(Block& b) {
  unsigned live = 0, at_block = 0;
  for (const Fiber& f : b.fibers) {
    live += f.state != State::done;
    at_block += f.state == State::at_block_barrier;
  }
  bool opened = false;
  if (at_block > 0 && at_block == live) {
    // Every thread still running waits here; threads that already ended cannot arrive, which on
    // the device is undefined (a hang or a barrier that ignores them): an error here, unless none
    // ended.
    if (live != b.threads)
      throw rt::Error(rt::str_cat("cuda emulator: __syncthreads reached by ", live, " of ",
                                  b.threads, " threads of block (", tl_builtins.block_idx.x, ",",
                                  tl_builtins.block_idx.y, ",", tl_builtins.block_idx.z,
                                  "); the others had returned"));
    for (Fiber& f : b.fibers) f.state = State::runnable;
    return true;
  }
  for (unsigned w = 0; w * 32 < b.threads; ++w) {
    const unsigned lo = w * 32, hi = std::min(b.threads, lo + 32);
    unsigned arrived = 0;
    for (unsigned t = lo; t < hi; ++t) arrived += b.fibers[t].state == State::at_warp_barrier;
    // A partial warp, or lanes that ended or wait elsewhere: reported if nothing else can move.
    if (hi - lo != 32 || arrived != 32) continue;
    for (unsigned t = lo; t < hi; ++t) b.fibers[t].state = State::runnable;
    opened = true;
  }
  return opened;
}

[[noreturn]] void deadlock(const Block& b) {
  unsigned at_block = 0, at_warp = 0, done = 0;
  for (const Fiber& f : b.fibers) {
    at_block += f.state == State::at_block_barrier;
    at_warp += f.state == State::at_warp_barrier;
    done += f.state == State::done;
  }
  throw rt::Error(rt::str_cat("cuda emulator: block (", tl_builtins.block_idx.x, ",",
                              tl_builtins.block_idx.y, ",", tl_builtins.block_idx.z,
                              ") deadlocked: of ", b.threads, " threads ", at_block,
                              " wait at __syncthreads, ", at_warp,
                              " at a warp shuffle (which needs all 32 lanes), ", done, " ended"));
}

// A failed block's waiting threads unwind and end (their locals destroyed), each resumed once to
// throw Abandoned from its barrier.
void abandon(Block& b) noexcept {
  b.abandon = true;
  for (unsigned t = 0; t < b.threads; ++t)
    if (b.fibers[t].self) resume(b, t);
}

void run_block(Block& b) {
  if (b.direct) {
    for (unsigned t = 0; t < b.threads; ++t) {
      set_thread(b, t);
      (*b.body)();
    }
    return;
  }
  for (unsigned t = 0; t < b.threads; ++t) {
    b.fibers[t].state = State::runnable;
    b.fibers[t].self = bctx::fiber(std::allocator_arg, ReservedStack{b.stacks->stack(t)},
                                   [&b, t](bctx::fiber&& scheduler) {
                                     return fiber_main(b, t, std::move(scheduler));
                                   });
  }
  try {
    for (;;) {
      // Each runnable thread runs until it waits at a barrier or ends; then none is runnable.
      for (unsigned t = 0; t < b.threads; ++t) {
        if (b.fibers[t].state != State::runnable) continue;
        resume(b, t);
        if (b.error) std::rethrow_exception(b.error);
      }
      bool all_done = true;
      for (const Fiber& f : b.fibers) all_done = all_done && f.state == State::done;
      if (all_done) return;
      if (!open_barriers(b)) deadlock(b);
    }
  } catch (...) {
    abandon(b);
    throw;
  }
}

}  // namespace

Builtins& builtins() { return tl_builtins; }

unsigned linear_thread() { return block().current; }

unsigned char* warp_slot(unsigned linear) {
  Block& b = block();
  if (linear >= b.threads) throw rt::Error("cuda emulator: shuffle with a lane past the block");
  return b.slots.data() + size_t(linear) * kWarpSlotBytes;
}

void sync_block() { wait(State::at_block_barrier); }
void sync_warp() { wait(State::at_warp_barrier); }

bool launch_ok(dim3 grid, dim3 blk, size_t shared_bytes) {
  if (tl_block) throw rt::Error("cuda emulator: a launch from inside a kernel");
  const uint64_t threads = uint64_t(blk.x) * blk.y * blk.z;
  // The device's limits (cudaErrorInvalidConfiguration / cudaErrorInvalidValue there).
  if (threads == 0 || threads > kMaxThreads || blk.z > 64 || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 ||
      shared_bytes > kMaxSharedBytes) {
    set_last_error(cudaErrorInvalidConfiguration);
    return false;
  }
  return true;
}

void run_grid(dim3 grid, dim3 blk, size_t shared_bytes, const std::function<void()>& body,
              const std::type_info& kernel) {
  const uint64_t threads = uint64_t(blk.x) * blk.y * blk.z;
  static thread_local std::unique_ptr<Stacks> stacks;
  if (!stacks) stacks = std::make_unique<Stacks>();
  Block b;
  bool known = false;
  {
    std::lock_guard lock(g_kernels_mu);
    const auto it = uses_barriers().find(kernel);
    known = it != uses_barriers().end();
    b.direct = known && !it->second;
  }
  b.body = &body;
  b.stacks = stacks.get();
  b.dim = blk;
  b.threads = unsigned(threads);
  b.fibers.resize(b.threads);
  b.slots.resize(size_t(b.threads) * kWarpSlotBytes);
  tl_builtins.block_dim = blk;
  tl_builtins.grid_dim = grid;
  tl_block = &b;
  try {
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          tl_builtins.block_idx = {x, y, z};
          run_block(b);
        }
  } catch (...) {
    tl_block = nullptr;
    throw;
  }
  tl_block = nullptr;
  if (!known) {
    std::lock_guard lock(g_kernels_mu);
    uses_barriers().emplace(kernel, b.waited);
  }
}

}  // namespace rt_emu

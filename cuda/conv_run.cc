// ConvRunner: a direction's first run, and the move to the next candidate when cuDNN refuses it
// (see conv_run.h).
#include "cuda/conv_run.h"

#include <cstdio>
#include <utility>
#include <vector>

#include "cuda/check.h"

namespace rt::cuda {
namespace {

constexpr const char* kDirectionName[3] = {"forward", "backward-data", "backward-filter"};

}  // namespace

ConvRunner::ConvRunner(CudaContext& ctx, const ConvAlgos& a, cudnnConvolutionDescriptor_t fwd,
                       cudnnConvolutionDescriptor_t bwd_data,
                       cudnnConvolutionDescriptor_t bwd_filter, std::string key, std::string layer,
                       std::string kind)
    : ctx_(ctx), a_(a), desc_{fwd, bwd_data, bwd_filter}, key_(std::move(key)),
      layer_(std::move(layer)), kind_(std::move(kind)) {}

int ConvRunner::algo(ConvDirection dir) const { return direction(a_, dir).algo; }

void ConvRunner::take(ConvDirection dir, const ConvCandidate& c) {
  CUDNN_CHECK(cudnnSetConvolutionMathType(desc_[dir], c.math));
  if (c.workspace > a_.workspace) {
    a_.workspace = c.workspace;
    ctx_.reserve_workspace(a_.workspace);  // waits for the work queued on the old one
  }
  set_direction(a_, dir, c);
}

cudnnStatus_t ConvRunner::first_run(ConvDirection dir,
                                    const std::function<cudnnStatus_t(int, void*, size_t)>& call) {
  // A layer of the shape that ran before may have moved this direction already: start there.
  if (const ConvAlgos* now = ctx_.conv_algos().current(key_)) {
    if (const ConvCandidate moved = direction(*now, dir); moved.algo != algo(dir)) {
      take(dir, moved);
      a_.next[dir] = now->next[dir];
    }
  }
  std::vector<ConvCandidate>& next = a_.next[dir];
  std::string refused;  // each refused algorithm and cuDNN's reason
  size_t taken = 0;     // candidates of `next` moved to
  bool out_of_memory = false;
  char why[512] = {};
  for (;;) {
    // Read (and so cleared) before the call: cuDNN may keep a message of an earlier failure, such
    // as a workspace query the choice passed over, that this refusal would otherwise seem to give.
    cudnnGetLastErrorString(why, sizeof why);
    const cudnnStatus_t s = call(algo(dir), ctx_.workspace(), a_.workspace);
    if (s == CUDNN_STATUS_SUCCESS) {
      ran_[dir] = true;
      if (taken > 0) {
        next.erase(next.begin(), next.begin() + std::ptrdiff_t(taken));
        if (ctx_.conv_algos().revise(key_, a_, dir))
          std::fprintf(stderr,
                       "warning: layer %s: cuDNN refused to run the %s%s algorithm chosen for its "
                       "shape; algorithm %d runs instead, for every layer of the shape (%s)\n",
                       layer_.c_str(), kind_.c_str(), kDirectionName[dir], algo(dir),
                       refused.c_str() + 2);
      }
      return s;
    }
    why[0] = 0;
    cudnnGetLastErrorString(why, sizeof why);
    // A device fault (an illegal address, a kernel that failed) is sticky: every later call
    // returns it, no other algorithm could run, and it, not the choice, is what to report. The
    // stream is waited for, not queried: a kernel the refused call did launch may still be
    // running, and its fault would otherwise surface later, blamed on the next candidate. (A
    // first run only: once per direction and layer.)
    const cudaError_t q = cudaStreamSynchronize(ctx_.stream());
    // A launch that failed for want of resources leaves the runtime's last error set: it belongs
    // here, not to the next launch's check.
    (void)cudaGetLastError();
    if (q != cudaSuccess)
      throw Error(str_cat("layer ", layer_, ": the device failed while cuDNN ran its ", kind_,
                          kDirectionName[dir], " algorithm ", algo(dir), " (", cudaGetErrorName(q),
                          ": ", cudaGetErrorString(q), "): a fault of that or an earlier kernel, not "
                          "a refusal of the algorithm; cuDNN said ", cudnnGetErrorString(s), " (",
                          int(s), ")", *why ? ": " : "", why));
    out_of_memory |= s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ||
                     s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    refused += str_cat("; algorithm ", algo(dir), ": ", cudnnGetErrorString(s), " (", int(s), ")",
                       *why ? ": " : "", why);
    if (taken == next.size()) {
      std::string what = str_cat("layer ", layer_, ": cuDNN runs no ", kind_, kDirectionName[dir],
                                 " algorithm whose workspace it confirmed (", refused.substr(2), ")");
      // Out of memory, the trainer's error adds what to reduce.
      if (out_of_memory) throw OutOfMemory(std::move(what));
      throw ConvRefused(std::move(what));
    }
    take(dir, next[taken++]);
  }
}

}  // namespace rt::cuda

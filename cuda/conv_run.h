// Running a convolution's three directions with the algorithms conv_choose_algos chose, and what
// a first run does when cuDNN refuses one. Heuristic choice (cudnnGet*_v7) runs no candidate at
// set-up, and a workspace query's success does not promise the call's: cuDNN may still answer
// NOT_SUPPORTED, or fail the launch, for an algorithm on this shape and GPU. As PyTorch does,
// the first run of a direction then tries the next confirmed candidate in rank order: the step
// goes on, the context's choice for the shape is revised (and appended to the algorithm cache
// file), and one warning names the layer, the algorithm taken and cuDNN's reasons. Once a
// direction has run, its failures are errors like any other call's.
#pragma once
#include <cudnn.h>

#include <cstddef>
#include <functional>
#include <string>

#include "cuda/conv_algo_cache.h"
#include "cuda/context.h"

namespace rt::cuda {

enum ConvDirection : int { kConvForward = 0, kConvBackwardData = 1, kConvBackwardFilter = 2 };

// A direction's first run found no candidate cuDNN would run: each refused it (not for want of
// memory, which is OutOfMemory, nor a device fault). A 16-bit stem then pads its input (lowp_conv).
class ConvRefused : public Error {
 public:
  using Error::Error;
};

class ConvRunner {
 public:
  // a: the layer's choice, with its candidates; fwd, bwd_data, bwd_filter: its descriptors, set
  // to a's math types; key: its conv_algo_key; layer and kind ("", "bf16 NHWC ") name it.
  ConvRunner(CudaContext& ctx, const ConvAlgos& a, cudnnConvolutionDescriptor_t fwd,
             cudnnConvolutionDescriptor_t bwd_data, cudnnConvolutionDescriptor_t bwd_filter,
             std::string key, std::string layer, std::string kind);

  // call(algo, workspace, bytes) issues direction dir's cuDNN call on the context's stream with
  // that algorithm (the direction's enum as an int) and workspace, returning its status, which
  // run returns. At the direction's first run a refused algorithm moves on to the next
  // candidate; when none runs, throws ConvRefused naming the layer and each refusal
  // (rt::OutOfMemory when cuDNN ran out of memory). A failure that left the device faulted (a
  // sticky CUDA error) is no refusal: it throws at once, naming the fault.
  template <class Call>
  cudnnStatus_t run(ConvDirection dir, Call&& call) {
    if (ran_[dir]) return call(algo(dir), ctx_.workspace(), a_.workspace);
    return first_run(dir, [&call](int algo, void* ws, size_t bytes) { return call(algo, ws, bytes); });
  }

  // The algorithms in use (changed only by a refused first run) and the workspace they need.
  const ConvAlgos& algos() const { return a_; }
  size_t workspace() const { return a_.workspace; }

 private:
  int algo(ConvDirection dir) const;  // direction dir's algorithm in use
  // Moves direction dir to candidate c: its math type, a larger workspace if it needs one.
  void take(ConvDirection dir, const ConvCandidate& c);
  cudnnStatus_t first_run(ConvDirection dir,
                          const std::function<cudnnStatus_t(int, void*, size_t)>& call);
  CudaContext& ctx_;
  ConvAlgos a_;
  cudnnConvolutionDescriptor_t desc_[3];
  std::string key_, layer_, kind_;
  bool ran_[3] = {};
};

}  // namespace rt::cuda

// The step-by-step ring ("ring", the default algorithm), with its two phases callable on their own
// so that the hierarchical allreduce can run them over a node's ranks (comm/hierarchical.cc).
#pragma once
#include <vector>

#include "comm/allreduce.h"

namespace rt::comm {

class RingAllreducer final : public Allreducer {
 public:
  RingAllreducer(Communicator& comm, const ReduceKernels& k, const CommConfig& cfg,
                 const MemorySpace* scratch)
      : Allreducer(comm, k, cfg, scratch) {}
  const char* name() const override { return "ring"; }

  // The reduce-scatter alone: afterwards this rank's chunk of buf (the returned range,
  // ring_chunk(count, size, ring_owned_chunk(rank, size))) holds the sum over all ranks; the rest
  // of buf holds partial sums. Any count; with one rank, the whole buffer.
  Range reduce_scatter(char* buf, size_t count, DType t);
  // The allgather alone: every rank's chunk (as reduce_scatter returns it) is copied to all.
  void allgather(char* buf, size_t count, DType t);

 protected:
  void run(void* buf, size_t count, DType t, ReduceOp op) override;

 private:
  std::vector<size_t> posted_;
};

}  // namespace rt::comm

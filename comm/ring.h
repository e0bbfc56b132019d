// The step-by-step ring ("ring", the default algorithm), with its two phases callable on their own
// so that the hierarchical allreduce can run them over a node's ranks (comm/hierarchical.cc).
#pragma once
#include <string>
#include <vector>

#include "comm/allreduce.h"

namespace rt::comm {

// The ranks' order around the ring: order[p] is the rank at position p. "node" (cfg.ring_order)
// puts each node's ranks in a row, nodes ordered by their lowest rank, ranks within by rank: with
// ranks placed round-robin over the nodes (--map-by node), MPI's order would cross the network
// at every hop, this order once per node. "rank" keeps MPI's order. CommError for another name.
std::vector<int> ring_order(const Communicator& comm, const std::string& order);

class RingAllreducer final : public Allreducer {
 public:
  // order: the rank at each ring position (a permutation of the ranks, the same on every rank);
  // empty: ring_order(comm, cfg.ring_order).
  RingAllreducer(Communicator& comm, const ReduceKernels& k, const CommConfig& cfg,
                 const MemorySpace* scratch, std::vector<int> order = {});
  const char* name() const override { return "ring"; }
  int position() const { return pos_; }

  // The reduce-scatter alone: afterwards this rank's chunk of buf (the returned range,
  // ring_chunk(count, size, ring_owned_chunk(position(), size))) holds the sum over all ranks; the rest
  // of buf holds partial sums. Any count; with one rank, the whole buffer.
  Range reduce_scatter(char* buf, size_t count, DType t);
  // The allgather alone: every rank's chunk (as reduce_scatter returns it) is copied to all.
  void allgather(char* buf, size_t count, DType t);

 protected:
  void run(void* buf, size_t count, DType t, ReduceOp op) override;

 private:
  std::vector<size_t> posted_;
  int pos_ = 0, next_ = 0, prev_ = 0;  // this rank's ring position; its neighbours' ranks
};

}  // namespace rt::comm

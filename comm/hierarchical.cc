// The hierarchical allreduce: the ring within each node, then across nodes, then within again.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/hierarchical.h"

#include "comm/mpi_check.h"
#include "comm/ring.h"

namespace rt::comm {

// ---------------------------------------------------------------------------------------------
// With H nodes of L ranks each (N = H·L), the flat ring makes 2(N-1) steps, and when MPI placed
// the ranks round-robin over the nodes every one of its hops crosses the network. The
// hierarchical allreduce (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE, NCCL's 2D rings) runs three
// rings instead:
//
//   1. within each node, a ring reduce-scatter: local rank l ends with the node's sum of chunk
//      c(l) (the buffer cut L ways, over shared memory);
//   2. across nodes, L rings side by side, one per local rank: the ranks with local rank l (one
//      per node) allreduce chunk c(l), S/L bytes, with the ring;
//   3. within each node, a ring allgather of the L chunks.
//
// Each node's network link carries L rings of 2(H-1)/H · S/L bytes each, 2(H-1)/H · S in all,
// where the flat ring's, ordered node by node, carries 2(N-1)/N · S; and only 2(H-1) steps pay
// the network's latency instead of 2(N-1). Every rank ends bitwise identical: each cross-node
// ring leaves its H ranks identical (one rank computes each value), and the allgather copies.
// Averaging scales the chunk once after step 2, on bits that are already identical.
//
// Every node must hold the same number of ranks (the cross-node rings pair local rank l of every
// node); the constructor refuses other placements, naming the nodes' sizes.
// ---------------------------------------------------------------------------------------------

std::string hierarchical_placement_error(const std::vector<int>& node_of) {
  std::map<int, int> ranks;  // node (its lowest rank) -> how many ranks it holds
  for (int node : node_of) ++ranks[node];
  std::string sizes;
  bool even = true;
  for (const auto& [node, count] : ranks) {
    sizes += str_cat(sizes.empty() ? "" : ", ", count, " (rank ", node, "'s node)");
    even = even && count == ranks.begin()->second;
  }
  if (even) return {};
  return str_cat("allreduce 'hierarchical' needs the same number of ranks on every node; ranks "
                 "per node: ", sizes, ". Place the ranks evenly, set comm.ranks_per_node, or use "
                 "comm.algorithm: ring");
}

namespace {

class HierarchicalAllreducer final : public Allreducer {
 public:
  HierarchicalAllreducer(Communicator& comm, const ReduceKernels& k, const CommConfig& cfg,
                         const MemorySpace* scratch)
      : Allreducer(comm, k, cfg, scratch) {
    const int n = comm.size(), r = comm.rank(), per = cfg.ranks_per_node;
    if (per < 0)
      throw CommError(str_cat("allreduce 'hierarchical': comm.ranks_per_node must be >= 0, got ", per));
    if (per > 0 && n % per != 0)
      throw CommError(str_cat("allreduce 'hierarchical': comm.ranks_per_node ", per,
                              " does not divide the ", n, " ranks"));
    // Every rank's node, named by its lowest rank: blocks of k, or the shared-memory nodes.
    std::vector<int> node_of(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) node_of[static_cast<size_t>(q)] = per > 0 ? q / per * per : comm.node_of(q);
    if (const std::string e = hierarchical_placement_error(node_of); !e.empty()) throw CommError(e);
    local_ = comm.split(node_of[static_cast<size_t>(r)], r);
    local_ring_ = std::make_unique<RingAllreducer>(*local_, k, cfg, scratch);
    // The cross rings join the ranks that own the same chunk after the node's reduce-scatter: the
    // same ring position, which is not the same local rank where a block of comm.ranks_per_node
    // spans machines and its ring is put in their order.
    cross_ = comm.split(local_ring_->position(), r);
    cross_ring_ = std::make_unique<RingAllreducer>(*cross_, k, cfg, scratch);
  }
  const char* name() const override { return "hierarchical"; }
  void reserve(DType t) override {
    local_ring_->reserve(t);
    cross_ring_->reserve(t);
  }

 protected:
  void run(void* buf, size_t count, DType t, ReduceOp op) override {
    const int n = comm_.size();
    if (n == 1 || count == 0) return;
    char* base = static_cast<char*>(buf);
    const Range mine = local_ring_->reduce_scatter(base, count, t);
    char* chunk = base + mine.offset * dtype_size(t);
    cross_ring_->allreduce(chunk, mine.len, t, ReduceOp::sum);
    if (op == ReduceOp::average) kernels_.scale(t, chunk, mine.len, 1.0f / static_cast<float>(n));
    local_ring_->allgather(base, count, t);
  }

 private:
  std::unique_ptr<Communicator> local_, cross_;  // this rank's node; local rank l of every node
  std::unique_ptr<RingAllreducer> local_ring_, cross_ring_;
};

}  // namespace

std::unique_ptr<Allreducer> make_hierarchical_allreducer(Communicator& comm, const ReduceKernels& k,
                                                         const CommConfig& cfg, const MemorySpace* scratch) {
  return std::make_unique<HierarchicalAllreducer>(comm, k, cfg, scratch);
}

}  // namespace rt::comm

// model.bn_group's transport: batch-norm sums over a group of ranks (nn/ops.h BnSync), added by
// recursive doubling in double precision.
//
// A synchronised batch norm sums a few values per channel (3C + 1 in forward, 2C in backward:
// at most 6145 doubles for ResNet-50), twice per layer and step. At that size the cost is the
// number of message latencies, not bytes: the ring's 2(N-1) steps would multiply it, while
// recursive doubling takes log2(N) exchanges of the whole vector (plus two for a group that is
// not a power of two). PyTorch's SyncBatchNorm all-gathers every rank's statistics instead
// (one step, N times the bytes).
#pragma once
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/allreduce.h"
#include "comm/communicator.h"
#include "comm/stall.h"
#include "nn/ops.h"

namespace rt::comm {

// One rank's part in a recursive-doubling sum over `size` ranks, as pure arithmetic. With p the
// largest power of two <= size: ranks p .. size-1 first send their vector to rank r - p, which
// adds it to its own (fold); the first p ranks then, for each bit k < log2 p, exchange vectors
// with rank r ^ 2^k and add (one side computes a + b, the other b + a: IEEE addition commutes
// exactly, so both hold the same bits); last, each folded rank receives the result from r - p.
struct RdStep {
  enum Kind : uint8_t { send_fold, recv_fold, exchange, send_result, recv_result };
  Kind kind;
  int peer;
  bool operator==(const RdStep&) const = default;
};
std::vector<RdStep> recursive_doubling_steps(int rank, int size);

// Why `group` cannot split `world` ranks into model.bn_group's groups (blocks of `group`
// consecutive ranks; 0 means all of them), or "" when it can.
std::string bn_group_error(int group, int world);

// BnSync over MPI. Groups are blocks of consecutive ranks, so with the usual placement (a node's
// ranks numbered together) a group of up to a node's size never leaves its node.
class BnGroupSync final : public BnSync {
 public:
  // Collective over `world`: checks that every rank passes the same group (CommError naming the
  // ranks that differ), splits it, and sets up the stall check with cfg's stall_* times (as the
  // gradient reducer's: a rank that never reaches a step's batch norms is named, not waited for
  // forever). Waits follow cfg.idle_sleep_us (0: they spin: a sum is short and the layer waits
  // for it; sleeping 50 us between polls made ResNet-20's sums 4x as long on 2 cores).
  BnGroupSync(MPI_Comm world, int group, const CommConfig& cfg);
  ~BnGroupSync() override;

  // In place over v[0, n) (n the same on every rank of the group; checked per message).
  void sum(double* v, size_t n) override;
  int ranks() const override { return group_->size(); }
  // Sizes the receive buffer for vectors of up to n values now (set-up), so no step allocates.
  void reserve(size_t n) { recv_.reserve(n); }

  // The stall check's step boundaries: call begin_step before a step's first forward, end_step
  // after its last backward. seconds() is the time spent in sum() since begin_step.
  void begin_step(int64_t step);
  void end_step();
  double seconds() const { return seconds_; }

 private:
  std::unique_ptr<Communicator> world_, group_;
  std::unique_ptr<StallWatch> stall_;
  int idle_sleep_us_;
  std::vector<RdStep> steps_;
  std::vector<double> recv_;  // one vector's worth (reserve)
  double seconds_ = 0;
};

}  // namespace rt::comm

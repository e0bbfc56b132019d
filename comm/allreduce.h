// Interchangeable allreduce algorithms behind one interface, chosen by name from the config:
// "ring" (ours, the default), "hierarchical" (our ring within each node and across nodes),
// "mpi" (MPI_Allreduce), "reducer" (one rank sums, then sends the result back: the baseline the
// ring replaced) and "nccl" (registered by cuda/ where NCCL is built).
#pragma once
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/reduce.h"
#include "comm/ring_schedule.h"
#include "nn/tensor.h"

namespace rt::comm {

enum class ReduceOp : uint8_t { sum, average };

// Communication settings. Every rank must use the same values (checked at start-up).
struct CommConfig {
  std::string algorithm = "ring";     // ring | hierarchical | mpi | reducer | nccl (GPU builds only)
  int ranks_per_node = 0;             // hierarchical: what a node is. 0: the ranks that share
                                      // memory (MPI_COMM_TYPE_SHARED); k: ranks k·i .. k·i+k-1
  std::string ring_order = "node";    // ring: who follows whom. node: the ranks of each node
                                      // in a row, nodes by their lowest rank (one crossing per
                                      // node, however MPI placed the ranks); rank: MPI's order
  size_t bucket_bytes = 25u << 20;    // gradient bucket (PyTorch DDP's default 25 MiB)
  bool overlap = true;                // allreduce buckets while backward is still running
  size_t segment_bytes = 512u << 10;  // ring/reducer pipeline segment: receive one, reduce another
  size_t network_segment_bytes = 63u << 10;  // the segment when the ranks span several nodes
                                      // (0: segment_bytes). Below OpenMPI's TCP eager limit
                                      // (64 KiB): a larger message goes by rendezvous, whose
                                      // acknowledgement waits behind bulk data (see docs/comm.md)
  bool check_counts = false;          // verify each call's count on all ranks (one small allgather)
  int idle_sleep_us = 0;              // >0: a blocked wait polls, then sleeps this long between
                                      // polls instead of spinning in MPI_Wait (frees the core)
  int overlap_idle_sleep_us = 50;     // the same for the waits of GradientReducer's overlapping
                                      // communication thread (0: MPI_Wait), where a spinning wait
                                      // takes the core from backward
  int recv_depth = 4;                 // ring/reducer: segments received ahead of the one being
                                      // added (>= 2); deeper lets a rendezvous protocol (TCP
                                      // above 64 KiB) acknowledge before the data is needed
  double stall_warning_s = 60;        // GradientReducer: a rank waiting this long in a step names
                                      // the ranks that have not reached it (0: never)
  double stall_abort_s = 600;         // ... and after this long stops the job (0: waits forever)
  std::string device_path = "auto";   // gradients in GPU memory: direct (MPI reads the device
                                      // buffer; needs CUDA-aware MPI), staged (through a pinned
                                      // host mirror) or auto (direct if MPI is CUDA-aware)
  std::string compression = "none";   // GradientReducer: fp32 gradients travel and are summed as
                                      // none (fp32), bf16 or fp16: half the bytes on the wire,
                                      // one rounding per ring hop (DDP's compress hooks, Horovod's
                                      // Compression.fp16)
};

// Whether `compression` names a setting: none, bf16 or fp16.
bool compression_known(const std::string& compression);
// The element type gradient buckets of type t travel in under `compression`: t itself for
// "none", else bf16 or f16, which only fp32 gradients may be compressed to. CommError for an
// unknown name or another gradient type.
DType compression_wire_type(const std::string& compression, DType t);

// The algorithm names make_allreducer knows (in the order a benchmark sweeps them).
const std::vector<std::string>& allreduce_algorithms();

class Allreducer {
 public:
  virtual ~Allreducer() = default;
  virtual const char* name() const = 0;

  // In place over buf[0, count) of element type t: every rank ends with the sum (or the sum
  // scaled once by 1/ranks) of all ranks' buffers. Collective: every rank of the communicator
  // calls it with the same count, type and op, in the same order. ring and reducer leave every
  // rank bitwise identical by construction (one rank computes each final value, the others copy
  // it). Any count, including 0 and counts above INT_MAX.
  void allreduce(void* buf, size_t count, DType t, ReduceOp op);
  void allreduce(std::span<float> buf, ReduceOp op) {
    allreduce(buf.data(), buf.size(), DType::f32, op);
  }
  // Whether allreduce takes element type t (mpi: f32 only; the others: what their kernels add).
  virtual bool supports(DType t) const { return kernels_.supports(t); }
  // Sizes receive scratch in a non-host space for calls of type t now (set-up), so that no later
  // call allocates there; host scratch is still allocated on first use.
  virtual void reserve(DType t);

 protected:
  // scratch: the memory space of the receive scratch (nullptr: host memory); device memory when
  // the kernels add on the device.
  Allreducer(Communicator& comm, const ReduceKernels& kernels, const CommConfig& cfg,
             const MemorySpace* scratch = nullptr);
  virtual void run(void* buf, size_t count, DType t, ReduceOp op) = 0;

  // Receives range r from `peer` in segments of `seg` elements into recv_depth scratch buffers
  // (later segments are posted before the current one is added), and adds each into buf. _post
  // posts the first recv_depth receives (so that a peer's messages find their receives already
  // waiting), _finish completes them; recv_reduce does both.
  void recv_reduce_post(Range r, size_t seg, DType t, int peer, int tag);
  void recv_reduce_finish(char* buf, Range r, size_t seg, DType t, int peer, int tag);
  void recv_reduce(char* buf, Range r, size_t seg, DType t, int peer, int tag) {
    recv_reduce_post(r, seg, t, peer, tag);
    recv_reduce_finish(buf, r, seg, t, peer, tag);
  }
  // Posts one send per segment of range r of buf to `peer`, appending the requests to reqs.
  void send_segments(const char* buf, Range r, size_t seg, DType t, int peer, int tag,
                     std::vector<MPI_Request>& reqs);
  // Posts receives of range r from `peer` straight into buf (no arithmetic), one per segment,
  // behind those already pending; returns how many. wait_recvs(n) completes the n oldest.
  size_t post_recv_segments(char* buf, Range r, size_t seg, DType t, int peer, int tag);
  void wait_recvs(size_t n, DType t);
  size_t segment_for(DType t) const;

  Communicator& comm_;
  const ReduceKernels& kernels_;
  CommConfig cfg_;
  const MemorySpace* scratch_space_;     // where scratch lives (nullptr: host)
  std::vector<Buffer<char>> scratch_;    // recv_depth buffers, persisting across calls
  std::vector<MPI_Request> sends_;
  struct PendingRecv {
    MPI_Request req;
    size_t len;
    int peer;
  };
  std::vector<PendingRecv> recvs_;  // posted by post_recv_segments, completed in order
  size_t recvs_done_ = 0;
  std::vector<MPI_Request> reduce_req_;  // one per scratch buffer

 private:
  void check_same_call(size_t count, DType t, ReduceOp op);
};

// Gradient compression's allreduce of the fp32 buf[0, n): each value times pre_scale, rounded once
// to `wire` into wire_buf (n elements, where the kernels work), summed there by `ar` (one rounding
// per hop), widened back into buf. GradientReducer's path for a compressed bucket (pre_scale =
// 1/ranks), and what allreduce_bench times for its ":bf16" candidates.
void compressed_allreduce(Allreducer& ar, const ReduceKernels& k, DType wire, void* wire_buf,
                          float* buf, size_t n, float pre_scale);

// Throws rt::CommError for an unknown name, for "nccl" in a program that did not register it, or
// for an element type the kernels do not support. Collective only in that it must be called on
// every rank (no messages; a registered algorithm may add its own, as nccl's set-up does).
// scratch: where receive scratch is allocated (nullptr: host memory; kernels on device memory
// need device scratch). Registered algorithms do not get it.
std::unique_ptr<Allreducer> make_allreducer(const CommConfig& cfg, Communicator& comm,
                                            const ReduceKernels& kernels = cpu_reduce_kernels(),
                                            const MemorySpace* scratch = nullptr);

// Algorithms outside comm/ ("nccl" needs the CUDA and NCCL libraries, which comm/ does not link)
// register a factory under their name; a program linking them calls their registration once
// (rt::cuda::register_nccl_allreducer). Registering again replaces the factory; the built-in
// names (ring, ring_pipelined, mpi, reducer) cannot be registered (CommError).
using AllreducerFactory = std::unique_ptr<Allreducer> (*)(const CommConfig& cfg,
                                                          Communicator& comm,
                                                          const ReduceKernels& kernels);
void register_allreducer(const std::string& name, AllreducerFactory make);

}  // namespace rt::comm

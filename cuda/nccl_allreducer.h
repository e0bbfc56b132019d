// comm.algorithm "nccl": NCCL's allreduce on device buffers, the vendor baseline that our ring is
// compared with on GPUs. Built as rt_nccl only where NCCL was found (RT_HAVE_NCCL).
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/allreduce.h"

namespace rt::cuda {

// One NCCL communicator over comm's ranks, each rank on the CUDA device current on the
// constructing thread (one GPU per rank: NCCL refuses two ranks of a communicator on one GPU).
// Collective over comm: rank 0 creates NCCL's unique id and broadcasts it with MPI, then every
// rank joins (ncclCommInitRank), so all ranks must call it together.
//
// allreduce(buf, ...) needs buf in device (or managed) memory of that device; f32, bf16 and f16.
// ReduceOp::average is NCCL's ncclAvg, which scales each input by 1/ranks (rounded to the element
// type) before summing: exact where ranks is a power of two, otherwise within rounding of the
// ring's sum-then-scale. It runs on `stream` (null: a stream of the allreducer's own) and returns
// once the result is in buf; work that wrote buf on another stream must be finished before the
// call. Any thread may call it (each call selects the device itself), one call at a time.
//
// After any failure (or while an exception unwinds through its destructor) the NCCL communicator
// is given up, not aborted or destroyed, which would wait for the node's other ranks, and later
// calls throw. A failure before the collective is queued throws, and the caller's abort path
// (comm_abort) ends the job; one while it runs (NCCL's asynchronous error, or the stall check of
// comm.stall_*_s giving up on a peer) ends the job at once through comm_abort, because the
// collective left on the device would hang any later synchronisation with it. A normal
// destruction is ncclCommDestroy, which every rank reaches.
std::unique_ptr<comm::Allreducer> make_nccl_allreducer(comm::Communicator& comm,
                                                       const comm::CommConfig& cfg,
                                                       cudaStream_t stream = nullptr);

// Before joining, the ranks compare their GPUs (node name and PCI bus id, gathered over comm):
// where two ranks would share one, every rank throws CommError naming them, instead of NCCL's
// "invalid usage" from inside ncclCommInitRank. gpu_of_rank[r] is rank r's "node/bus id"; the
// message, or "" when every rank has a GPU of its own.
std::string nccl_shared_gpu_error(const std::vector<std::string>& gpu_of_rank);

// Makes comm::make_allreducer build make_nccl_allreducer (own stream) for algorithm "nccl". Call
// once in programs that link rt_nccl; calling again is harmless.
void register_nccl_allreducer();

}  // namespace rt::cuda

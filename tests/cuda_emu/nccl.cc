// The NCCL calls cuda/nccl_allreducer.cc makes, emulated over MPI, so that `comm.algorithm: nccl`
// runs on the emulated device: each rank of an mpirun emulates a GPU of its own (its PCI bus id
// names its process, runtime.cc), which is what NCCL needs and what one real GPU cannot give.
//
// A communicator is a split of MPI_COMM_WORLD ordered by NCCL rank, so every world rank must
// join it (the trainer's and the tests' case). Joining checks what NCCL checks: one unique id for
// all, distinct ranks in range, no two ranks on one GPU (NCCL's "Duplicate GPU detected",
// ncclInvalidUsage). ncclAllReduce checks its arguments at the call (device or managed buffers,
// a known type and operation) and queues the collective on the stream: an MPI_Iallgather of the
// inputs (polled, so that the host's queries find the collective running until every peer came), then each rank sums them in rank order, rounding to the element type after each add;
// ncclAvg first multiplies each input by 1/ranks rounded to the type, as NCCL's pre-multiplied
// sum. Every rank so computes the same result, as NCCL's allgather phase gives.
//
// ncclCommDestroy and ncclCommAbort wait for all the communicator's ranks to call one of them.
//
// RT_EMU_NCCL_FAIL="rank:n": that rank's n-th allreduce (from 1) fails inside the collective, as a
// lost peer connection would: the stream runs on, the communicator's asynchronous error becomes
// ncclRemoteError, the buffer is left as it was, and the other ranks wait in that collective.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/cuda_emu/elements.h"
#include "tests/cuda_emu/streams.h"

namespace {

struct Shared {  // what queued collectives use: it outlives a communicator destroyed before them
  MPI_Comm mpi = MPI_COMM_NULL;
  MPI_Comm teardown = MPI_COMM_NULL;  // ncclCommDestroy's and ncclCommAbort's barrier
  int rank = 0, ranks = 1;
  std::atomic<ncclResult_t> async{ncclSuccess};
  long calls = 0;  // allreduces queued so far
  ~Shared() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (mpi != MPI_COMM_NULL && !finalized) MPI_Comm_free(&mpi);
    if (teardown != MPI_COMM_NULL && !finalized) MPI_Comm_free(&teardown);
  }
};

std::string& last_error() {
  static std::string s;
  return s;
}
ncclResult_t fail(ncclResult_t r, const std::string& why) {
  last_error() = "emulated NCCL: " + why;
  return r;
}

// RT_EMU_NCCL_FAIL's call number for this rank, or 0.
long injected_failure(int rank) {
  const char* v = std::getenv("RT_EMU_NCCL_FAIL");
  int r = -1;
  long n = 0;
  return v && std::sscanf(v, "%d:%ld", &r, &n) == 2 && r == rank ? n : 0;
}

bool on_device(const void* p) {
  cudaPointerAttributes a{};
  return cudaPointerGetAttributes(&a, p) == cudaSuccess &&
         (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged);
}

}  // namespace

struct ncclComm {
  std::shared_ptr<Shared> s = std::make_shared<Shared>();
};

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
const char* ncclGetLastError(ncclComm_t) { return last_error().c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<int> made{0};
  *id = ncclUniqueId{};
  std::snprintf(id->internal, sizeof id->internal, "emulated NCCL id %d/%d", int(getpid()), made++);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  int world = 0, initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return fail(ncclInvalidUsage, "MPI is not initialised");
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (nranks != world)
    return fail(ncclInvalidUsage, "a communicator must span MPI_COMM_WORLD here (" +
                                      std::to_string(nranks) + " ranks of " + std::to_string(world) + ")");
  auto c = std::make_unique<ncclComm>();
  c->s->rank = rank;
  c->s->ranks = nranks;
  MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c->s->mpi);
  MPI_Comm_dup(c->s->mpi, &c->s->teardown);
  struct Joiner {
    ncclUniqueId id;
    int rank;
    char bus[32];
  } me{id, rank, {}};
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetPCIBusId(me.bus, sizeof me.bus, dev);
  std::vector<Joiner> all(static_cast<size_t>(world));
  MPI_Allgather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, c->s->mpi);
  // Every rank sees the same table, so all come to the same verdict and none is left waiting.
  for (int i = 0; i < world; ++i) {
    if (std::memcmp(&all[i].id, &all[0].id, sizeof id) != 0)
      return fail(ncclInvalidArgument, "the ranks were given different unique ids");
    if (all[i].rank != i) return fail(ncclInvalidArgument, "ranks are not 0 .. nranks - 1, once each");
    for (int j = 0; j < i; ++j)
      if (std::strcmp(all[i].bus, all[j].bus) == 0)
        return fail(ncclInvalidUsage, "Duplicate GPU detected : rank " + std::to_string(i) +
                                          " and rank " + std::to_string(j) + " both on CUDA device " +
                                          all[i].bus);
  }
  *comm = c.release();
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (!comm) return fail(ncclInvalidArgument, "AllReduce: comm is null");
  rt_emu::Type t;
  switch (type) {
    case ncclFloat32: t = rt_emu::Type::f32; break;
    case ncclFloat16: t = rt_emu::Type::f16; break;
    case ncclBfloat16: t = rt_emu::Type::bf16; break;
    default: return fail(ncclInvalidArgument, "AllReduce: a type the emulator does not reduce");
  }
  if (op != ncclSum && op != ncclAvg) return fail(ncclInvalidArgument, "AllReduce: op is not sum or avg");
  if (count == 0) return ncclSuccess;
  if (!on_device(send) || !on_device(recv))
    return fail(ncclInvalidArgument, "AllReduce: a buffer is not device memory");
  const size_t bytes = count * (t == rt_emu::Type::f32 ? 4 : 2);
  if (bytes > size_t(INT_MAX)) return fail(ncclInvalidArgument, "AllReduce: 2 GiB or more (MPI's int counts)");
  std::shared_ptr<Shared> s = comm->s;
  const bool fails = ++s->calls == injected_failure(s->rank);
  // A kernel's launch, then its work: a query right after the call finds the collective still
  // running, as it does on a GPU, so callers' poll loops wait at least once (gpu_nccl).
  rt_emu::enqueue(stream, [] {});
  // The collective waits for its peers as NCCL's kernel does, on the device: the host's queries
  // find it still running (a peer that never comes leaves it so for good), its waits spin.
  struct Gather {
    std::vector<char> all;
    MPI_Request req = MPI_REQUEST_NULL;
  };
  auto g = std::make_shared<Gather>();
  rt_emu::enqueue_polled(stream, [=] {
    if (fails) {
      last_error() = "emulated NCCL: the failure RT_EMU_NCCL_FAIL asked for";
      s->async = ncclRemoteError;
      return true;
    }
    std::vector<char>& all = g->all;
    if (all.empty()) {
      all.resize(bytes * size_t(s->ranks));
      MPI_Iallgather(send, int(bytes), MPI_BYTE, all.data(), int(bytes), MPI_BYTE, s->mpi, &g->req);
    }
    int arrived = 0;
    MPI_Test(&g->req, &arrived, MPI_STATUS_IGNORE);
    if (!arrived) return false;
    auto round_to_t = [t](float v) {
      float cell;
      rt_emu::store(t, &cell, 0, v);
      return rt_emu::load(t, &cell, 0);
    };
    const float k = op == ncclAvg ? round_to_t(1.0f / float(s->ranks)) : 1.0f;
    for (size_t i = 0; i < count; ++i) {
      float acc = 0;
      for (int r = 0; r < s->ranks; ++r) {
        float x = rt_emu::load(t, &all[size_t(r) * bytes], int64_t(i));
        if (op == ncclAvg) x = round_to_t(x * k);
        acc = r == 0 ? x : round_to_t(acc + x);
      }
      rt_emu::store(t, recv, int64_t(i), acc);
    }
    return true;
  });
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* r) {
  if (!comm) return fail(ncclInvalidArgument, "CommGetAsyncError: comm is null");
  *r = comm->s->async.load();
  return ncclSuccess;
}

// Both end the handle; the MPI communicator goes with the last collective queued on it. Both
// first wait for every rank of the communicator to call one of them, as NCCL's do within a node
// (NVIDIA/nccl#863): a rank that tears down a communicator its peers still wait in hangs here as
// it would there.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return fail(ncclInvalidArgument, "CommDestroy: comm is null");
  MPI_Barrier(comm->s->teardown);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

}  // extern "C"

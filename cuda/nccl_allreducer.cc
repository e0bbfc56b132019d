// NcclAllreducer: NCCL's unique id broadcast over MPI, one ncclComm per rank, ncclAllReduce in
// place on the caller's device buffer, and a wait that can notice a failed peer.
#include "cuda/nccl_allreducer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/mpi_check.h"
#include "comm/stall.h"
#include "cuda/check.h"
#include "cuda/device.h"

// ncclAvg and ncclBfloat16 arrived in NCCL 2.10; cuda/CMakeLists.txt builds rt_nccl only from
// there.
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0),
              "comm.algorithm nccl needs NCCL >= 2.10");

namespace rt::cuda {

void throw_nccl_error(const char* file, int line, const char* call, ncclResult_t r) {
  std::string detail;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  // Process-wide and possibly from an earlier failure, but it is where NCCL names the peer,
  // device or transport at fault; the result code alone says only "remote error".
  if (const char* last = ncclGetLastError(nullptr); last && *last)
    detail = str_cat(" (", last, ")");
#endif
  throw CommError(str_cat(file, ":", line, ": ", call, ": NCCL: ", ncclGetErrorString(r), " [",
                          int(r), "]", detail));
}

std::string nccl_shared_gpu_error(const std::vector<std::string>& gpu_of_rank) {
  std::unordered_map<std::string, size_t> first;  // GPU -> the lowest rank on it
  for (size_t r = 0; r < gpu_of_rank.size(); ++r) {
    const auto [at, fresh] = first.emplace(gpu_of_rank[r], r);
    if (!fresh)
      return str_cat("allreduce 'nccl': ranks ", at->second, " and ", r, " would share GPU ",
                     gpu_of_rank[r], " (node/PCI bus id); NCCL needs a GPU of its own for each "
                     "rank: start at most as many ranks per node as it has GPUs, or use "
                     "comm.algorithm ring");
  }
  return "";
}

namespace {

using comm::ReduceOp;

// Each rank's GPU as "node/PCI bus id", gathered over comm (collective).
std::vector<std::string> gpus_of_ranks(comm::Communicator& comm, int device) {
  constexpr int kLen = MPI_MAX_PROCESSOR_NAME + 32;  // a node name, '/', a bus id
  char mine[kLen] = {};
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(mine, &len));
  mine[len] = '/';
  CUDA_CHECK(cudaDeviceGetPCIBusId(mine + len + 1, kLen - len - 1, device));
  std::vector<char> all(size_t(kLen) * size_t(comm.size()));
  MPI_CHECK(MPI_Allgather(mine, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm.mpi()));
  std::vector<std::string> gpus;
  for (int r = 0; r < comm.size(); ++r) gpus.emplace_back(&all[size_t(r) * kLen]);
  return gpus;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  throw CommError("allreduce 'nccl': unknown element type");
}

// Allreducer::allreduce asks its kernels which element types they support. NCCL does its own
// arithmetic on all three, so the base gets these, which are never asked to compute.
class NcclArithmetic final : public comm::ReduceKernels {
 public:
  void reduce_add(DType, void*, const void*, size_t) const override { unused(); }
  void scale(DType, void*, size_t, float) const override { unused(); }
  void convert(DType, void*, DType, const void*, size_t, float) const override { unused(); }
  bool supports(DType) const override { return true; }

 private:
  [[noreturn]] static void unused() {
    throw Error("allreduce 'nccl': NCCL does its own arithmetic");
  }
};

const comm::ReduceKernels& nccl_arithmetic() {
  static const NcclArithmetic k{};
  return k;
}

class NcclAllreducer final : public comm::Allreducer {
 public:
  NcclAllreducer(comm::Communicator& comm, const comm::CommConfig& cfg, cudaStream_t stream)
      : Allreducer(comm, nccl_arithmetic(), cfg), stream_(stream) {
    std::string why;
    if (device_count(&why) == 0) throw CommError("allreduce 'nccl': no usable CUDA device: " + why);
    CUDA_CHECK(cudaGetDevice(&device_));
    if (const std::string e = nccl_shared_gpu_error(gpus_of_ranks(comm, device_)); !e.empty())
      throw CommError(e);
    ncclUniqueId id{};
    if (comm.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm.mpi()));
    if (!stream_) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      own_stream_ = true;
    }
    try {
      NCCL_CHECK(ncclCommInitRank(&nccl_, comm.size(), id, comm.rank()));
    } catch (...) {
      give_up();
      release_stream();
      throw;
    }
  }
  // While an exception unwinds, the peers may be anywhere (in a collective, say): given up, not
  // torn down (give_up).
  ~NcclAllreducer() override {
    if (std::uncaught_exceptions() > 0) give_up();
    if (nccl_) ncclCommDestroy(nccl_);
    release_stream();
  }

  const char* name() const override { return "nccl"; }

 protected:
  void run(void* buf, size_t count, DType t, ReduceOp op) override {
    if (!nccl_)
      throw CommError("allreduce 'nccl': the NCCL communicator was given up after an earlier "
                      "failure");
    if (count == 0) return;
    try {
      CUDA_CHECK(cudaSetDevice(device_));  // the device is per thread; callers may be any thread
      check_buffer(buf);
      const ncclRedOp_t nop = op == ReduceOp::average ? ncclAvg : ncclSum;
      NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), nop, nccl_, stream_));
    } catch (...) {
      give_up();
      throw;
    }
    try {
      wait();
    } catch (const std::exception& e) {
      // The collective stays on the device, waiting for its peers (a stalled one, or one whose
      // connection was lost): any later synchronisation with the device, such as freeing pinned
      // memory while the error unwinds, would wait for it forever, and nothing but NCCL's abort,
      // which waits for the node's other ranks (give_up), ends it. So the job ends here.
      give_up();
      comm::comm_abort(e.what());
    }
  }

 private:
  // NCCL's kernels read buf on the GPU: a host pointer would fail later, inside a kernel, with
  // no hint of the cause.
  void check_buffer(const void* buf) const {
    cudaPointerAttributes a{};
    CUDA_CHECK(cudaPointerGetAttributes(&a, buf));
    if (a.type == cudaMemoryTypeManaged || (a.type == cudaMemoryTypeDevice && a.device == device_))
      return;
    throw CommError(str_cat("allreduce 'nccl': the buffer is not device or managed memory of "
                            "CUDA device ", device_, " (memory type ", int(a.type), ", device ",
                            a.device, "); NCCL reduces GPU buffers only"));
  }

  // cudaStreamSynchronize cannot be interrupted; polling lets an asynchronous NCCL error (a peer's
  // connection lost, a peer that aborted its communicator) end the wait with an exception. The
  // error is looked at once more when the stream is done: a collective NCCL gave up on (its
  // kernels leave once the communicator is aborted) ends with the buffer unreduced, and taking
  // that for a result would let this rank run on alone while its peers wait in the collective.
  // Between polls: as comm.idle_sleep_us (0: yield the core and poll again); the stall check
  // looks in at each.
  void wait() {
    const auto nap = std::chrono::microseconds(comm_.stall_watch() ? comm::watched_idle_sleep_us(cfg_.idle_sleep_us)
                                                                   : cfg_.idle_sleep_us);
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e != cudaSuccess && e != cudaErrorNotReady)
        throw_cuda_error(__FILE__, __LINE__, "cudaStreamQuery(stream_)", e);
      if (e == cudaErrorNotReady)
        (void)cudaGetLastError();  // no error; keep it from a later CUDA_CHECK_LAUNCH
      ncclResult_t async = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(nccl_, &async));
      if (async != ncclSuccess)
        throw_nccl_error(__FILE__, __LINE__, "ncclAllReduce (asynchronous)", async);
      if (e == cudaSuccess) return;
      // A peer that never came to this collective: named, and the job stopped (comm.stall_*).
      if (comm::StallWatch* stall = comm_.stall_watch()) stall->poll();
      if (nap.count() > 0)
        std::this_thread::sleep_for(nap);
      else
        std::this_thread::yield();
    }
  }

  // After a failure the communicator is left as it is, never aborted or destroyed here: in recent
  // NCCL both wait, within a node, for every rank of it to call them (NVIDIA/nccl#863), and a
  // peer still in a collective never does, so the rank would hang before its error got out. An
  // abort (comm_abort: MPI_Abort) ends the process, and NCCL with it.
  void give_up() noexcept { nccl_ = nullptr; }

  void release_stream() noexcept {
    if (own_stream_) cudaStreamDestroy(stream_);
    own_stream_ = false;
    stream_ = nullptr;
  }

  cudaStream_t stream_;
  bool own_stream_ = false;
  int device_ = 0;
  ncclComm_t nccl_ = nullptr;
};

// NCCL brings its own arithmetic, so the caller's kernels (host or device) go unused.
std::unique_ptr<comm::Allreducer> make_registered(const comm::CommConfig& cfg,
                                                  comm::Communicator& comm,
                                                  const comm::ReduceKernels&) {
  return make_nccl_allreducer(comm, cfg);
}

}  // namespace

std::unique_ptr<comm::Allreducer> make_nccl_allreducer(comm::Communicator& comm,
                                                       const comm::CommConfig& cfg,
                                                       cudaStream_t stream) {
  return std::make_unique<NcclAllreducer>(comm, cfg, stream);
}

void register_nccl_allreducer() { comm::register_allreducer("nccl", &make_registered); }

}  // namespace rt::cuda

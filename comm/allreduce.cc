// The Allreducer base (segment pipelines, call checks), the mpi and reducer algorithms, and the
// registry through which cuda/ adds nccl.
#include "comm/allreduce.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "comm/mpi_check.h"
#include "comm/stall.h"

namespace rt::comm {

std::unique_ptr<Allreducer> make_ring_allreducer(Communicator& comm, const ReduceKernels& k,
                                                 const CommConfig& cfg, const MemorySpace* scratch);
std::unique_ptr<Allreducer> make_hierarchical_allreducer(Communicator& comm, const ReduceKernels& k,
                                                         const CommConfig& cfg, const MemorySpace* scratch);

const std::vector<std::string>& allreduce_algorithms() {
  static const std::vector<std::string> names = {"ring", "hierarchical", "mpi", "reducer", "nccl"};
  return names;
}

bool compression_known(const std::string& compression) {
  return compression == "none" || compression == "bf16" || compression == "fp16";
}

DType compression_wire_type(const std::string& compression, DType t) {
  if (!compression_known(compression))
    throw CommError(str_cat("comm: unknown compression '", compression, "' (none, bf16 or fp16)"));
  if (compression == "none") return t;
  if (t != DType::f32)
    throw CommError(str_cat("comm: compression ", compression, " applies to f32 gradients, not ",
                            dtype_name(t)));
  return compression == "bf16" ? DType::bf16 : DType::f16;
}

void compressed_allreduce(Allreducer& ar, const ReduceKernels& k, DType wire, void* wire_buf,
                          float* buf, size_t n, float pre_scale) {
  k.convert(wire, wire_buf, DType::f32, buf, n, pre_scale);
  ar.allreduce(wire_buf, n, wire, ReduceOp::sum);
  k.convert(DType::f32, buf, wire, wire_buf, n, 1.0f);
}

Allreducer::Allreducer(Communicator& comm, const ReduceKernels& kernels, const CommConfig& cfg,
                       const MemorySpace* scratch)
    : comm_(comm), kernels_(kernels), cfg_(cfg), scratch_space_(scratch) {
  if (cfg_.segment_bytes == 0) throw CommError("comm: segment_bytes must be positive");
  if (cfg_.recv_depth < 2 || cfg_.recv_depth > 64)
    throw CommError(str_cat("comm: recv_depth must be in [2, 64], got ", cfg_.recv_depth));
  for (int k = 0; k < cfg_.recv_depth; ++k) scratch_.emplace_back(scratch_space_);
  reduce_req_.assign(size_t(cfg_.recv_depth), MPI_REQUEST_NULL);
}

void Allreducer::reserve(DType t) {
  if (!scratch_space_) return;
  // No call receives more than one segment into a scratch buffer, and buffers only ever grow.
  const size_t need = segment_for(t) * dtype_size(t);
  for (Buffer<char>& b : scratch_)
    if (b.size() < need) b.resize(need);
}

size_t Allreducer::segment_for(DType t) const {
  // One rule on every rank (the node count is the same everywhere), so segments pair up.
  const size_t bytes = comm_.nodes() > 1 && cfg_.network_segment_bytes ? cfg_.network_segment_bytes : cfg_.segment_bytes;
  return segment_elems(bytes, dtype_size(t), comm_.max_elems_per_call());
}

void Allreducer::allreduce(void* buf, size_t count, DType t, ReduceOp op) {
  if (!kernels_.supports(t))
    throw CommError(str_cat("allreduce '", name(), "': element type ", dtype_name(t),
                            " not supported by the reduce kernels"));
  if (cfg_.check_counts) check_same_call(count, t, op);
  run(buf, count, t, op);
}

// Every rank learns every rank's arguments, so all of them throw the same message.
void Allreducer::check_same_call(size_t count, DType t, ReduceOp op) {
  const uint64_t mine[3] = {count, static_cast<uint64_t>(t), static_cast<uint64_t>(op)};
  std::vector<uint64_t> all(3 * static_cast<size_t>(comm_.size()));
  comm_.allgather_bytes(mine, sizeof mine, all.data());
  std::string bad;
  for (int r = 1; r < comm_.size(); ++r)
    if (!std::equal(all.begin() + 3 * r, all.begin() + 3 * r + 3, all.begin()))
      bad += str_cat(bad.empty() ? "" : ", ", "rank ", r, " count ", all[3 * r]);
  if (!bad.empty())
    throw CommError(str_cat("allreduce '", name(), "': ranks disagree on the call (rank 0 count ",
                            all[0], "; differing: ", bad, ")"));
}

void Allreducer::send_segments(const char* buf, Range r, size_t seg, DType t, int peer, int tag,
                               std::vector<MPI_Request>& reqs) {
  const size_t esz = dtype_size(t);
  for (size_t k = 0, nk = segment_count(r, seg); k < nk; ++k) {
    const Range sg = segment_at(r, seg, k);
    reqs.push_back(comm_.isend(buf + sg.offset * esz, sg.len, t, peer, tag));
  }
}

size_t Allreducer::post_recv_segments(char* buf, Range r, size_t seg, DType t, int peer, int tag) {
  if (recvs_done_ == recvs_.size()) recvs_done_ = 0, recvs_.clear();
  const size_t esz = dtype_size(t), nk = segment_count(r, seg);
  for (size_t k = 0; k < nk; ++k) {
    const Range sg = segment_at(r, seg, k);
    recvs_.push_back({comm_.irecv(buf + sg.offset * esz, sg.len, t, peer, tag), sg.len, peer});
  }
  return nk;
}

void Allreducer::wait_recvs(size_t n, DType t) {
  for (size_t end = recvs_done_ + n; recvs_done_ < end; ++recvs_done_) {
    PendingRecv& p = recvs_[recvs_done_];
    comm_.wait_recv(p.req, p.len, t, p.peer, cfg_.idle_sleep_us);
  }
}

void Allreducer::recv_reduce_post(Range r, size_t seg, DType t, int peer, int tag) {
  const size_t esz = dtype_size(t), nk = segment_count(r, seg);
  if (nk == 0) return;
  const size_t need = std::min(seg, r.len) * esz;
  const size_t depth = scratch_.size();
  for (size_t k = 0; k < std::min(depth, nk); ++k) {
    if (scratch_[k].size() < need) scratch_[k].resize(need);
    reduce_req_[k] = comm_.irecv(scratch_[k].data(), segment_at(r, seg, k).len, t, peer, tag);
  }
}

void Allreducer::recv_reduce_finish(char* buf, Range r, size_t seg, DType t, int peer, int tag) {
  const size_t esz = dtype_size(t), nk = segment_count(r, seg), depth = scratch_.size();
  for (size_t k = 0; k < nk; ++k) {
    const Range sg = segment_at(r, seg, k);
    MPI_Request& req = reduce_req_[k % depth];
    comm_.wait_recv(req, sg.len, t, peer, cfg_.idle_sleep_us);
    kernels_.reduce_add(t, buf + sg.offset * esz, scratch_[k % depth].data(), sg.len);
    if (k + depth < nk) req = comm_.irecv(scratch_[k % depth].data(), segment_at(r, seg, k + depth).len, t, peer, tag);
  }
}

namespace {

constexpr int kReducerTag = 0x5245;

// MPI_Allreduce in place, split into calls of at most the per-call limit. MPI has no bf16.
class MpiAllreducer final : public Allreducer {
 public:
  MpiAllreducer(Communicator& comm, const ReduceKernels& k, const CommConfig& cfg,
                const MemorySpace* scratch)
      : Allreducer(comm, k, cfg, scratch) {}
  void reserve(DType) override {}  // no scratch: MPI_Allreduce works in place
  const char* name() const override { return "mpi"; }
  bool supports(DType t) const override { return t == DType::f32; }

 protected:
  void run(void* buf, size_t count, DType t, ReduceOp op) override {
    if (t != DType::f32)
      throw CommError(str_cat("allreduce 'mpi': MPI has no ", dtype_name(t), " sum; use ring"));
    auto* p = static_cast<float*>(buf);
    const size_t lim = comm_.max_elems_per_call();
    // MPI_Allreduce blocks where no wait loop can run the stall check: its watchdog does.
    struct Watched {
      StallWatch* w;
      explicit Watched(StallWatch* s) : w(s) {
        if (w) w->begin_blocking();
      }
      ~Watched() {
        if (w) w->end_blocking();
      }
    } watched(comm_.stall_watch());
    for (size_t off = 0; off < count; off += lim) {
      const int len = static_cast<int>(std::min(lim, count - off));
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p + off, len, MPI_FLOAT, MPI_SUM, comm_.mpi()));
    }
    if (op == ReduceOp::average && comm_.size() > 1)
      kernels_.scale(t, buf, count, 1.0f / static_cast<float>(comm_.size()));
  }
};

// The single reducer: rank 0 receives every other rank's whole buffer in turn and adds it, then
// sends the result to every rank. Rank 0's link carries 2(N-1)·S bytes, which is the point.
class ReducerAllreducer final : public Allreducer {
 public:
  ReducerAllreducer(Communicator& comm, const ReduceKernels& k, const CommConfig& cfg,
                    const MemorySpace* scratch)
      : Allreducer(comm, k, cfg, scratch) {}
  const char* name() const override { return "reducer"; }

 protected:
  void run(void* buf, size_t count, DType t, ReduceOp op) override {
    const int n = comm_.size();
    if (n == 1 || count == 0) return;
    char* base = static_cast<char*>(buf);
    const size_t seg = segment_for(t);
    const Range all{0, count};
    if (comm_.rank() == 0) {
      for (int src = 1; src < n; ++src) recv_reduce(base, all, seg, t, src, kReducerTag);
      if (op == ReduceOp::average) kernels_.scale(t, buf, count, 1.0f / static_cast<float>(n));
      for (int dst = 1; dst < n; ++dst) send_segments(base, all, seg, t, dst, kReducerTag, sends_);
      comm_.wait_all(sends_, cfg_.idle_sleep_us);
    } else {
      send_segments(base, all, seg, t, 0, kReducerTag, sends_);
      comm_.wait_all(sends_, cfg_.idle_sleep_us, 0);
      wait_recvs(post_recv_segments(base, all, seg, t, 0, kReducerTag), t);
    }
  }
};

struct Registry {
  std::mutex mu;
  std::map<std::string, AllreducerFactory> factories;
};
Registry& registry() {
  static Registry r;
  return r;
}

bool is_builtin(const std::string& name) {
  return name == "ring" || name == "ring_pipelined" || name == "hierarchical" || name == "mpi" ||
         name == "reducer";
}

}  // namespace

void register_allreducer(const std::string& name, AllreducerFactory make) {
  if (is_builtin(name) || !make)
    throw CommError(
        str_cat("register_allreducer: '", name, "' is built in or the factory is null"));
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.factories[name] = make;
}

std::unique_ptr<Allreducer> make_allreducer(const CommConfig& cfg, Communicator& comm,
                                            const ReduceKernels& kernels, const MemorySpace* scratch) {
  if (cfg.algorithm == "ring" || cfg.algorithm == "ring_pipelined")
    return make_ring_allreducer(comm, kernels, cfg, scratch);
  if (cfg.algorithm == "hierarchical") return make_hierarchical_allreducer(comm, kernels, cfg, scratch);
  if (cfg.algorithm == "mpi") return std::make_unique<MpiAllreducer>(comm, kernels, cfg, scratch);
  if (cfg.algorithm == "reducer") return std::make_unique<ReducerAllreducer>(comm, kernels, cfg, scratch);
  AllreducerFactory make = nullptr;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    if (auto it = r.factories.find(cfg.algorithm); it != r.factories.end()) make = it->second;
  }
  if (make) return make(cfg, comm, kernels);  // registered ones keep their own scratch, if any
  if (cfg.algorithm == "nccl") {
#ifdef RT_HAVE_NCCL
    throw CommError(
        "allreduce algorithm 'nccl' is GPU only and not linked into this program: run "
        "build/bin/trainer_cuda (backend: cuda), which links rt_nccl and calls "
        "rt::cuda::register_nccl_allreducer()");
#else
    throw CommError(
        "allreduce algorithm 'nccl' is GPU only and not built here (ringtrain was built without "
        "CUDA or without NCCL); use ring, mpi or reducer");
#endif
  }
  throw CommError(str_cat("unknown allreduce algorithm '", cfg.algorithm,
                          "' (known: ring, ring_pipelined, hierarchical, mpi, reducer, nccl)"));
}

}  // namespace rt::comm

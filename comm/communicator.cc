// The MPI transport: communicator duplication, checked point-to-point calls, split collectives.
#include "comm/communicator.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "comm/mpi_check.h"
#include "comm/stall.h"
#include "nn/console.h"

namespace rt::comm {

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
  }
  throw CommError("mpi_datatype: unknown element type");
}

Communicator::Communicator(MPI_Comm comm, size_t max_elems_per_call)
    : max_elems_(max_elems_per_call) {
  if (max_elems_ < 1 || max_elems_ > kMpiMaxCount)
    throw CommError(str_cat("Communicator: max_elems_per_call must be in [1, ", kMpiMaxCount,
                            "], got ", max_elems_per_call));
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) throw CommError("Communicator: MPI is not initialised (the program owns MPI_Init)");
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
  MPI_CHECK(MPI_Comm_size(local, &local_size_));
  int node = rank_;
  MPI_CHECK(MPI_Allreduce(&rank_, &node, 1, MPI_INT, MPI_MIN, local));
  MPI_CHECK(MPI_Comm_free(&local));
  node_of_.resize(static_cast<size_t>(size_));
  MPI_CHECK(MPI_Allgather(&node, 1, MPI_INT, node_of_.data(), 1, MPI_INT, comm_));
  nodes_ = 0;
  for (int r = 0; r < size_; ++r) nodes_ += node_of_[static_cast<size_t>(r)] == r;
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  MPI_Comm part;
  MPI_CHECK(MPI_Comm_split(comm_, color, key, &part));
  std::unique_ptr<Communicator> sub;
  try {
    sub = std::make_unique<Communicator>(part, max_elems_);
  } catch (...) {
    MPI_Comm_free(&part);
    throw;
  }
  MPI_CHECK(MPI_Comm_free(&part));
  sub->parent_ = this;
  sub->parent_ranks_.resize(static_cast<size_t>(sub->size_));
  MPI_CHECK(MPI_Allgather(&rank_, 1, MPI_INT, sub->parent_ranks_.data(), 1, MPI_INT, sub->comm_));
  return sub;
}

int Communicator::outer_rank(int r) const {
  if (!parent_ || r < 0 || r >= size_) return r;
  return parent_->outer_rank(parent_ranks_[static_cast<size_t>(r)]);
}

Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

MPI_Request Communicator::isend(const void* buf, size_t n, MPI_Datatype t, int peer, int tag) {
  if (n > max_elems_) throw CommError(str_cat("isend: ", n, " elements exceed the per-call limit"));
  MPI_Request req;
  MPI_CHECK(MPI_Isend(buf, static_cast<int>(n), t, peer, tag, comm_, &req));
  return req;
}

MPI_Request Communicator::irecv(void* buf, size_t n, MPI_Datatype t, int peer, int tag) {
  if (n > max_elems_) throw CommError(str_cat("irecv: ", n, " elements exceed the per-call limit"));
  MPI_Request req;
  MPI_CHECK(MPI_Irecv(buf, static_cast<int>(n), t, peer, tag, comm_, &req));
  return req;
}

// MPI_Waitall; or, to sleep when idle or to run the stall check, MPI_Testall polls that back
// off to sleeping after idle_sleep_us.
int Communicator::wait_requests(int count, MPI_Request* reqs, MPI_Status* st, int idle_sleep_us, int peer) {
  StallWatch* const stall = this->stall();
  if (idle_sleep_us <= 0 && !stall) return MPI_Waitall(count, reqs, st);
  const auto start = std::chrono::steady_clock::now();
  const auto pause = std::chrono::microseconds(stall ? watched_idle_sleep_us(idle_sleep_us) : idle_sleep_us);
  const int who = outer_rank(peer);  // the stall watch names ranks of the outermost communicator
  for (;;) {
    int done = 0;
    const int rc = MPI_Testall(count, reqs, &done, st);
    if (rc != MPI_SUCCESS || done) return rc;
    if (stall) stall->poll(who);
    if (idle_sleep_us > 0 && std::chrono::steady_clock::now() - start > pause) std::this_thread::sleep_for(pause);
  }
}

void Communicator::wait_recv(MPI_Request& req, size_t n, MPI_Datatype t, int peer, int idle_sleep_us) {
  MPI_Status st;
  int rc = wait_requests(1, &req, &st, idle_sleep_us, peer);
  if (rc == MPI_ERR_IN_STATUS) rc = st.MPI_ERROR;
  if (rc != MPI_SUCCESS)
    throw CommError(str_cat("rank ", outer_rank(rank_), ": receive of ", n, " elements from rank ", outer_rank(peer),
                            " failed: ", mpi_error_string(rc),
                            " (do all ranks pass the same count to the collective?)"));
  int got = 0;
  MPI_CHECK(MPI_Get_count(&st, t, &got));
  if (got == MPI_UNDEFINED || static_cast<size_t>(got) != n)
    throw CommError(str_cat("rank ", outer_rank(rank_), ": expected ", n, " elements from rank ", outer_rank(peer),
                            ", received ", got, ": the ranks disagree on the buffer size"));
}

void Communicator::wait_all(std::vector<MPI_Request>& reqs, int idle_sleep_us, int peer) {
  if (reqs.empty()) return;
  statuses_.resize(reqs.size());
  std::vector<MPI_Status>& st = statuses_;
  const int rc = wait_requests(static_cast<int>(reqs.size()), reqs.data(), st.data(), idle_sleep_us, peer);
  if (rc == MPI_ERR_IN_STATUS) {
    for (const MPI_Status& s : st)
      if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING)
        throw CommError(str_cat("rank ", outer_rank(rank_), ": transfer with rank ", outer_rank(s.MPI_SOURCE),
                                " failed: ", mpi_error_string(s.MPI_ERROR)));
  }
  MPI_CHECK(rc);
  reqs.clear();
}

void Communicator::wait_one(MPI_Request& req, int idle_sleep_us, int peer) {
  if (req == MPI_REQUEST_NULL) return;
  MPI_Status st;
  int rc = wait_requests(1, &req, &st, idle_sleep_us, peer);
  if (rc == MPI_ERR_IN_STATUS) rc = st.MPI_ERROR;
  if (rc != MPI_SUCCESS)
    throw CommError(str_cat("rank ", outer_rank(rank_), ": transfer failed: ", mpi_error_string(rc)));
}

void Communicator::broadcast(void* buf, size_t n, DType t, int root) {
  auto* p = static_cast<char*>(buf);
  const size_t esz = dtype_size(t);
  for (size_t off = 0; off < n; off += max_elems_) {
    const size_t len = std::min(max_elems_, n - off);
    MPI_CHECK(MPI_Bcast(p + off * esz, static_cast<int>(len), mpi_datatype(t), root, comm_));
  }
}

void Communicator::barrier() { MPI_CHECK(MPI_Barrier(comm_)); }

void Communicator::allgather_bytes(const void* mine, size_t bytes, void* all) {
  if (bytes > kMpiMaxCount) throw CommError("allgather_bytes: record too large");
  MPI_CHECK(MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes),
                          MPI_BYTE, comm_));
}

std::string broadcast_string(std::string s, int root, MPI_Comm comm) {
  uint64_t len = s.size();
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_UINT64_T, root, comm));
  if (len > kMpiMaxCount) throw CommError(str_cat("broadcast_string: ", len, " bytes exceed one MPI call"));
  s.resize(len);
  MPI_CHECK(MPI_Bcast(s.data(), int(len), MPI_CHAR, root, comm));
  return s;
}

void comm_abort(const char* what, int exit_code) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  int rank = -1, size = 0;
  if (inited && !finalized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  stderr_line(str_cat("ringtrain: rank ", rank, " of ", size, ": ", what));
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace rt::comm

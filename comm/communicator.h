// The MPI transport: a private duplicate of the caller's communicator, point-to-point calls with
// 64-bit counts checked against MPI's int limit, split collectives, and the abort-all error path.
#pragma once
#include <mpi.h>

#include <climits>
#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "nn/tensor.h"

namespace rt::comm {

class StallWatch;

// The most elements one MPI call may carry (MPI counts are int).
constexpr size_t kMpiMaxCount = static_cast<size_t>(INT_MAX);

// MPI datatype carrying one element of t (16-bit types travel as raw uint16: MPI never reduces them).
MPI_Datatype mpi_datatype(DType t);

class Communicator {
 public:
  // Duplicates `comm` (collective over it) so collectives here never match the caller's messages,
  // and makes its MPI errors return to MPI_CHECK. max_elems_per_call (1 .. kMpiMaxCount) bounds
  // every MPI call's count; larger transfers are split. The caller owns MPI_Init.
  explicit Communicator(MPI_Comm comm = MPI_COMM_WORLD, size_t max_elems_per_call = kMpiMaxCount);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm mpi() const { return comm_; }
  size_t max_elems_per_call() const { return max_elems_; }
  // How many nodes (shared-memory domains, as MPI_COMM_TYPE_SHARED sees them) the ranks span,
  // and this rank's place among its node's ranks.
  int nodes() const { return nodes_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // The lowest rank on rank r's node: what names a node (the same on every rank).
  int node_of(int r) const { return node_of_[static_cast<size_t>(r)]; }

  // The ranks of this communicator that pass the same color, ordered by key, as a communicator of
  // their own (MPI_Comm_split; collective). It shares this one's per-call limit and stall watch
  // (set now or later), and its errors name ranks of this one (see outer_rank).
  std::unique_ptr<Communicator> split(int color, int key);
  // Rank r of this communicator as a rank of the one it was split from, recursively (itself for
  // one made by the public constructor): what messages and the stall watch name.
  int outer_rank(int r) const;

  // One nonblocking message of n <= max_elems_per_call() elements (of t, or of an MPI type).
  MPI_Request isend(const void* buf, size_t n, DType t, int peer, int tag) {
    return isend(buf, n, mpi_datatype(t), peer, tag);
  }
  MPI_Request irecv(void* buf, size_t n, DType t, int peer, int tag) {
    return irecv(buf, n, mpi_datatype(t), peer, tag);
  }
  MPI_Request isend(const void* buf, size_t n, MPI_Datatype t, int peer, int tag);
  MPI_Request irecv(void* buf, size_t n, MPI_Datatype t, int peer, int tag);
  // Waits for a receive posted for n elements and checks that exactly n arrived: a shorter
  // message means the ranks disagree on the buffer size, which must not be summed silently.
  // idle_sleep_us: 0 waits in MPI_Wait (MPI's own busy polling); s > 0 polls with MPI_Test and,
  // once s µs have passed without completion, sleeps s µs between polls, so that a waiting thread
  // leaves its core to compute (backward) or to other ranks sharing the core.
  void wait_recv(MPI_Request& req, size_t n, DType t, int peer, int idle_sleep_us = 0) {
    wait_recv(req, n, mpi_datatype(t), peer, idle_sleep_us);
  }
  void wait_recv(MPI_Request& req, size_t n, MPI_Datatype t, int peer, int idle_sleep_us = 0);
  // peer: the rank these transfers are with, where it is one (-1: several), for the stall
  // check's message.
  void wait_all(std::vector<MPI_Request>& reqs, int idle_sleep_us = 0, int peer = -1);
  // Waits for one send (or a receive whose size is not checked); a null request returns at once.
  void wait_one(MPI_Request& req, int idle_sleep_us = 0, int peer = -1);
  // Waits then poll `w` (the stall check: warns, then throws naming the ranks that never came);
  // null turns it off. Not owned.
  void set_stall_watch(StallWatch* w) { stall_ = w; }
  // The stall watch that applies here (this one's or the one it was split from), or null.
  StallWatch* stall_watch() const { return stall(); }

  // Collectives over the whole communicator; counts are 64-bit and split into calls of at most
  // max_elems_per_call() elements.
  void broadcast(void* buf, size_t n, DType t, int root);
  void barrier();
  // all[r * bytes .. (r+1) * bytes) = rank r's `mine` (bytes must be the same on every rank).
  void allgather_bytes(const void* mine, size_t bytes, void* all);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, nodes_ = 1, local_rank_ = 0, local_size_ = 1;
  size_t max_elems_;
  std::vector<int> node_of_;
  std::vector<MPI_Status> statuses_;  // reused by wait_all
  StallWatch* stall_ = nullptr;
  const Communicator* parent_ = nullptr;  // split from (its stall watch applies here)
  std::vector<int> parent_ranks_;         // rank here -> rank in parent_

  StallWatch* stall() const { return parent_ ? parent_->stall() : stall_; }
  int wait_requests(int count, MPI_Request* reqs, MPI_Status* st, int idle_sleep_us, int peer);
};

// The error path of every ringtrain program: prints "ringtrain: rank R of N: <what>" to stderr
// and takes the whole job down with MPI_Abort, so that no peer waits forever in a receive.
[[noreturn]] void comm_abort(const char* what, int exit_code = 1);

// Collective over `comm`: rank `root`'s string (its length, then its bytes) on every rank.
std::string broadcast_string(std::string s, int root, MPI_Comm comm);

// Runs fn() and aborts all ranks (comm_abort) if it throws. Returns fn()'s int result.
template <class F>
int comm_run_or_abort(F&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    comm_abort(e.what());
  }
}

}  // namespace rt::comm

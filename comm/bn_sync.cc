// Batch-norm sums over a group of ranks: the recursive-doubling schedule and its MPI transport.
#include "comm/bn_sync.h"

#include "comm/mpi_check.h"

namespace rt::comm {

namespace {
constexpr int kBnTag = 0x424e;
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

std::vector<RdStep> recursive_doubling_steps(int rank, int size) {
  std::vector<RdStep> s;
  int p = 1;
  while (p * 2 <= size) p *= 2;
  if (rank >= p) {  // folded: hands its vector over, gets the result back
    s.push_back({RdStep::send_fold, rank - p});
    s.push_back({RdStep::recv_result, rank - p});
    return s;
  }
  if (rank + p < size) s.push_back({RdStep::recv_fold, rank + p});
  for (int bit = 1; bit < p; bit *= 2) s.push_back({RdStep::exchange, rank ^ bit});
  if (rank + p < size) s.push_back({RdStep::send_result, rank + p});
  return s;
}

std::string bn_group_error(int group, int world) {
  if (group < 0) return str_cat("must be 0 (all ranks) or a positive rank count, got ", group);
  if (group > 0 && world % group != 0)
    return str_cat("is ", group, ", which does not divide the job's ", world, world == 1 ? " rank" : " ranks",
                   " into groups of consecutive ranks");
  return "";
}

BnGroupSync::BnGroupSync(MPI_Comm world, int group, const CommConfig& cfg)
    : world_(std::make_unique<Communicator>(world)), idle_sleep_us_(cfg.idle_sleep_us) {
  const int size = world_->size(), rank = world_->rank();
  std::vector<int> all(static_cast<size_t>(size));
  world_->allgather_bytes(&group, sizeof group, all.data());
  std::string differ;  // the same text on every rank: those that differ from rank 0
  for (int r = 1; r < size; ++r)
    if (all[size_t(r)] != all[0]) differ += str_cat(", rank ", r, ": ", all[size_t(r)]);
  if (!differ.empty())
    throw CommError(str_cat("model.bn_group differs between ranks: rank 0: ", all[0], differ));
  if (const std::string e = bn_group_error(group, size); !e.empty()) throw CommError("model.bn_group " + e);
  const int k = group == 0 ? size : group;
  if (size > 1 && (cfg.stall_warning_s > 0 || cfg.stall_abort_s > 0)) {
    stall_ = std::make_unique<StallWatch>(world_->mpi(), cfg.stall_warning_s, cfg.stall_abort_s);
    world_->set_stall_watch(stall_.get());
  }
  group_ = world_->split(rank / k, rank);  // shares the stall watch; names world ranks
  steps_ = recursive_doubling_steps(group_->rank(), group_->size());
}

BnGroupSync::~BnGroupSync() {
  group_.reset();
  if (world_) world_->set_stall_watch(nullptr);
}

void BnGroupSync::begin_step(int64_t step) {
  seconds_ = 0;
  if (stall_) stall_->arrive(step, StallLabel("the batch-norm sums of step ", step, " (model.bn_group)"));
}

void BnGroupSync::end_step() {
  if (stall_) stall_->leave();
}

void BnGroupSync::sum(double* v, size_t n) {
  if (steps_.empty() || n == 0) return;
  if (n > group_->max_elems_per_call())
    throw CommError(str_cat("batch norm sums: ", n, " values exceed MPI's per-call limit"));
  const auto t0 = std::chrono::steady_clock::now();
  recv_.resize(n);
  MPI_Request reqs[2];
  for (const RdStep& s : steps_) {
    switch (s.kind) {
      case RdStep::send_fold:
      case RdStep::send_result:
        reqs[0] = group_->isend(v, n, MPI_DOUBLE, s.peer, kBnTag);
        group_->wait_one(reqs[0], idle_sleep_us_);
        break;
      case RdStep::recv_result:
        reqs[0] = group_->irecv(v, n, MPI_DOUBLE, s.peer, kBnTag);
        group_->wait_recv(reqs[0], n, MPI_DOUBLE, s.peer, idle_sleep_us_);
        break;
      case RdStep::recv_fold:
      case RdStep::exchange:
        reqs[0] = group_->irecv(recv_.data(), n, MPI_DOUBLE, s.peer, kBnTag);
        reqs[1] = s.kind == RdStep::exchange ? group_->isend(v, n, MPI_DOUBLE, s.peer, kBnTag) : MPI_REQUEST_NULL;
        group_->wait_recv(reqs[0], n, MPI_DOUBLE, s.peer, idle_sleep_us_);
        group_->wait_one(reqs[1], idle_sleep_us_);
        for (size_t i = 0; i < n; ++i) v[i] += recv_[i];
        break;
    }
  }
  seconds_ += seconds_since(t0);
}

}  // namespace rt::comm

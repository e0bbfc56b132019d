// The stall check's announcements and its warning and abort.
#include "comm/stall.h"

#include <algorithm>
#include <cstdio>

#include "comm/communicator.h"
#include "comm/mpi_check.h"

namespace rt::comm {

namespace {
constexpr int kArriveTag = 0x5354;
// How often a waiting loop really looks at the clock-driven checks.
constexpr auto kPollEvery = std::chrono::milliseconds(50);

std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

std::string rank_list(const std::vector<int>& r) {
  std::string s;
  for (size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + std::to_string(r[i]);
  return s;
}
}  // namespace

StallWatch::StallWatch(MPI_Comm comm, double warn_s, double abort_s) : warn_s_(warn_s), abort_s_(abort_s) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  int provided = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Query_thread(&provided));
  multiple_ = provided >= MPI_THREAD_MULTIPLE;
  const size_t n = size_t(size_);
  seen_.assign(n, 0);
  recv_buf_.assign(n, 0);
  recv_req_.assign(n, MPI_REQUEST_NULL);
  send_req_.assign(n, MPI_REQUEST_NULL);
  for (int p = 0; p < size_; ++p)
    if (p != rank_) MPI_CHECK(MPI_Irecv(&recv_buf_[size_t(p)], 1, MPI_INT64_T, p, kArriveTag, comm_, &recv_req_[size_t(p)]));
}

StallWatch::~StallWatch() {
  if (dog_.joinable()) {
    {
      std::lock_guard lk(mu_);
      quit_ = true;
    }
    cv_.notify_one();
    dog_.join();
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Request& r : recv_req_)
    if (r != MPI_REQUEST_NULL) {
      MPI_Cancel(&r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
  MPI_Waitall(int(send_req_.size()), send_req_.data(), MPI_STATUSES_IGNORE);
  MPI_Comm_free(&comm_);
}

void StallWatch::drain() {
  for (int p = 0; p < size_; ++p) {
    MPI_Request& r = recv_req_[size_t(p)];
    for (int done = 1; r != MPI_REQUEST_NULL;) {
      MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
      if (!done) break;
      seen_[size_t(p)] = std::max(seen_[size_t(p)], recv_buf_[size_t(p)]);
      MPI_CHECK(MPI_Irecv(&recv_buf_[size_t(p)], 1, MPI_INT64_T, p, kArriveTag, comm_, &r));
    }
  }
}

void StallWatch::arrive(int64_t step, const StallLabel& what) {
  std::lock_guard lk(mu_);
  // The previous announcement has long left (eight bytes go eagerly): its buffer can be reused.
  MPI_CHECK(MPI_Waitall(int(send_req_.size()), send_req_.data(), MPI_STATUSES_IGNORE));
  step_ = step;
  what_ = what;
  send_buf_ = step;
  seen_[size_t(rank_)] = step;
  for (int p = 0; p < size_; ++p)
    if (p != rank_) MPI_CHECK(MPI_Isend(&send_buf_, 1, MPI_INT64_T, p, kArriveTag, comm_, &send_req_[size_t(p)]));
  drain();  // keeps the queue of unexpected announcements short
  active_ = true;
  warned_ = false;
  since_ = std::chrono::steady_clock::now();
  next_poll_ = since_ + kPollEvery;
}

std::vector<int> StallWatch::missing() {
  drain();
  std::vector<int> out;
  for (int p = 0; p < size_; ++p)
    if (seen_[size_t(p)] < step_) out.push_back(p);
  return out;
}

std::string StallWatch::describe(const std::vector<int>& miss, double waited, int peer) const {
  const std::string what =
      str_cat(what_.text, what_.numbered ? std::to_string(what_.number) : std::string(), what_.after);
  if (!miss.empty())
    return str_cat("rank(s) ", rank_list(miss), " of ", size_, " have not reached ", what, " after ", secs(waited));
  return str_cat("every rank reached ", what, " but it has not completed after ", secs(waited),
                 peer >= 0 ? str_cat(" (rank ", rank_, " waits for rank ", peer, ")") : std::string());
}

void StallWatch::poll(int peer) {
  if (!active_ || (warn_s_ <= 0 && abort_s_ <= 0)) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_poll_) return;
  next_poll_ = now + kPollEvery;
  std::unique_lock lk(mu_, std::try_to_lock);  // the watchdog is looking: it will tell
  if (!lk.owns_lock()) return;
  if (std::string stop = due(now, peer); !stop.empty()) {
    lk.unlock();
    throw CommError(stop);
  }
}

std::string StallWatch::due(std::chrono::steady_clock::time_point now, int peer) {
  const double waited = std::chrono::duration<double>(now - since_).count();
  if (abort_s_ > 0 && waited >= abort_s_)
    return str_cat("stall: ", describe(missing(), waited, peer), "; stopping the job (comm.stall_abort_s: ",
                   secs(abort_s_), ")");
  if (warn_s_ > 0 && !warned_ && waited >= warn_s_) {
    warned_ = true;
    const std::vector<int> miss = missing();
    int reporter = 0;  // the lowest rank that is here to report
    while (reporter < size_ && std::find(miss.begin(), miss.end(), reporter) != miss.end()) ++reporter;
    if (rank_ != reporter) return {};
    std::fprintf(stderr, "ringtrain: rank %d of %d: warning: stall: %s%s\n", rank_, size_,
                 describe(miss, waited, peer).c_str(),
                 abort_s_ > 0 ? str_cat("; the job stops at ", secs(abort_s_), " (comm.stall_abort_s)").c_str()
                              : " (comm.stall_abort_s is 0: waiting on)");
    std::fflush(stderr);
  }
  return {};
}

void StallWatch::begin_blocking() {
  // Only inside arrive() .. leave(): the clock of a step, not a stale one.
  if (!multiple_ || !active_ || (warn_s_ <= 0 && abort_s_ <= 0)) return;
  if (!dog_.joinable()) dog_ = std::thread([this] { watchdog(); });
  {
    std::lock_guard lk(mu_);  // publishes the step arrive() set up to the watchdog
    blocking_ = true;
  }
  cv_.notify_one();
}

void StallWatch::end_blocking() {
  if (!dog_.joinable()) return;
  std::lock_guard lk(mu_);  // waits out a check in progress: the step's state is ours again
  blocking_ = false;
}

void StallWatch::watchdog() {
  using Clock = std::chrono::steady_clock;
  const auto after = [](double s) {  // capped at 30 years: a longer setting would overflow the clock
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(s, 1e9)));
  };
  std::unique_lock lk(mu_);
  while (!quit_) {
    Clock::time_point at = Clock::time_point::max();
    if (blocking_ && warn_s_ > 0 && !warned_) at = since_ + after(warn_s_);
    if (blocking_ && abort_s_ > 0) at = std::min(at, since_ + after(abort_s_));
    if (at == Clock::time_point::max()) {
      cv_.wait(lk);
      continue;
    }
    cv_.wait_until(lk, at);
    if (quit_ || !blocking_ || Clock::now() < at) continue;  // woken for another reason: look again
    // The other thread is inside the blocking call and cannot be interrupted: stop the job here
    // (an MPI error while looking at the announcements too: a peer's death, say).
    try {
      if (const std::string stop = due(Clock::now(), -1); !stop.empty()) comm_abort(stop.c_str());
    } catch (const std::exception& e) {
      comm_abort(str_cat("stall check: ", e.what()).c_str());
    }
  }
}

}  // namespace rt::comm

// The stall check's announcements and its warning and abort.
#include "comm/stall.h"

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "comm/communicator.h"
#include "comm/mpi_check.h"
#include "nn/console.h"

namespace rt::comm {

namespace {
constexpr int kArriveTag = 0x5354;
constexpr int kBeatTag = 0x5355;
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

// A SIGCONT reaches a stopped process when it is continued, but also a running one (an MPI
// launcher's teardown sends it to every rank). Only one that had not been looking at its waits
// for a while (last_active_ns: the watches' polls, beats and arrivals, on steady_clock's base,
// CLOCK_MONOTONIC) counts as stopped: `continued_ns` is when the last SIGCONT came,
// `continued_gap_ns` how long the process had not been looking then (the longest of a burst: a
// teardown's SIGCONT right after a real one must not hide it).
std::atomic<int64_t> last_active_ns{0}, continued_ns{0}, continued_gap_ns{0};  // lock-free: safe in a handler
static_assert(std::atomic<int64_t>::is_always_lock_free);
extern "C" void on_continue(int) {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  const int64_t now = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  int64_t gap = now - last_active_ns.load(std::memory_order_relaxed);
  if (now - continued_ns.load(std::memory_order_relaxed) < 1000000000)
    gap = std::max(gap, continued_gap_ns.load(std::memory_order_relaxed));
  continued_gap_ns.store(gap, std::memory_order_relaxed);
  continued_ns.store(now, std::memory_order_relaxed);
}
int64_t steady_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
void mark_active(std::chrono::steady_clock::time_point now) {
  last_active_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
                       std::memory_order_relaxed);
}

// Receives completed on `reqs` (one per peer but `self`) go to `got(peer, value)`, each reposted.
template <class F>
void drain_into(std::vector<MPI_Request>& reqs, std::vector<int64_t>& bufs, int self, int tag, MPI_Comm comm, F&& got) {
  for (int p = 0; p < int(reqs.size()); ++p) {
    if (p == self) continue;
    MPI_Request& r = reqs[size_t(p)];
    for (int done = 1; r != MPI_REQUEST_NULL;) {
      MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
      if (!done) break;
      got(p, bufs[size_t(p)]);
      MPI_CHECK(MPI_Irecv(&bufs[size_t(p)], 1, MPI_INT64_T, p, tag, comm, &r));
    }
  }
}

// Every watch of the process, for beats: a rank alive in one collective is alive in all.
std::mutex registry_mu;
std::vector<StallWatch*>& registry() {
  static std::vector<StallWatch*> r;
  return r;
}
}  // namespace

void install_continue_counter() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = on_continue;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGCONT, &sa, nullptr);
  });
}

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
  heard_.assign(n, {});
  alive_.assign(n, {});
  beat_buf_.assign(n, 0);
  beat_req_.assign(n, MPI_REQUEST_NULL);
  beat_send_req_.assign(n, MPI_REQUEST_NULL);
  beat_send_buf_.assign(n, 0);
  // A quarter of the first deadline: a silent rank is two beats behind well before it.
  double first = 0;
  for (double t : {warn_s, abort_s})
    if (t > 0) first = first > 0 ? std::min(first, t) : t;
  beat_every_ = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::clamp(first / 4, 0.05, 5.0)));
  for (int p = 0; p < size_; ++p)
    if (p != rank_) {
      MPI_CHECK(MPI_Irecv(&recv_buf_[size_t(p)], 1, MPI_INT64_T, p, kArriveTag, comm_, &recv_req_[size_t(p)]));
      MPI_CHECK(MPI_Irecv(&beat_buf_[size_t(p)], 1, MPI_INT64_T, p, kBeatTag, comm_, &beat_req_[size_t(p)]));
    }
  std::lock_guard lk(registry_mu);
  registry().push_back(this);
}

StallWatch::~StallWatch() {
  {
    std::lock_guard lk(registry_mu);  // no other watch's beat reaches this one from here on
    auto& r = registry();
    r.erase(std::remove(r.begin(), r.end(), this), r.end());
  }
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
  for (auto* reqs : {&recv_req_, &beat_req_})
    for (MPI_Request& r : *reqs)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      }
  MPI_Waitall(int(send_req_.size()), send_req_.data(), MPI_STATUSES_IGNORE);
  for (MPI_Request& r : beat_send_req_)  // one to a stopped peer may never complete: let it go
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  MPI_Comm_free(&comm_);
}

void StallWatch::drain() {
  const auto now = std::chrono::steady_clock::now();
  // A rank is heard from when its announcement of this step or a later one comes in, or its
  // beat from there: stale beats (an earlier step's, queued) say nothing about now.
  // Any message says the process runs (a rank still waiting in an earlier collective, say).
  drain_into(recv_req_, recv_buf_, rank_, kArriveTag, comm_, [&](int p, int64_t step) {
    seen_[size_t(p)] = std::max(seen_[size_t(p)], step);
    if (step >= step_) heard_[size_t(p)] = now;
    alive_[size_t(p)] = now;
  });
  drain_into(beat_req_, beat_buf_, rank_, kBeatTag, comm_, [&](int p, int64_t step) {
    if (step >= step_) heard_[size_t(p)] = now;
    alive_[size_t(p)] = now;
  });
}

std::chrono::steady_clock::duration StallWatch::quiet_after() const { return 2 * beat_every_ + kPollEvery; }

bool StallWatch::unheard(int p, std::chrono::steady_clock::time_point now) const {
  return now - alive_[size_t(p)] > quiet_after();
}

void StallWatch::beat(std::chrono::steady_clock::time_point now) {
  drain();
  if (now < since_ + beat_every_ || now < next_beat_) return;
  next_beat_ = now + beat_every_;
  send_beats_locked();
  // The other watches too, each at its latest step: a rank done with one of their collectives
  // and waiting in this one is not silent there. One busy (its own thread polling it) beats
  // for itself.
  std::lock_guard reg(registry_mu);
  for (StallWatch* w : registry())
    if (w != this && w->mu_.try_lock()) {
      w->send_beats_locked();  // at step 0 too: any beat says the process runs
      w->mu_.unlock();
    }
}

void StallWatch::send_beats_locked() {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    MPI_Request& r = beat_send_req_[size_t(p)];
    int done = 1;  // the last beat's eight bytes went eagerly; one to a stopped peer may not have
    if (r != MPI_REQUEST_NULL) MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    if (!done) continue;
    beat_send_buf_[size_t(p)] = step_;
    MPI_CHECK(MPI_Isend(&beat_send_buf_[size_t(p)], 1, MPI_INT64_T, p, kBeatTag, comm_, &r));
  }
}

std::vector<int> StallWatch::silent(std::chrono::steady_clock::time_point now) const {
  std::vector<int> out;
  for (int p = 0; p < size_; ++p)
    if (p != rank_ && seen_[size_t(p)] >= step_ && now - heard_[size_t(p)] > quiet_after())
      out.push_back(p);
  return out;
}

void StallWatch::arrive(int64_t step, const StallLabel& what) {
  {
    std::lock_guard lk(mu_);
    arrive_locked(step, what);
  }
  if (on_arrive_) on_arrive_(step);
}

void StallWatch::arrive_locked(int64_t step, const StallLabel& what) {
  // The previous announcement has long left (eight bytes go eagerly): its buffer can be reused.
  MPI_CHECK(MPI_Waitall(int(send_req_.size()), send_req_.data(), MPI_STATUSES_IGNORE));
  step_ = step;
  what_ = what;
  send_buf_ = step;
  seen_[size_t(rank_)] = step;
  for (int p = 0; p < size_; ++p)
    if (p != rank_) MPI_CHECK(MPI_Isend(&send_buf_, 1, MPI_INT64_T, p, kArriveTag, comm_, &send_req_[size_t(p)]));
  start_wait_locked();
  drain();  // keeps the queue of unexpected announcements short
  active_ = true;
  warned_ = false;
}

void StallWatch::start_wait_locked() {
  since_ = std::chrono::steady_clock::now();
  mark_active(since_);
  next_poll_ = since_ + kPollEvery;
  next_beat_ = since_ + beat_every_;
  next_warn_check_ = since_;
  named_.clear();
}

void StallWatch::rearm() {
  std::lock_guard lk(mu_);
  // warned_ stays: the warning is printed once a step, whichever bucket's wait it comes in.
  if (active_) start_wait_locked();
}

std::vector<int> StallWatch::missing() {
  drain();
  std::vector<int> out;
  for (int p = 0; p < size_; ++p)
    if (seen_[size_t(p)] < step_) out.push_back(p);
  return out;
}

std::string StallWatch::describe(const std::vector<int>& miss, const std::vector<int>& quiet, double waited,
                                 int peer, std::chrono::steady_clock::time_point now) const {
  const std::string what =
      str_cat(what_.text, what_.numbered ? std::to_string(what_.number) : std::string(), what_.after);
  const std::string silent_text =
      quiet.empty() ? ""
                    : str_cat("rank(s) ", rank_list(quiet), " reached it but have not been heard from there since (stopped: "
                              "SIGSTOP, a debugger; or busy outside the exchange: their own compute, a device, the file "
                              "system)");
  // Of the missing, those still heard from wait in an earlier collective (a neighbour of the one
  // stuck, say): named apart from the ones not heard from at all.
  // (Those the warning's look found unheard stay so: a stopped rank continued by the launcher's
  // teardown runs again just before this rank's own stop.)
  const auto named = [&](int p) { return std::find(named_.begin(), named_.end(), p) != named_.end(); };
  std::vector<int> gone, here;
  for (int p : miss) (unheard(p, now) || named(p) ? gone : here).push_back(p);
  const std::string which =
      here.empty() ? ""
                   : str_cat(": rank(s) ", rank_list(here), " alive, still in an earlier collective",
                             gone.empty() ? "" : str_cat("; rank(s) ", rank_list(gone), " not heard from (stopped, "
                                                         "or busy outside the collectives)"));
  std::string out =
      !miss.empty()
          ? str_cat("rank(s) ", rank_list(miss), " of ", size_, " have not reached ", what, " after ", secs(waited),
                    which, quiet.empty() ? "" : "; ", silent_text)
          : str_cat("every rank reached ", what, " but it has not completed after ", secs(waited),
                    quiet.empty() ? "" : ": ", silent_text,
                    peer >= 0 ? str_cat(" (rank ", rank_, " waits for rank ", peer, ")") : std::string());
  // Said first: what this rank saw while it was stopped is not the others' doing.
  // ... stopped during this wait, or just before it began (a rank stopped before the collective
  // and continued by the teardown enters it at once).
  const int64_t slack = std::chrono::duration_cast<std::chrono::nanoseconds>(quiet_after()).count();
  if (continued_gap_ns.load(std::memory_order_relaxed) > slack &&
      continued_ns.load(std::memory_order_relaxed) >= steady_ns(since_) - slack)
    out = str_cat("rank ", rank_, " was itself stopped and continued (SIGCONT) during the wait, so the stall may be "
                  "its own; ", out);
  return out;
}

void StallWatch::poll(int peer) {
  if (!active_ || (warn_s_ <= 0 && abort_s_ <= 0)) return;
  const auto now = std::chrono::steady_clock::now();
  mark_active(now);
  if (now < next_poll_) return;
  next_poll_ = now + kPollEvery;
  std::unique_lock lk(mu_, std::try_to_lock);  // the watchdog is looking: it will tell
  if (!lk.owns_lock()) return;
  beat(now);
  if (std::string stop = due(now, peer); !stop.empty()) {
    lk.unlock();
    throw CommError(stop);
  }
}

std::string StallWatch::due(std::chrono::steady_clock::time_point now, int peer) {
  const double waited = std::chrono::duration<double>(now - since_).count();
  if (abort_s_ > 0 && waited >= abort_s_) {
    const std::vector<int> miss = missing();
    std::vector<int> quiet = silent(now);
    for (int p : named_)  // silent at the warning's look, whatever they did since (see describe)
      if (std::find(miss.begin(), miss.end(), p) == miss.end() && std::find(quiet.begin(), quiet.end(), p) == quiet.end())
        quiet.push_back(p);
    std::sort(quiet.begin(), quiet.end());
    return str_cat("stall: ", describe(miss, quiet, waited, peer, now), "; stopping the job (comm.stall_abort_s: ",
                   secs(abort_s_), ")");
  }
  if (warn_s_ > 0 && !warned_ && waited >= warn_s_ && now >= next_warn_check_) {
    // Looked at again each beat until this rank is the one to print: a reporter that stopped
    // just now is silent two beats later, and the next one prints.
    next_warn_check_ = now + beat_every_;
    const std::vector<int> miss = missing(), quiet = silent(now);
    std::vector<int> absent_now = quiet;
    for (int p : miss)
      if (unheard(p, now)) absent_now.push_back(p);
    std::sort(absent_now.begin(), absent_now.end());
    if (!absent_now.empty()) named_ = absent_now;
    // The lowest rank that is here and heard from reports: not one that is stuck itself.
    const auto absent = [&](int r) {
      return std::find(miss.begin(), miss.end(), r) != miss.end() || std::find(quiet.begin(), quiet.end(), r) != quiet.end();
    };
    int reporter = 0;
    while (reporter < size_ && absent(reporter)) ++reporter;
    if (rank_ != reporter) return {};
    warned_ = true;
    stderr_line(str_cat("ringtrain: rank ", rank_, " of ", size_, ": warning: stall: ", describe(miss, quiet, waited, peer, now),
                        abort_s_ > 0 ? str_cat("; the job stops at ", secs(abort_s_), " (comm.stall_abort_s)")
                                     : std::string(" (comm.stall_abort_s is 0: waiting on)")));
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
    if (blocking_ && warn_s_ > 0 && !warned_) at = std::max(since_ + after(warn_s_), next_warn_check_);
    if (blocking_ && abort_s_ > 0) at = std::min(at, since_ + after(abort_s_));
    if (blocking_) at = std::min(at, std::max(since_ + beat_every_, next_beat_));  // beats, as poll() sends them
    if (at == Clock::time_point::max()) {
      cv_.wait(lk);
      continue;
    }
    cv_.wait_until(lk, at);
    if (quit_ || !blocking_ || Clock::now() < at) continue;  // woken for another reason: look again
    // The other thread is inside the blocking call and cannot be interrupted: stop the job here
    // (an MPI error while looking at the announcements too: a peer's death, say).
    try {
      const auto now = Clock::now();
      mark_active(now);
      beat(now);
      if (const std::string stop = due(now, -1); !stop.empty()) comm_abort(stop.c_str());
    } catch (const std::exception& e) {
      comm_abort(str_cat("stall check: ", e.what()).c_str());
    }
  }
}

}  // namespace rt::comm

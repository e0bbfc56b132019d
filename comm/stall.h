// The stall check: a rank that never reaches a step's gradient allreduce would leave every other
// rank blocked in a receive forever. Each rank announces "I reached step k" to every other rank
// when it enters the step's first allreduce; a rank that has waited longer than warn_s in the
// step names the ranks whose announcement of step k has not arrived, and after abort_s stops the
// job (Horovod's stall check is the model; it names ranks the same way).
//
// The ring alone cannot name them: a rank only ever waits for its left neighbour, who may be
// waiting for its own, so the blame would land on a healthy rank. The announcements cost each
// rank N-1 eight-byte eager messages per step, sent on a private communicator and received
// by receives posted once and reposted as they complete.
//
// Every rank may have announced the step while it still does not complete: one of them stopped
// inside it (SIGSTOP, a debugger) or stuck there. A ring rank then waits for its neighbour, who
// may be healthy and waiting for its own. So a rank that has waited in a step for a beat interval
// (a quarter of the first deadline, 0.05-5 s) tells the others, once a beat, that it is alive:
// on every watch of the process (a rank done with one collective may wait in the next, watched
// by another); a rank that announced the step but has not been heard from for two beats is
// "silent", and the warning and the stop name it. Beats are sent only by ranks that wait longer
// than a beat in a collective.
//
// A blocking collective (MPI_Allreduce: comm.algorithm mpi) has no wait loop to poll from; while
// one is under way (begin_blocking .. end_blocking) a watchdog thread does poll()'s work and,
// since nothing can be thrown into the blocked call, stops the job through comm_abort. It needs
// MPI_THREAD_MULTIPLE (it tests the announcements while the other thread is inside MPI).
#pragma once
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace rt::comm {

// What a watched collective is called in messages: `text`, then `number` where it has one, then
// `after`. Static strings and a number: arrive() runs every step and must not allocate.
struct StallLabel {
  const char* text = "";
  int64_t number = 0;
  const char* after = "";
  bool numbered = false;
  StallLabel() = default;
  explicit StallLabel(const char* t) : text(t) {}
  StallLabel(const char* t, int64_t n, const char* a = "") : text(t), number(n), after(a), numbered(true) {}
};

// A process that was stopped and continued (SIGSTOP, then SIGCONT: a debugger, Ctrl-Z, or the
// launcher's teardown of a frozen rank) finds its own wait long: counted by a SIGCONT handler,
// which this installs (once; the trainer program does, not library users), the watch says that
// the stall may be the rank's own.
void install_continue_counter();

// The longest sleep of a watched wait (comm.idle_sleep_us is cut to it): the stall check's beats
// go out from its polls.
inline int watched_idle_sleep_us(int idle_sleep_us) { return idle_sleep_us < 10000 ? idle_sleep_us : 10000; }

class StallWatch {
 public:
  // Collective over `comm` (duplicates it). warn_s <= 0: no warning; abort_s <= 0: no abort.
  StallWatch(MPI_Comm comm, double warn_s, double abort_s);
  ~StallWatch();
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // This rank entered step `step`'s collective (steps count up from 1). Starts the clock.
  // `what` names the collective in messages (by default "the gradient allreduce of step <step>").
  void arrive(int64_t step) { arrive(step, StallLabel("the gradient allreduce of step ", step)); }
  void arrive(int64_t step, const StallLabel& what);
  // The step's collective is over: waits no longer count.
  void leave() { active_ = false; }
  // A later part of the step's collective begins (the next gradient bucket, while backward
  // runs): its waits count from now, not from arrive(), since the time between parts is this
  // rank's own compute. Announces nothing.
  void rearm();
  // Fault drills: `f(step)` runs on the arriving thread after each announcement, outside the lock.
  void on_arrive(std::function<void(int64_t)> f) { on_arrive_ = std::move(f); }
  // Called from wait loops while a transfer with `peer` (-1: unknown) is pending. Prints the
  // warning once per step after warn_s (from the lowest rank that is not missing, so a stall is
  // reported once, not by every rank) and throws rt::CommError naming the missing ranks after
  // abort_s. Cheap when nothing is due.
  void poll(int peer = -1);
  // Ranks whose announcement of the current step has not arrived (after draining what has).
  std::vector<int> missing();
  // Around a blocking call of the current step; the watchdog starts with the first one. Without
  // MPI_THREAD_MULTIPLE they do nothing.
  void begin_blocking();
  void end_blocking();
  double warn_s() const { return warn_s_; }
  double abort_s() const { return abort_s_; }

 private:
  void arrive_locked(int64_t step, const StallLabel& what);
  void start_wait_locked();  // waits count from now (arrive, rearm)
  void drain();
  // Beats: sends one where due (this rank waits in the step), and takes in the others'.
  void beat(std::chrono::steady_clock::time_point now);
  void send_beats_locked();  // to every peer whose last beat has left (mu_ held)
  // Ranks that announced the step but have not been heard from for two beats (at `now`).
  std::vector<int> silent(std::chrono::steady_clock::time_point now) const;
  // How long without a word makes a rank silent: two beats and a poll.
  std::chrono::steady_clock::duration quiet_after() const;
  // Not heard from at all (no announcement or beat, of any step) for quiet_after().
  bool unheard(int p, std::chrono::steady_clock::time_point now) const;
  std::string describe(const std::vector<int>& miss, const std::vector<int>& quiet, double waited, int peer,
                       std::chrono::steady_clock::time_point now) const;
  // The warning (printed, once a step) and the abort (its message returned; "" if not due) at `now`.
  std::string due(std::chrono::steady_clock::time_point now, int peer);
  void watchdog();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double warn_s_, abort_s_;
  int64_t step_ = 0;
  StallLabel what_;
  bool active_ = false, warned_ = false;  // warned_: this rank printed the step's warning
  std::chrono::steady_clock::time_point next_warn_check_;
  std::chrono::steady_clock::time_point since_, next_poll_;
  std::vector<int64_t> seen_;       // latest step each rank announced
  std::vector<int64_t> recv_buf_;   // one posted receive per peer
  std::vector<MPI_Request> recv_req_, send_req_;
  int64_t send_buf_ = 0;
  // Beats: when each rank's announcement of the current step and its latest beat for it came in.
  std::chrono::steady_clock::duration beat_every_{};
  std::vector<std::chrono::steady_clock::time_point> heard_;
  std::vector<std::chrono::steady_clock::time_point> alive_;  // the latest message of any step
  std::vector<int> named_;  // ranks missing and unheard, or silent, when the warning was looked at
  std::vector<int64_t> beat_buf_;
  std::vector<MPI_Request> beat_req_, beat_send_req_;
  std::vector<int64_t> beat_send_buf_;  // one per peer: a send to a stopped peer may stay pending
  std::chrono::steady_clock::time_point next_beat_;
  std::function<void(int64_t)> on_arrive_;

  bool multiple_ = false;  // MPI_THREAD_MULTIPLE: the watchdog may test requests
  std::thread dog_;
  std::mutex mu_;  // blocking_ and quit_; held while the step's state is looked at (by the
                   // watchdog, by poll) or changed (arrive)
  std::condition_variable cv_;
  bool blocking_ = false, quit_ = false;
};

}  // namespace rt::comm

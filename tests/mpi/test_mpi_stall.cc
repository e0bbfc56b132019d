// The stall check's naming when every rank has announced a collective: a rank that then goes
// quiet (stopped, or stuck outside the exchange) is named as silent by the others, who keep
// beating while they wait; ranks that all wait, or one done with it and waiting in the next
// collective, are never called silent; and a rank that was
// itself stopped and continued (SIGCONT after a gap in its polling) says the stall may be its
// own, while a SIGCONT to a rank that was polling all along (a launcher's teardown) does not.
#include <mpi.h>
#include <signal.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "comm/gradient_reducer.h"
#include "comm/mpi_check.h"
#include "comm/stall.h"
#include "tests/mpi/mpi_test_util.h"

namespace rt::comm {
namespace {

using rt::test::MpiTest;
using Clock = std::chrono::steady_clock;

// Polls `w` until it throws (its abort); the message, or "" if it never did within `limit_s`.
std::string poll_until_abort(StallWatch& w, double limit_s, const std::function<void(double)>& meanwhile = {}) {
  const auto t0 = Clock::now();
  for (;;) {
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (t > limit_s) return "";
    if (meanwhile) meanwhile(t);
    try {
      w.poll();
    } catch (const CommError& e) {
      return e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void check_self_continued(MpiTest& t) {
  install_continue_counter();
  {  // SIGCONT while polling all along: not a stop
    StallWatch w(MPI_COMM_SELF, 0, 0.4);
    w.arrive(1);
    bool sent = false;
    const std::string e = poll_until_abort(w, 5, [&](double s) {
      if (s > 0.2 && !std::exchange(sent, true)) ::raise(SIGCONT);
    });
    if (e.empty() || has(e, "itself stopped")) t.fail("SIGCONT to a polling rank taken for a stop: " + e);
  }
  {  // no polling for longer than two beats (0.1 s each), then SIGCONT: stopped and continued
    StallWatch w(MPI_COMM_SELF, 0, 0.4);
    w.arrive(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(350));
    ::raise(SIGCONT);
    const std::string e = poll_until_abort(w, 5);
    if (!has(e, "every rank reached the gradient allreduce of step 1 but it has not completed after 0.4 s") ||
        !has(e, "was itself stopped and continued (SIGCONT) during the wait"))
      t.fail("a rank stopped and continued: " + e);
  }
  {  // stopped before the collective, continued, then entering it (as after a teardown's SIGCONT)
    StallWatch w(MPI_COMM_SELF, 0, 0.4);
    std::this_thread::sleep_for(std::chrono::milliseconds(350));
    ::raise(SIGCONT);
    w.arrive(1);
    const std::string e = poll_until_abort(w, 5);
    if (!has(e, "stall: rank 0 was itself stopped and continued (SIGCONT) during the wait, so the stall may be its own; "))
      t.fail("a rank stopped before the collective: " + e);
  }
}

void check_silent_rank(MpiTest& t) {
  if (t.size() < 2) return;
  const int quiet = t.size() - 1;
  StallWatch w(MPI_COMM_WORLD, 0, 1.0);  // beats every 0.25 s; silent after 0.55 s unheard
  w.arrive(1);
  if (t.rank() == quiet) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1600));  // as if stopped: no polls
  } else {
    const std::string e = poll_until_abort(w, 10);
    const std::string named = "rank(s) " + std::to_string(quiet) + " reached it but have not been heard from there since";
    if (!has(e, "every rank reached the gradient allreduce of step 1 but it has not completed after 1.0 s: " + named))
      t.fail("the quiet rank " + std::to_string(quiet) + " not named alone: " + e);
  }
  w.leave();
  MPI_Barrier(MPI_COMM_WORLD);
}

// Rank 0 done with the collective (as a ring rank can be whose last pieces came in) and waiting
// in the next one, watched by another watch: its beats from there reach the first watch too, so
// the others name only the stopped rank.
void check_done_rank_is_not_silent(MpiTest& t) {
  if (t.size() < 3) return;
  const int quiet = t.size() - 1;
  StallWatch a(MPI_COMM_WORLD, 0, 1.0), b(MPI_COMM_WORLD, 0, 2.0);
  a.arrive(1);
  if (t.rank() == quiet) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2200));
  } else if (t.rank() == 0) {
    a.leave();
    b.arrive(1, StallLabel("the next collective"));
    poll_until_abort(b, 10);  // the others never come: its own stop at 2 s
    b.leave();
  } else {
    const std::string e = poll_until_abort(a, 10);
    if (!has(e, "rank(s) " + std::to_string(quiet) + " reached it but have not been heard from there since"))
      t.fail("the stopped rank not named: " + e);
    if (has(e, "rank(s) 0") || has(e, "rank(s) 0,"))
      t.fail("rank 0, waiting in the next collective, named silent: " + e);
  }
  a.leave();
  MPI_Barrier(MPI_COMM_WORLD);
}

// Rank 0 waiting in the next collective for ranks that have not reached it: rank 1, alive and
// still waiting in the earlier one (for the stopped rank 2), is named apart from rank 2.
void check_missing_but_alive(MpiTest& t) {
  if (t.size() != 3) return;
  StallWatch a(MPI_COMM_WORLD, 0, 2.0), b(MPI_COMM_WORLD, 0, 1.0);
  a.arrive(1);
  if (t.rank() == 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2400));
  } else if (t.rank() == 1) {
    poll_until_abort(a, 10);  // beats (on b too) until its own stop at 2 s
  } else {
    a.leave();
    b.arrive(1, StallLabel("the next collective"));
    const std::string e = poll_until_abort(b, 10);
    if (!has(e, "rank(s) 1, 2 of 3 have not reached the next collective after 1.0 s: rank(s) 1 alive, still in an "
                "earlier collective; rank(s) 2 not heard from"))
      t.fail("missing ranks not told apart: " + e);
    b.leave();
  }
  a.leave();
  MPI_Barrier(MPI_COMM_WORLD);
}

void check_no_false_silence(MpiTest& t) {
  StallWatch w(MPI_COMM_WORLD, 0, 0.8);
  w.arrive(1);
  const std::string e = poll_until_abort(w, 10);  // every rank waits, and says so
  if (!has(e, "every rank reached the gradient allreduce of step 1 but it has not completed after 0.8 s") ||
      has(e, "heard from"))
    t.fail("ranks that all wait: " + e);
  w.leave();
  MPI_Barrier(MPI_COMM_WORLD);
}

// A step's collective in parts with this rank's compute between them (gradient buckets while
// backward runs): each part's wait counts from its start, so a backward longer than the abort
// time is no stall. Through the watch, then through the reducer's buckets.
void check_compute_between_parts_is_no_wait(MpiTest& t) {
  {
    StallWatch w(MPI_COMM_WORLD, 0, 0.8);
    w.arrive(1);
    std::string e;
    for (int part = 0; part < 3 && e.empty(); ++part) {
      if (part > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));  // "backward": no polls
        w.rearm();
      }
      e = poll_until_abort(w, 0.3);
    }
    if (!e.empty()) t.fail("compute between the parts of a step counted as waiting: " + e);
    w.leave();
    MPI_Barrier(MPI_COMM_WORLD);
  }
  CommConfig cfg;
  cfg.bucket_bytes = 4096;
  cfg.stall_abort_s = 0.6;
  std::vector<float> g(4096);  // 4 buckets of 1024 floats
  Communicator comm;
  GradientReducer gr(comm, cfg, g, buffer_fingerprint(g.size(), DType::f32));
  gr.begin_step(1);
  for (size_t done = 1024; done <= g.size(); done += 1024) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250 + 50 * t.rank()));  // uneven backward, 1 s+
    gr.on_ready(done);
  }
  try {
    gr.wait();
  } catch (const CommError& e) {
    t.fail(std::string("a backward of 1 s with stall_abort_s 0.6 stopped the step: ") + e.what());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace rt::comm

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 0;
  {
    rt::test::MpiTest t;
    rt::comm::check_self_continued(t);
    rt::comm::check_silent_rank(t);
    rt::comm::check_done_rank_is_not_silent(t);
    rt::comm::check_missing_but_alive(t);
    rt::comm::check_no_false_silence(t);
    rt::comm::check_compute_between_parts_is_no_wait(t);
    rc = t.finish("test_mpi_stall");
  }
  MPI_Finalize();
  return rc;
}

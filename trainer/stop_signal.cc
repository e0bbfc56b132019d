#include "trainer/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "comm/stall.h"
#include "nn/console.h"

namespace rt::trainer {
namespace {

// Lock-free atomics are safe in a signal handler, and the handler may run on any thread.
std::atomic<int> caught{0};
// Where the first SIGTERM or SIGINT came from: 0 none yet, 1 elsewhere, 2 the launcher (mpirun's
// relay). One atomic: the handler may run on two threads at once.
std::atomic<int> first_term{0};
std::atomic<bool> relay_passed{false}, installed{false}, announce_first{false};
static_assert(std::atomic<int>::is_always_lock_free);
const char* line_prefix = "";  // stderr_line's, fixed before the handlers are installed

void say(const char* s) { (void)!::write(STDERR_FILENO, s, std::strlen(s)); }

extern "C" void on_stop_signal(int sig, siginfo_t* info, void*) {
  int none = 0;
  if (caught.compare_exchange_strong(none, sig) && announce_first) {  // write(2) only: async-signal-safe
    say(line_prefix);
    say("ringtrain: ");
    say(stop_signal_name(sig));
    say(" caught: the job stops after the current step (or evaluation) with a checkpoint");
    say(sig == SIGTERM || sig == SIGINT ? "; the same signal again ends it at once, without one\n" : "\n");
  }
  if (sig != SIGTERM && sig != SIGINT) return;  // a notice, first or repeated, only asks
  // A notice (SIGUSR1/2) and then the end it announced (a time limit's SIGTERM) are two requests:
  // the first SIGTERM or SIGINT only asks too. After it, one copy by the other path (the
  // launcher's relay of what reached every process, or the reverse) is the same request; any
  // other repeat is the user's "now".
  const int origin = info && info->si_code == SI_USER && info->si_pid == ::getppid() ? 2 : 1;
  int first = 0;
  if (first_term.compare_exchange_strong(first, origin)) return;
  if (origin != first && !relay_passed.exchange(true)) return;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

}  // namespace

void install_stop_handlers(bool announce) {
  line_prefix = stderr_line_prefix();
  announce_first = announce;
  for (int sig : {SIGUSR1, SIGUSR2, SIGTERM, SIGINT}) {
    struct sigaction sa {};
    sa.sa_sigaction = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    // Interrupted reads, writes and waits carry on; only the flag changes.
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    sigaction(sig, &sa, nullptr);
  }
  comm::install_continue_counter();  // a rank stopped and continued says so in stall messages
  installed = true;
}

bool stop_handlers_installed() { return installed; }

int stop_signal() { return caught; }

const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
  }
  static thread_local char buf[24];
  std::snprintf(buf, sizeof buf, "signal %d", sig);
  return buf;
}

}  // namespace rt::trainer

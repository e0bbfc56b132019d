#include "trainer/stop_signal.h"

#include <signal.h>

#include <atomic>
#include <cstdio>

#include "comm/stall.h"

namespace rt::trainer {
namespace {

// Lock-free atomics are safe in a signal handler, and the handler may run on any thread.
std::atomic<int> caught{0};
std::atomic<bool> installed{false};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  caught.compare_exchange_strong(none, sig);
}

}  // namespace

void install_stop_handlers() {
  for (int sig : {SIGUSR1, SIGTERM, SIGINT}) {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    // Interrupted reads, writes and waits carry on; only the flag changes. SIGTERM and SIGINT
    // revert to their default once caught, so that a second one kills.
    sa.sa_flags = SA_RESTART | (sig == SIGUSR1 ? 0 : SA_RESETHAND);
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
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
  }
  static thread_local char buf[24];
  std::snprintf(buf, sizeof buf, "signal %d", sig);
  return buf;
}

}  // namespace rt::trainer

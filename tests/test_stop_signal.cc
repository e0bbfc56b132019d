// The stop handlers' rules for repeated signals, each case in a child process of its own (the
// handlers are process-wide): a notice and then the SIGTERM it announced stop cleanly; a
// second SIGTERM kills; the launcher's copy of a SIGTERM the process already had (a scheduler
// signals every process, mpirun relays its own) does not, once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "trainer/stop_signal.h"

namespace rt::trainer {
namespace {

// Runs body in a child with the handlers installed; `parent_sends` SIGTERMs then come from this
// process (the child's parent: its launcher) once the child says it is ready. The child exits 0
// after half a second unless a signal ended it. Returns the wait status.
template <class Body>
int in_child(Body body, int parent_sends = 0) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    install_stop_handlers();
    body();
    (void)!::write(ready[1], "r", 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::_exit(stop_signal() != 0 ? 0 : 3);
  }
  ::close(ready[1]);
  char c;
  (void)!::read(ready[0], &c, 1);
  ::close(ready[0]);
  for (int i = 0; i < parent_sends; ++i) {
    ::kill(pid, SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

bool exited_cleanly(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
bool killed_by_term(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM; }

TEST(StopSignal, ANoticeThenItsSigtermStopCleanly) {
  EXPECT_TRUE(exited_cleanly(in_child([] {
    ::raise(SIGUSR1);  // a batch system's advance notice (Slurm --signal=USR1@120)
    ::raise(SIGUSR2);
    ::raise(SIGTERM);  // then its time limit's SIGTERM: still a request to stop
  })));
}

TEST(StopSignal, ASecondSigtermKills) {
  EXPECT_TRUE(killed_by_term(in_child([] {
    ::raise(SIGTERM);
    ::raise(SIGTERM);
  })));
  EXPECT_TRUE(killed_by_term(in_child([] {}, 2)));  // twice from the launcher, too
}

TEST(StopSignal, TheLaunchersCopyOfOneSigtermIsTheSameRequest) {
  EXPECT_TRUE(exited_cleanly(in_child([] { ::raise(SIGTERM); }, 1)));  // its own, then mpirun's relay
  EXPECT_TRUE(killed_by_term(in_child([] { ::raise(SIGTERM); }, 2)));  // a relay, then the user's "now"
}

}  // namespace
}  // namespace rt::trainer

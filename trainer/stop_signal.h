// Stopping a run cleanly by signal, as batch systems do ahead of a time limit or a preemption:
// SIGUSR1 (which mpirun forwards to every rank; a batch system's advance warning), SIGTERM and
// SIGINT ask the training loop to stop at the end of the current step, after a checkpoint, so
// that `--resume auto` continues exactly there. A second SIGTERM or SIGINT ends the process at
// once (the default action), for a user who will not wait.
#pragma once

namespace rt::trainer {

// Installs the handlers (the trainer program does, before training); the handlers only record
// the first signal caught.
void install_stop_handlers();
bool stop_handlers_installed();
// The first stop signal caught since the handlers were installed; 0 when none.
int stop_signal();
// "SIGUSR1", "SIGTERM", "SIGINT", else "signal N".
const char* stop_signal_name(int sig);

}  // namespace rt::trainer

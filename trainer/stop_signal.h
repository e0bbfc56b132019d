// Stopping a run cleanly by signal, as batch systems do ahead of a time limit or a preemption:
// SIGUSR1 or SIGUSR2 (which mpirun forwards to every rank; a batch system's advance warning:
// Slurm's --signal, submitit's SIGUSR2), SIGTERM and SIGINT ask the training loop to stop at the
// end of the current step (or evaluation), after a checkpoint, so that `--resume auto` continues
// exactly there. A second SIGTERM or SIGINT ends the process at once (the default action), for a
// user who will not wait, except the launcher's copy of a signal the rank already had from
// elsewhere: a scheduler signals every process of the job (scancel), and mpirun then relays its
// own to its ranks.
#pragma once

namespace rt::trainer {

// Installs the handlers (the trainer program does, before it starts on a training job); the
// handlers record the first signal caught, and with `announce` (rank 0) say on stderr at once
// that the job will stop.
void install_stop_handlers(bool announce = false);
bool stop_handlers_installed();
// The first stop signal caught since the handlers were installed; 0 when none.
int stop_signal();
// "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", else "signal N".
const char* stop_signal_name(int sig);

}  // namespace rt::trainer

// Stopping a running trainer job under mpirun: SIGUSR1 to mpirun, or SIGTERM to one rank, stops
// every rank after the same step with a checkpoint, an exit status of 128 + the signal and a line
// saying how to continue, and --resume auto continues from that step; a job whose mpirun is
// stopped abruptly (SIGTERM twice) leaves a loadable checkpoint; ranks whose mpirun is killed end
// with it.
// Usage: test_mpi_trainer_stop MPIEXEC TRAINER   (not itself under mpirun)
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "tests/mpi/cli_util.h"

namespace {

using namespace cli;

// The trainer processes of the job whose config is `cfg` (not its mpirun).
std::vector<int> ranks_running(const std::string& cfg) { return processes_with(cfg, trainer); }

// Seconds until no rank of `cfg` runs, or `limit` when some still do then.
double seconds_until_ranks_end(const std::string& cfg, double limit) {
  const auto t0 = std::chrono::steady_clock::now();
  wait_for([&] { return ranks_running(cfg).empty(); }, limit);
  return std::min(limit, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

std::string ranks_cmd(const std::string& cfg) {
  return mpiexec + " -np 2 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " + trainer + " --config " +
         cfg + " --set checkpoint.every_steps=1 --set train.epochs=1000 --set log.progress=false > /dev/null 2>&1";
}

// A run stopped (SIGTERM to mpirun) while it writes a checkpoint every step leaves a loadable one.
void check_killed_run() {
  const std::string cfg = tiny_config("killed");
  (void)std::system(("timeout -s TERM 3 " + ranks_cmd(cfg)).c_str());
  // mpirun stopped twice (timeout signals it, then its process group) exits before its ranks.
  const double s = seconds_until_ranks_end(cfg, 20);
  expect(s < 20, "the ranks of a job stopped with SIGTERM end", {0, ""});
  Result r = run(2, "--config " + cfg + " --set train.epochs=1000 --set train.steps=1 --resume auto");
  expect(r.rc == 0 && r.out.find("loaded ") != std::string::npos, "resume after a killed run", r);
}

// Ranks whose mpirun is killed end with it rather than train on unseen until the MPI runtime
// notices (which takes OpenMPI seconds, checkpoints written meanwhile).
void check_orphaned_ranks() {
  const std::string cfg = tiny_config("orphaned");
  const Result launch = shell(ranks_cmd(cfg) + " & echo $!");
  const int mpirun_pid = std::atoi(launch.out.c_str());
  expect(mpirun_pid > 0, "mpirun in the background", launch);
  if (mpirun_pid <= 0) return;
  wait_for([&] { return !checkpoints("orphaned").empty(); }, 60);
  const bool training = ranks_running(cfg).size() == 2;
  expect(training, "two ranks training", launch);
  ::kill(mpirun_pid, SIGKILL);
  const double s = seconds_until_ranks_end(cfg, 20);
  std::printf("ranks ended %.3f s after their mpirun was killed\n", s);
  expect(s < 0.5, "ranks end within 0.5 s of their mpirun being killed (took " + std::to_string(s) + " s)", {0, ""});
  if (s >= 20)
    for (int pid : ranks_running(cfg)) ::kill(pid, SIGKILL);
}

// A job started in the background: mpirun's pid, and the file that gets its output and then a
// last line "rc=<exit status>".
struct Job {
  int mpirun_pid = 0;
  std::string out;
  Result result() const { return {0, read_file(out)}; }
  // The exit status once mpirun has ended (within `limit` seconds), else -1.
  int wait(double limit) const {
    std::smatch m;
    std::string text;
    wait_for([&] { return std::regex_search(text = read_file(out), m, std::regex("\nrc=(\\d+)\n")); }, limit);
    return m.empty() ? -1 : std::stoi(m[1]);
  }
};

// Starts a long run of cfg (no checkpoints but the one a stop writes) and waits until it trains.
Job start_job(const std::string& cfg, const std::string& run, const std::string& mpirun_flags = "") {
  Job j;
  j.out = dir + "/" + run + ".out";
  const std::string pidfile = dir + "/" + run + ".pid";
  (void)std::system(("( " + mpiexec + " -np 2 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " +
                     mpirun_flags + " " + trainer +
                     " --config " + cfg + " --set train.epochs=100000 --set checkpoint.at_epoch_end=false > " + j.out +
                     " 2>&1 & echo $! > " + pidfile + "; wait $!; echo rc=$? >> " + j.out + " ) > /dev/null 2>&1 &")
                        .c_str());
  wait_for([&] { return std::atoi(read_file(pidfile).c_str()) > 0; }, 10);
  j.mpirun_pid = std::atoi(read_file(pidfile).c_str());
  const std::string metrics = dir + "/" + run + "/metrics.jsonl";
  const bool training = wait_for([&] { return read_file(metrics).find("\"type\":\"step\"") != std::string::npos; }, 60);
  expect(j.mpirun_pid > 0 && training, run + ": the job trains", j.result());
  return j;
}

std::string ckpt_path(const std::string& job, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%010lld.rtck", static_cast<long long>(step));
  return dir + "/" + job + "/checkpoints/" + name;
}

// The rank of a trainer process (its OMPI_COMM_WORLD_RANK), -1 if unknown.
int rank_of(int pid) {
  std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
  std::replace(env.begin(), env.end(), '\0', '\n');
  std::smatch m;
  return std::regex_search(env, m, std::regex("(^|\n)OMPI_COMM_WORLD_RANK=(\\d+)")) ? std::stoi(m[2]) : -1;
}

// `sig` reaches the job (through mpirun, or to one rank): every rank stops after the same step,
// which the one checkpoint holds, and the run continues from there.
void check_stop(const std::string& job, int sig, bool to_mpirun) {
  const std::string cfg = tiny_config(job);
  const Job j = start_job(cfg, job);
  if (j.mpirun_pid <= 0) return;
  int target = j.mpirun_pid;
  if (!to_mpirun)
    for (int pid : ranks_running(cfg))
      if (rank_of(pid) == 1) target = pid;
  expect(target != j.mpirun_pid || to_mpirun, job + ": rank 1 found", j.result());
  ::kill(target, sig);
  const int rc = j.wait(60);
  const Result r = j.result();
  const std::string signame = sig == SIGUSR1 ? "SIGUSR1" : sig == SIGUSR2 ? "SIGUSR2" : "SIGTERM";
  std::smatch m;
  const std::regex line("stopped by " + signame +
                        " after step (\\d+) of \\d+: (\\S+) holds it; continue with --resume auto");
  const bool said = std::regex_search(r.out, m, line);
  expect(rc == 128 + sig && said, job + ": stopped with status " + std::to_string(128 + sig) + " and a line", r);
  if (rc < 0)
    for (int pid : ranks_running(cfg)) ::kill(pid, SIGKILL);
  if (!said) return;
  const int64_t step = std::stoll(m[1]);
  const auto ck = checkpoints(job);
  expect(ck.size() == 1 && ck[0] == m[2].str() && ck[0] == ckpt_path(job, step),
         job + ": the one checkpoint is the stop's, step " + std::to_string(step), r);
  const Result resumed = run(2, "--config " + cfg + " --set train.epochs=100000 --set train.steps=" +
                                    std::to_string(step + 3) + " --resume auto");
  expect(resumed.rc == 0 && resumed.out.find("loaded " + m[2].str() + ": " + std::to_string(step) + " step") !=
                                std::string::npos,
         job + ": --resume auto continues from the stop", resumed);
}

// The resumed run's first line, the evaluation the stop left pending at the end of epoch `epoch`
// (of 2), has the figures the run that was not stopped printed for that epoch.
void expect_made_first(const Result& straight, const Result& resumed, int epoch = 1) {
  const auto figures = [](const std::string& out, const std::string& after) {
    const size_t at = out.find(after);
    const size_t val = at == std::string::npos ? at : out.find(", val loss ", at);
    return val == std::string::npos ? std::string() : out.substr(val, out.find(" (", val) - val);
  };
  const std::string e = std::to_string(epoch);
  const std::string want = figures(straight.out, "epoch " + e + "/2: "),
                    got = figures(resumed.out, "the evaluation the last run's stop skipped");
  expect(straight.rc == 0 && resumed.rc == 0 && !want.empty() && got == want,
         "the resume makes epoch " + e + "'s evaluation first: '" + got + "', the straight run's '" + want + "'",
         resumed);
}

// A notice that comes in the last step of an epoch (debug.fault stop: SIGUSR1 to rank 1 itself
// at step 5 of 5) stops the job after it without that epoch's evaluation, which the resume makes
// before its first step, to the figures of the run that was not stopped.
void check_stop_at_an_epochs_end() {
  const std::string cfg = tiny_config("epoch_end");  // 40 samples, 2 ranks x 4: 5 steps an epoch
  const Result straight = run(2, "--config " + cfg + " --set run_dir=" + dir + "/epoch_end_straight --set train.steps=6");
  const Result r = run(2, "--config " + cfg + " --set debug.fault=stop --set debug.rank=1 --set debug.step=5");
  expect(r.rc == 128 + SIGUSR1 && r.out.find("epoch 1/2: ") != std::string::npos &&
             r.out.find("evaluation skipped (stopping: a resume makes it first)") != std::string::npos &&
             r.out.find("stopped by SIGUSR1 after step 5 of 10") != std::string::npos,
         "a stop in the last step of epoch 1", r);
  const Result resumed = run(2, "--config " + cfg + " --set train.steps=6 --resume auto");
  expect_made_first(straight, resumed);
  const std::string metrics = read_file(dir + "/epoch_end/metrics.jsonl");
  expect(metrics.find("{\"type\":\"validation\",\"epoch\":1,\"step\":5,") != std::string::npos,
         "a validation record for epoch 1", {0, metrics});
}

// eval.every_steps 3 (epochs of 5 steps): a notice in step 3 stops the job after it without that
// step's validation, and one during the validation interrupts it; either way the resume makes
// it first, to the figures of the run that was not stopped.
void check_stop_at_a_validation_step() {
  const std::string cfg = tiny_config("every_steps");
  const std::string every = " --set eval.every_steps=3";
  const Result straight =
      run(2, "--config " + cfg + every + " --set run_dir=" + dir + "/every_steps_straight --set train.steps=4");
  const auto figures = [](const std::string& out, const std::string& after) {
    const size_t at = out.find(after);
    const size_t val = at == std::string::npos ? at : out.find("val loss ", at);
    return val == std::string::npos ? std::string() : out.substr(val, out.find(" (", val) - val);
  };
  const std::string want = figures(straight.out, "step 3 (epoch 1, its step 3 of 5): val loss");
  expect(straight.rc == 0 && !want.empty(), "the straight run validates after step 3", straight);
  for (const char* fault : {"stop", "stop_eval"}) {
    const std::string job = std::string("every_steps_") + fault;
    const Result r = run(2, "--config " + cfg + every + " --set run_dir=" + dir + "/" + job + " --set debug.fault=" +
                                fault + " --set debug.rank=1 --set debug.step=3");
    const std::string said = fault == std::string("stop") ? "step 3 (epoch 1, its step 3 of 5): evaluation skipped"
                                                           : "step 3 (epoch 1, its step 3 of 5): evaluation interrupted";
    expect(r.rc == 128 + SIGUSR1 && r.out.find(said) != std::string::npos && r.out.find("val loss") == std::string::npos &&
               r.out.find("stopped by SIGUSR1 after step 3 of 10") != std::string::npos,
           job + ": a stop at step 3's validation", r);
    const Result resumed = run(2, "--config " + cfg + every + " --set run_dir=" + dir + "/" + job +
                                      " --set train.steps=4 --resume auto");
    const std::string got = figures(resumed.out, "step 3 (epoch 1): the evaluation the last run's stop skipped");
    expect(resumed.rc == 0 && got == want,
           job + ": the resume makes step 3's validation first: '" + got + "', the straight run's '" + want + "'",
           resumed);
  }
}

// A notice during an evaluation (debug.fault stop_eval: SIGUSR1 to rank 1 itself as epoch 1's
// begins) interrupts it: the job stops at once after step 5, the evaluation pending in the
// checkpoint, and the resume makes it first, to the figures of the run that was not stopped.
void check_stop_in_an_evaluation() {
  const std::string cfg = tiny_config("in_eval");  // 5 steps an epoch, evaluated at its end
  const Result straight = run(2, "--config " + cfg + " --set run_dir=" + dir + "/in_eval_straight --set train.steps=6");
  const Result r = run(2, "--config " + cfg + " --set debug.fault=stop_eval --set debug.rank=1 --set debug.step=5");
  expect(r.rc == 128 + SIGUSR1 && r.out.find("evaluation interrupted (stopping: a resume makes it first)") != std::string::npos &&
             r.out.find("val loss") == std::string::npos &&
             r.out.find("stopped by SIGUSR1 after step 5 of 10") != std::string::npos,
         "a stop during epoch 1's evaluation", r);
  expect_made_first(straight, run(2, "--config " + cfg + " --set train.steps=6 --resume auto"));
  // The run's last evaluation too: a stop (not a finished run), the resume makes it, and then
  // the checkpoint no longer holds it pending.
  const Result last = run(2, "--config " + cfg + " --set run_dir=" + dir + "/in_eval_last --set debug.fault=stop_eval "
                                                  "--set debug.rank=0 --set debug.step=10");
  expect(last.rc == 128 + SIGUSR1 && last.out.find("evaluation interrupted") != std::string::npos &&
             last.out.find("finished") == std::string::npos &&
             last.out.find("stopped by SIGUSR1 after step 10 of 10") != std::string::npos,
         "a stop during the last evaluation", last);
  const std::string again = "--config " + cfg + " --set run_dir=" + dir + "/in_eval_last --resume auto";
  expect_made_first(run(2, "--config " + cfg + " --set run_dir=" + dir + "/in_eval_straight"), run(2, again), 2);
  const Result done = run(2, again);
  expect(done.rc == 0 && done.out.find("nothing to train: step 10 of 10 already done\n") != std::string::npos,
         "then nothing is pending", done);
}

// A scheduler's SIGTERM to every process of the job (scancel) reaches each rank twice: its own,
// then mpirun's relay. That is one request: the job stops with a checkpoint of the step it
// stopped after, as with the signal to one rank (the relay used to kill the ranks at once). Steps
// of 1 s, the signal sent just after one ends: the relay comes during the next (mpirun's own
// SIGKILL after its relay, 1 s later by default, put off to 6 s here: the ranks end about 2.5 s
// after the signal; mpirun lingers some 4 s past its SIGKILL, so the longer, the slower the test).
void check_stop_of_every_process() {
  const std::string cfg = tiny_config("everyone");
  const Job j = start_job(cfg + " --set emulate.compute_ms=1000 --set log.interval=1", "everyone",
                          "--mca odls_base_sigkill_timeout 6");
  if (j.mpirun_pid <= 0) return;
  const auto steps_said = [&] {
    const std::string out = read_file(j.out);
    size_t n = 0;
    for (size_t at = out.find(" step "); at != std::string::npos; at = out.find(" step ", at + 1)) ++n;
    return n;
  };
  const size_t said_before = steps_said();
  wait_for([&] { return steps_said() > said_before; }, 20);
  std::vector<int> all = ranks_running(cfg);
  all.push_back(j.mpirun_pid);
  for (int pid : all) ::kill(pid, SIGTERM);
  j.wait(60);
  const Result r = j.result();
  std::smatch m;
  const bool said = std::regex_search(
      r.out, m, std::regex("stopped by SIGTERM after step (\\d+) of \\d+: (\\S+) holds it; continue with --resume auto"));
  expect(said && r.out.find("SIGTERM caught: the job stops after the current step") != std::string::npos,
         "SIGTERM to mpirun and every rank: a stop with a checkpoint, said", r);
  if (!said) {
    for (int pid : ranks_running(cfg)) ::kill(pid, SIGKILL);
    return;
  }
  const auto ck = checkpoints("everyone");
  expect(!ck.empty() && ck.back() == m[2].str() && ck.back() == ckpt_path("everyone", std::stoll(m[1])),
         "the stop's checkpoint is there", r);
}

// A second training job in the run folder a running one uses is refused, naming the first's pid:
// the two would interleave their records and resume from, set aside and prune each other's
// checkpoints. Once the first has stopped, the folder is free again.
void check_checkpoint_folder_in_use() {
  const std::string cfg = tiny_config("in_use");
  const Job j = start_job(cfg, "in_use");
  if (j.mpirun_pid <= 0) return;
  expect_error(run(2, "--config " + cfg + " --set train.steps=1 --resume auto"),
               dir + "/in_use: in use by another training job \\(pid [0-9]+ on [^;]+; " + dir +
                   "/in_use/.lock\\): give this one another run_dir \\(run_dir set in " + cfg +
                   ":[0-9]+\\), or let the other end first",
               "a second job in a running job's folder");
  ::kill(j.mpirun_pid, SIGUSR1);
  expect(j.wait(60) == 128 + SIGUSR1, "the first job stops", j.result());
  const Result again = run(2, "--config " + cfg + " --set train.steps=1 --resume auto");
  expect(again.rc == 0 && again.out.find("in use") == std::string::npos, "the folder is free after the stop", again);
}

// A stop in the middle of an epoch records the part of it trained (an epoch record of its steps
// 1-3), as the resumed run records the rest; with log.progress off, the progress and epoch lines
// are not printed, the stop's line (what to do next) still is.
void check_stop_mid_epoch() {
  const std::string cfg = tiny_config("mid_epoch");  // 5 steps an epoch
  const Result r = run(2, "--config " + cfg + " --set log.progress=false --set debug.fault=stop --set debug.rank=1 "
                                              "--set debug.step=3");
  expect(r.rc == 128 + SIGUSR1 && r.out.find("stopped by SIGUSR1 after step 3 of 10") != std::string::npos &&
             r.out.find("epoch 1/2") == std::string::npos,
         "a stop at step 3, said with log.progress off; no progress lines", r);
  const Result resumed = run(2, "--config " + cfg + " --set train.steps=5 --resume auto");
  expect(resumed.rc == 0, "the resume to the epoch's end", resumed);
  const std::string metrics = read_file(dir + "/mid_epoch/metrics.jsonl");
  const size_t part1 = metrics.find("{\"type\":\"epoch\",\"epoch\":1,\"step\":3,"),
               stop = metrics.find("{\"type\":\"stop\",\"step\":3,"),
               part2 = metrics.find("{\"type\":\"epoch\",\"epoch\":1,\"step\":5,");
  expect(part1 != std::string::npos && stop != std::string::npos && part1 < stop && part2 != std::string::npos &&
             metrics.find("\"first_step_in_epoch\":1,\"last_step_in_epoch\":3", part1) < stop &&
             metrics.find("\"first_step_in_epoch\":4,\"last_step_in_epoch\":5", part2) != std::string::npos,
         "epoch 1's steps 1-3 recorded before the stop, 4-5 by the resumed run", {0, metrics});
}

}  // namespace

int main(int argc, char** argv) {
  if (!start(argc, argv, "test_mpi_trainer_stop")) return 2;
  check_stop("usr1", SIGUSR1, true);
  check_stop("term", SIGTERM, false);
  check_stop("usr2", SIGUSR2, true);
  check_stop_in_an_evaluation();
  check_stop_of_every_process();
  check_checkpoint_folder_in_use();
  check_stop_at_an_epochs_end();
  check_stop_at_a_validation_step();
  check_stop_mid_epoch();
  check_killed_run();
  check_orphaned_ranks();
  return finish("test_mpi_trainer_stop");
}

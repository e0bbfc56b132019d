// The trainer program as users meet it, launched through mpirun: help, configuration errors
// (one line naming rank, file:line and key; non-zero exit; nothing hangs), a short run that
// checkpoints and logs, evaluation of a checkpoint on another rank count, resume, and damaged or
// foreign checkpoints, including a run stopped while it writes checkpoints, and ranks that end with
// their mpirun.
// Usage: test_mpi_trainer_cli MPIEXEC TRAINER   (not itself under mpirun)
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/mpi/cli_util.h"

namespace {

namespace fs = std::filesystem;
using namespace cli;

std::string tiny_config(const std::string& run) {
  return write(run + ".yaml",
               "model: {name: resnet20, classes: 4, width: 0.25}\n"
               "data: {synthetic: true, synthetic_samples: 40, synthetic_classes: 4, image_size: 8, threads: 1}\n"
               "train: {epochs: 2, batch: 4}\n"
               "optimizer: {lr: 3.2}\n"
               "schedule: {kind: cosine, warmup_epochs: 0.5}\n"
               "log: {interval: 2, print_config: false}\n"
               "threads: 1\n"
               "run_dir: " + dir + "/" + run + "\n");
}

std::vector<std::string> checkpoints(const std::string& run) {
  std::vector<std::string> out;
  std::error_code ec;  // no folder: no checkpoints (the caller's expectation reports it)
  for (fs::directory_iterator it(dir + "/" + run + "/checkpoints", ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".rtck") out.push_back(it->path().string());
  std::sort(out.begin(), out.end());
  return out;
}

void check_errors() {
  Result r = run(1, "--help");
  expect(r.rc == 0 && r.out.find("usage: trainer --config FILE") != std::string::npos, "--help", r);

  const std::string bad = write("bad.yaml", "model: {name: resnet20, classes: 4}\ntrain:\n  bacth: 4\n");
  expect_error(run(2, "--config " + bad), "ringtrain: rank [01] of 2: " + bad + ":3: unknown key 'train.bacth'",
               "unknown key in the file");
  const std::string cfg = tiny_config("errors");
  expect_error(run(2, "--config " + cfg + " --set train.batch=four"),
               "ringtrain: rank [01] of 2: --set train.batch=four: key 'train.batch' expects an integer",
               "wrong type in --set");
  expect_error(run(2, "--config " + dir + "/absent.yaml"), "absent.yaml: cannot read the config file",
               "missing config file");
  // The CPU trainer points to trainer_cuda (or says it was built without CUDA), on every rank.
  expect_error(run(2, "--config " + cfg + " --set backend=cuda"),
               "rank [01] of 2: backend 'cuda'.*(built without CUDA|build/bin/trainer_cuda)", "cuda backend");
  expect_error(run(2, "--config " + cfg + " --set data.synthetic=false --set data.root=" + dir + "/no-data"),
               "no-data", "missing data root");
  expect_error(run(2, "--config " + cfg + " --frobnicate"), "unknown argument '--frobnicate'", "bad argument");
  // A job too large for the memory there is says which key to lower: ResNet-50's activations at
  // batch 512 need tens of GiB, and the ranks' address space is capped at 2 GB. (Not in sanitizer
  // builds: their shadow memory alone is terabytes of address space.)
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  std::printf("note: the out-of-memory check is left out in sanitizer builds\n");
  return;
#endif
  const std::string big = write("big.yaml",
                                "model: {name: resnet50, classes: 4}\n"
                                "data: {synthetic: true, synthetic_samples: 1024, synthetic_classes: 4,"
                                " image_size: 224, threads: 1}\n"
                                "train: {epochs: 1, batch: 512}\n"
                                "log: {print_config: false}\n"
                                "threads: 1\n"
                                "run_dir: " + dir + "/big\n");
  expect_error(shell("ulimit -v 2000000 && " + mpiexec + " -np 1 --bind-to none " + trainer + " --config " + big),
               "ringtrain: rank 0 of 1: host memory exhausted \\(std::bad_alloc\\); " + big +
                   ": resnet50 with train.batch 512 per rank \\(also the evaluation batch\\) on backend onednn "
                   "does not fit in memory: lower train.batch",
               "out of memory");
}

void check_run_eval_resume() {
  const std::string cfg = tiny_config("run");
  Result r = run(2, "--config " + cfg);
  expect(r.rc == 0 && r.out.find("epoch 2/2: train loss") != std::string::npos &&
             r.out.find("val loss") != std::string::npos,
         "a short 2-rank run", r);
  const auto ck = checkpoints("run");
  expect(ck.size() == 2, "a checkpoint per epoch", r);
  if (ck.size() != 2) return;
  std::ifstream m(dir + "/run/metrics.jsonl");
  const std::string metrics((std::istreambuf_iterator<char>(m)), std::istreambuf_iterator<char>());
  expect(metrics.find("\"type\":\"step\"") != std::string::npos &&
             metrics.find("\"exposed_comm_s\"") != std::string::npos &&
             metrics.find("\"val_top5\"") != std::string::npos,
         "metrics.jsonl has step and epoch records", {0, metrics});

  // Evaluation on 3 ranks with the configuration saved in the checkpoint: all 40 images once.
  r = run(3, "--eval --checkpoint " + ck.back());
  expect(r.rc == 0 && r.out.find("over 40 images") != std::string::npos, "--eval on 3 ranks", r);
  r = run(2, "--config " + cfg + " --resume auto");
  expect(r.rc == 0 && r.out.find("nothing to train") != std::string::npos, "--resume auto after the end", r);
  r = run(2, "--config " + cfg + " --set run_dir=" + dir + "/fresh --resume auto");
  expect(r.rc == 0 && r.out.find("starting fresh") != std::string::npos, "--resume auto without checkpoints", r);

  // Damaged and foreign checkpoints.
  const std::string cut = dir + "/cut.rtck";
  fs::copy_file(ck.back(), cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  expect_error(run(2, "--eval --checkpoint " + cut + " --config " + cfg), cut + ": truncated",
               "truncated checkpoint");
  expect_error(run(2, "--eval --checkpoint " + ck.back() + " --config " + cfg + " --set model.width=0.5"),
               ck.back() + ": written for another model \\(resnet20", "checkpoint of another model");
  expect_error(run(2, "--config " + cfg + " --set train.batch=2 --resume " + ck.front()),
               "written by 2 rank\\(s\\) x batch 4; this run has 2 rank\\(s\\) x batch 2", "resume with another batch");
  expect_error(run(2, "--config " + cfg + " --set train.accumulate=2 --resume " + ck.front()),
               "this run has 2 rank\\(s\\) x batch 4 x 2 accumulated", "resume with passes accumulated");
  // A newer checkpoint damaged after it was written is passed over by --resume auto.
  fs::resize_file(ck.back(), 100);
  r = run(2, "--config " + cfg + " --resume auto");
  expect(r.rc == 0 && r.out.find("skipping a damaged checkpoint") != std::string::npos &&
             r.out.find("loaded " + ck.front()) != std::string::npos,
         "--resume auto passes over a damaged newest checkpoint", r);
}

// The pids of the trainer processes (mpirun's children, not mpirun) whose command line names
// `cfg`; zombies have an empty command line and are left out.
std::vector<int> ranks_running(const std::string& cfg) {
  std::vector<int> pids;
  std::error_code ec;
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string pid = it->path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(it->path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.rfind(trainer + " ", 0) == 0 && cmd.find(cfg) != std::string::npos) pids.push_back(std::stoi(pid));
  }
  return pids;
}

// Seconds until no rank of `cfg` runs, or `limit` when some still do then.
double seconds_until_ranks_end(const std::string& cfg, double limit) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (ranks_running(cfg).empty() || s >= limit) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
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
  const std::string ckpts = dir + "/orphaned/checkpoints";
  for (int i = 0; i < 3000 && !(fs::exists(ckpts) && !fs::is_empty(ckpts)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const bool training = ranks_running(cfg).size() == 2;
  expect(training, "two ranks training", launch);
  ::kill(mpirun_pid, SIGKILL);
  const double s = seconds_until_ranks_end(cfg, 20);
  std::printf("ranks ended %.3f s after their mpirun was killed\n", s);
  expect(s < 0.5, "ranks end within 0.5 s of their mpirun being killed (took " + std::to_string(s) + " s)", {0, ""});
  if (s >= 20)
    for (int pid : ranks_running(cfg)) ::kill(pid, SIGKILL);
}

}  // namespace

int main(int argc, char** argv) {
  if (!start(argc, argv, "test_mpi_trainer_cli")) return 2;
  check_errors();
  check_run_eval_resume();
  check_killed_run();
  check_orphaned_ranks();
  return finish("test_mpi_trainer_cli");
}

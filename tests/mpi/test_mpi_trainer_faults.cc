// Faults injected into real trainer jobs under mpirun, each of which must end the whole job with a
// non-zero status and a message naming the rank at fault, well within 30 s, leave no process
// behind and keep the last good checkpoint: a rank killed with SIGKILL, a rank that throws, a rank
// that stalls, a NaN or Inf in a parameter, a full disk and a checkpoint folder that turns
// read-only. After the kill, --resume auto finishes the run with the same parameters, bit for
// bit, as a run never interrupted. Prints the table docs/reliability.md shows.
// Usage: test_mpi_trainer_faults MPIEXEC TRAINER   (not itself under mpirun)
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/mpi/cli_util.h"
#include "trainer/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using namespace cli;

struct Row {
  std::string fault, outcome, kept;
  int rc;
  double seconds;
};
std::vector<Row> table;

// 40 samples on 2 ranks x batch 4: 5 steps per epoch, 10 in all; a checkpoint after every step.
std::string config(const std::string& run, const std::string& checkpoint = "{every_steps: 1, keep: 2}") {
  return write(run + ".yaml",
               "model: {name: resnet20, classes: 4, width: 0.25}\n"
               "data: {synthetic: true, synthetic_samples: 40, synthetic_classes: 4, image_size: 8, threads: 1}\n"
               "train: {epochs: 2, batch: 4}\n"
               "optimizer: {lr: 0.4}\n"
               "checkpoint: " + checkpoint + "\n"
               "log: {progress: false, print_config: false}\n"
               "threads: 1\n"
               "run_dir: " + dir + "/" + run + "\n");
}

// Every file in a folder (temporary ones too), by name.
std::vector<std::string> files_in(const std::string& folder) {
  std::vector<std::string> out;
  if (!fs::is_directory(folder)) return out;
  for (const auto& e : fs::directory_iterator(folder)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string list(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "none" : s;
}

// Processes whose command line mentions `needle` (the scenario's own config file), waiting up to
// 5 s for mpirun's teardown to finish.
int survivors(const std::string& needle) {
  wait_for([&] { return processes_with(needle).empty(); }, 5);
  return int(processes_with(needle).size());
}

// A job that must fail: non-zero, within 30 s, every pattern in its output, nobody left running.
void expect_fault(const std::string& fault, const Result& r, const std::string& cfg,
                  const std::vector<std::string>& patterns, const std::string& outcome, const std::string& kept) {
  expect(r.rc != 0, fault + ": non-zero exit", r);
  expect(r.seconds < 30, fault + ": ends within 30 s", r);
  for (const auto& p : patterns) expect(matches(r, p), fault + ": output matches /" + p + "/", r);
  const int left = survivors(cfg);
  expect(left == 0, fault + ": no process left behind (" + std::to_string(left) + " remain)", r);
  table.push_back({fault, outcome, kept, r.rc, r.seconds});
}

bool same_state(const std::string& a, const std::string& b) {
  const rt::trainer::Checkpoint x = rt::trainer::checkpoint_read(a), y = rt::trainer::checkpoint_read(b);
  return x.meta.step == y.meta.step && x.params == y.params && x.state == y.state && x.momentum == y.momentum;
}

void kill_and_resume() {
  const std::string ref_cfg = config("ref");
  Result r = run(2, "--config " + ref_cfg);
  expect(r.rc == 0, "uninterrupted reference run", r);

  const std::string cfg = config("killed");
  r = run(2, "--config " + cfg + " --set debug.fault=kill --set debug.rank=1 --set debug.step=7");
  // Rank 1 dies at the start of step 7, when rank 0 may still be writing step 6's checkpoint.
  const auto ck = files_in(dir + "/killed/checkpoints");
  const bool kept = !ck.empty() && (ck.back() == "ckpt-0000000006.rtck" || ck.back() == "ckpt-0000000005.rtck");
  expect(kept, "the checkpoint of step 5 or 6 kept after the kill, no temporary file", r);
  expect_fault("rank 1 killed (SIGKILL) in step 7", r, cfg, {"rank 1 .*signal 9"},
               "mpirun names rank 1 and signal 9 and stops the others", list(ck));
  r = run(2, "--config " + cfg + " --resume auto --set log.progress=true");
  expect(r.rc == 0 && kept && matches(r, "loaded .*" + ck.back()), "--resume auto after the kill", r);
  const std::string a = dir + "/killed/checkpoints/ckpt-0000000010.rtck", b = dir + "/ref/checkpoints/ckpt-0000000010.rtck";
  bool same = false;
  try {
    same = same_state(a, b);
  } catch (const std::exception& e) {
    std::printf("%s\n", e.what());
  }
  expect(same, "resumed run ends bitwise equal to the uninterrupted one (params, BN state, momentum)", r);
}

void failing_ranks() {
  std::string cfg = config("throw");
  Result r = run(2, "--config " + cfg + " --set debug.fault=throw --set debug.rank=1 --set debug.step=4");
  expect_fault("rank 1 throws in step 4", r, cfg, {"ringtrain: rank 1 of 2: debug: injected failure at step 4"},
               "the rank's message, MPI_Abort stops the others", list(files_in(dir + "/throw/checkpoints")));

  // Stalls (debug.fault stall, or stall_eval in an evaluation), warned of after 1 s and stopped
  // after 4 s, each naming the missing rank and where the others wait.
  struct Stall {
    const char* run;
    int np, rank, step;
    std::string sets, fault, waits_in, outcome;
  };
  const std::string grads = "the gradient allreduce of step ";
  for (const Stall& st : std::vector<Stall>{
           {"stall", 3, 2, 4, " --set train.batch=2", "rank 2 of 3 stalls before step 4's allreduce", grads + "4",
            "warning after 1 s naming rank 2, stop after 4 s"},
           // Every rank waits inside one of its node's or the cross-node rings (sub-communicators),
           // and the stall check still names world rank 3.
           {"stall-hier", 4, 3, 4, " --set train.batch=2 --set comm.algorithm=hierarchical --set comm.ranks_per_node=2",
            "rank 3 of 4 stalls, hierarchical allreduce", grads + "4", "the same, naming world rank 3"},
           // The healthy ranks block inside MPI_Allreduce, where no wait loop polls: the watch's
           // watchdog thread warns and stops the job.
           {"stall-mpi", 3, 1, 3, " --set train.batch=2 --set comm.algorithm=mpi", "rank 1 of 3 stalls, MPI_Allreduce",
            grads + "3", "the same inside MPI_Allreduce"},
           // With synchronised batch norm the others first wait in the forward pass's sums.
           {"stall-bn", 2, 1, 3, " --set model.bn_group=0", "rank 1 of 2 stalls, synchronised batch norm",
            "the batch-norm sums of step 3 \\(model.bn_group\\)", "the same, naming the batch norms' sums"},
           // A validation read that never returns: the others wait in the evaluation's sums, a
           // collective of the trainer's own.
           {"stall-eval", 2, 1, 5, " --set eval.every_epochs=1 --set debug.fault=stall_eval",
            "rank 1 of 2 stalls in the evaluation after step 5", "the end of an evaluation \\(its sums\\)",
            "the same, naming the evaluation"}}) {
    cfg = config(st.run);
    r = run(st.np, "--config " + cfg + " --set debug.fault=stall --set debug.rank=" + std::to_string(st.rank) +
                       " --set debug.step=" + std::to_string(st.step) +
                       " --set comm.stall_warning_s=1 --set comm.stall_abort_s=4" + st.sets);
    const std::string who =
        "rank\\(s\\) " + std::to_string(st.rank) + " of " + std::to_string(st.np) + " have not reached ";
    expect_fault(st.fault, r, cfg,
                 {"warning: stall: " + who + st.waits_in + " after 1\\.", "stall: " + who + ".* stopping the job"},
                 st.outcome, list(files_in(dir + "/" + st.run + "/checkpoints")));
    if (std::string(st.run) == "stall-mpi")
      expect(!matches(r, "note: comm.algorithm mpi"), "no note that the stall check cannot watch MPI_Allreduce", r);
  }

  // A rank stopped (SIGSTOP) just after announcing a collective: every rank has reached it, so
  // only its silence names it. The warning comes from the lowest rank still heard from (rank 0's
  // own stop left nobody to warn). (Whether the stopped rank, continued by the launcher's
  // teardown, lives to say that the wait was its own depends on the teardown: test_mpi_stall.)
  struct Freeze {
    const char* run;
    int np, rank;
    std::string sets, fault, waits_in, outcome;
  };
  for (const Freeze& fz : std::vector<Freeze>{
           {"freeze", 3, 0, " --set debug.fault=freeze", "rank 0 of 3 stopped inside step 4's ring allreduce",
            grads + "4", "rank 1 warns after 1 s, every rank stops after 4 s, naming rank 0"},
           {"freeze-reducer", 3, 1, " --set debug.fault=freeze --set comm.algorithm=reducer",
            "rank 1 of 3 stopped inside step 4's reducer allreduce", grads + "4",
            "the same, naming rank 1 (not the root, which waits on it)"},
           {"freeze-ctl", 3, 1, " --set debug.fault=freeze_ctl",
            "rank 1 of 3 stopped inside the end-of-step agreement (MPI_Allreduce)",
            "the end of step 4 \\(where the ranks compare stop signals\\)", "the same, from the watchdog"}}) {
    cfg = config(fz.run);
    r = run(fz.np, "--config " + cfg + " --set debug.rank=" + std::to_string(fz.rank) +
                       " --set debug.step=4 --set comm.stall_warning_s=1 --set comm.stall_abort_s=4 --set train.batch=2" +
                       fz.sets);
    const std::string reached = "every rank reached " + fz.waits_in + " but it has not completed after ",
                      silent = "rank\\(s\\) " + std::to_string(fz.rank) + " reached it but have not been heard from";
    const std::string reporter = std::to_string(fz.rank == 0 ? 1 : 0);
    expect_fault(fz.fault, r, cfg,
                 {"rank " + reporter + " of 3: warning: stall: " + reached + "1\\.[0-9] s: " + silent,
                  "stall: " + reached + "4\\.[0-9] s: " + silent + ".* stopping the job"},
                 fz.outcome, list(files_in(dir + "/" + fz.run + "/checkpoints")));
    expect(!matches(r, "rank [0-9] of 3: warning: stall: .*rank\\(s\\) [0-9, ]*" + std::to_string(fz.rank == 0 ? 1 : 0) +
                           "[0-9, ]* reached it but"),
           fz.fault + ": no healthy rank named as silent", r);
  }
}

void numerical_faults() {
  // NaN and Inf in a convolution's weight (a few outputs non-finite, the loss finite); and NaN in
  // the classifier's weight under dynamic loss scaling: rank 1's loss is then NaN and rank 0's
  // finite, and both must still diagnose together (rank 0 must not skip the step as an overflow
  // while rank 1 waits for it in the diagnosis).
  for (const std::string kind : {"nan", "inf", "nan-dynamic"}) {
    const std::string run_name = "poison-" + kind, cfg = config(run_name);
    const bool dynamic = kind == "nan-dynamic";
    const std::string param = dynamic ? "fc" : "layer2.1.conv1";
    Result r = run(2, "--config " + cfg + " --set debug.fault=" + (dynamic ? "nan" : kind) +
                          " --set debug.rank=1 --set debug.step=3 --set debug.param=" + param + ".weight" +
                          (dynamic ? " --set loss_scale.mode=dynamic" : ""));
    const auto ck = files_in(dir + "/" + run_name + "/checkpoints");
    expect(ck.size() == 2 && ck.back() == "ckpt-0000000002.rtck", kind + ": steps 1-2 kept", r);
    const std::string where = dynamic ? "fc" : "layer2\\.1\\.conv1";
    expect_fault(std::string(kind == "inf" ? "Inf" : "NaN") + " in a parameter on rank 1, step 3" +
                     (dynamic ? " (its loss NaN), dynamic loss scaling" : ""),
                 r, cfg,
                 {"non-finite gradients at step 3 \\(epoch 1",
                  "rank 1: loss " + std::string(dynamic ? "nan" : "[^;]*") + ", first non-finite output in forward: " +
                      where + " \\(whose parameters hold 1 non-finite",
                  "the last checkpoint is .*ckpt-0000000002"},
                 "stops before the update naming step 3, rank 1, " + param, list(ck));
  }
}

// Disk full and a folder that turns read-only: a tmpfs of its own (needs root).
void disk_faults() {
  const std::string mnt = dir + "/small";
  fs::create_directories(mnt);
  const std::string probe = config("probe", "{every_steps: 1, keep: 1}");
  Result r = run(2, "--config " + probe + " --set train.steps=1");
  const auto pk = files_in(dir + "/probe/checkpoints");
  if (r.rc != 0 || pk.empty()) return expect(false, "probe run for the checkpoint size", r);
  const uintmax_t size = fs::file_size(dir + "/probe/checkpoints/" + pk[0]);
  // Room for one checkpoint and a half: the second write runs out of space.
  const std::string opts = "size=" + std::to_string((size * 3 / 2 + 4095) / 4096 * 4096);
  if (geteuid() != 0 || mount("tmpfs", mnt.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
    std::printf("SKIPPED disk-full and read-only checkpoint folders: mounting a tmpfs needs root (%s)\n",
                std::strerror(errno));
    return;
  }
  std::string cfg = config("full", "{dir: " + mnt + "/full, every_steps: 1, keep: 3}");
  r = run(2, "--config " + cfg);
  auto ck = files_in(mnt + "/full");
  expect(ck == std::vector<std::string>{"ckpt-0000000001.rtck"}, "disk full: step 1 kept, no temporary file", r);
  expect_fault("checkpoint disk full (tmpfs for 1.5 checkpoints)", r, cfg,
               {"rank 0 of 2: .*ckpt-0000000002.rtck.tmp: cannot write the checkpoint \\(No space left on device\\); "
                "training stopped at step 2, the last checkpoint, .*ckpt-0000000001.rtck, is kept"},
               "names the file and ENOSPC, says which checkpoint is kept", list(ck));
  r = run(2, "--eval --checkpoint " + mnt + "/full/ckpt-0000000001.rtck");
  expect(r.rc == 0, "the kept checkpoint still evaluates", r);
  fs::remove_all(mnt + "/full");

  // The folder becomes read-only once checkpoints are being written: remounted while the job runs.
  cfg = config("ro", "{dir: " + mnt + "/ro, every_steps: 1, keep: 3}");
  mount("tmpfs", mnt.c_str(), "tmpfs", MS_REMOUNT, "size=64m");
  // Waits for any checkpoint (with keep: 3 the first one lives only a few milliseconds); the
  // remount fails with EBUSY while a checkpoint file is open for writing, so it is retried.
  const std::string cmd = "( timeout 60 sh -c 'until ls " + mnt +
                          "/ro/ckpt-*.rtck >/dev/null 2>&1; do sleep 0.01; done; until mount -o remount,ro " + mnt +
                          " 2>/dev/null; do sleep 0.002; done' ) & " + mpiexec + " -np 2 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " +
                          trainer + " --config " + cfg + " --set train.epochs=1000; rc=$?; wait; exit $rc";
  r = shell(cmd);
  ck = files_in(mnt + "/ro");
  expect(!ck.empty(), "read-only folder: the checkpoints written before are kept", r);
  // Which call meets the read-only folder (create, write, sync, rename) depends on when it turns.
  expect_fault("checkpoint folder turns read-only mid-run", r, cfg,
               {"rank 0 of 2: .*\\(Read-only file system\\); training stopped at step [0-9]+, the last checkpoint, .* is kept"},
               "names the file and EROFS, says which checkpoint is kept", list(ck));
  umount(mnt.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (!start(argc, argv, "test_mpi_trainer_faults")) return 2;
  kill_and_resume();
  failing_ranks();
  numerical_faults();
  disk_faults();
  std::printf("\n| fault | what happened | exit status | seconds to exit | checkpoints kept |\n|---|---|---|---|---|\n");
  for (const Row& t : table)
    std::printf("| %s | %s | %d | %.1f | %s |\n", t.fault.c_str(), t.outcome.c_str(), t.rc, t.seconds, t.kept.c_str());
  umount((dir + "/small").c_str());  // in case a check above returned early
  return finish("test_mpi_trainer_faults");
}

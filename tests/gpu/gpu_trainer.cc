// The trainer program on `backend: cuda` under mpirun, 1 and 2 ranks on one GPU, against the
// same job on a CPU backend (RT_CPU_BACKEND: oneDNN, or the reference in GPU-only builds): each run must finish, and the loss of every step must agree
// within float tolerance (same synthetic data, same initialisation; the averaged gradients cross
// the ring allreduce through the reducer's device hooks, the arena being device memory).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "trainer/checkpoint.h"

namespace {

// One folder per test and run: ctest may run these tests at the same time, and two runs of one
// backend (the CPU reference of every test, "cuda" of two) must not share one.
std::string run_dir(const std::string& tag) {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  return (std::filesystem::temp_directory_path() / ("rt_gpu_trainer_" + test + "_" + tag)).string();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Runs the trainer in a fresh run folder (its job file there) and returns mpirun's exit status.
// `extra`: more YAML lines for the job; `env`: variables set for mpirun and its ranks; `args`: more
// command-line arguments; `fresh` false keeps what earlier runs left in the folder (to resume).
int run_trainer(const std::string& backend, int np, std::string* out, const std::string& extra = "",
                const std::string& env = "", const std::string& args = "", bool fresh = true) {
  const std::string dir = run_dir(backend + "_np" + std::to_string(np));
  if (fresh) std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/job.yaml") << "model: {name: resnet20, classes: 10, width: 0.5}\n"
                                      "data: {synthetic: true, synthetic_samples: 64, synthetic_classes: 10,"
                                      " image_size: 16, threads: 1}\n"
                                      "train: {epochs: 1, batch: 8}\n"
                                      "log: {progress: false, print_config: false}\n"
                                      "threads: 1\n"
                                      "backend: " << backend << "\nrun_dir: " << dir << "\n" << extra;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);  // GPU machines often run their jobs as root
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  // A job that hangs fails the test (timeout's status) instead of stalling the suite; in the
  // foreground, timeout stays in the test's process group, which a ctest that is cut ends.
  const std::string cmd = env + " timeout --foreground -k 5 150 " + RT_MPIEXEC + " -np " +
                          std::to_string(np) +
                          " --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " RT_TRAINER_BIN
                          " --config " + dir + "/job.yaml " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out->append(buf, n);
  return pclose(p);
}

// Runs the trainer, which must succeed, and returns rank 0's loss per step from its metrics file
// (and into `norms` the gradient norm of each step that reports one: train.clip_grad_norm).
std::map<long, double> train(const std::string& backend, int np, std::string* out,
                             const std::string& extra = "", const std::string& args = "",
                             std::map<long, double>* norms = nullptr) {
  EXPECT_EQ(run_trainer(backend, np, out, extra, "", args), 0) << *out;
  const std::string dir = run_dir(backend + "_np" + std::to_string(np));
  std::map<long, double> loss;
  std::ifstream f(dir + "/metrics.jsonl");
  const std::regex step_re("\"type\":\"step\".*\"step\":([0-9]+).*\"loss\":([-0-9.eE+]+)");
  const std::regex norm_re("\"type\":\"step\".*\"step\":([0-9]+).*\"grad_norm\":([-0-9.eE+]+)");
  for (std::string line; std::getline(f, line);) {
    std::smatch m;
    if (std::regex_search(line, m, step_re)) loss[std::stol(m[1])] = std::stod(m[2]);
    if (norms && std::regex_search(line, m, norm_re)) (*norms)[std::stol(m[1])] = std::stod(m[2]);
  }
  return loss;
}

// Trains with `backend` on the GPU and with RT_CPU_BACKEND on 1 and 2 ranks: rank 0's loss of every
// step must agree within tol + tol * |loss|, and so must the gradient's norm where the CPU run
// reports one (train.clip_grad_norm). `extra` is for the GPU run, `both` (command-line arguments)
// for both.
void expect_matches_cpu(const std::string& backend, double tol, const std::string& extra = "",
                        const std::string& both = "") {
  RT_REQUIRE_GPU();
  // The CPU's runs, by rank count and arguments: a test comparing two precisions runs them once.
  struct CpuRun {
    std::string out;
    std::map<long, double> loss, norms;
  };
  static std::map<std::pair<int, std::string>, CpuRun> cpu_runs;
  for (int np : {1, 2}) {
    std::string out_gpu;
    std::map<long, double> gpu_norms;
    const auto gpu = train(backend, np, &out_gpu, extra, both, &gpu_norms);
    if (!cpu_runs.count({np, both})) {
      CpuRun& r = cpu_runs[{np, both}];
      r.loss = train(RT_CPU_BACKEND, np, &r.out, "", both, &r.norms);
    }
    const CpuRun& run = cpu_runs.at({np, both});
    const std::string& out_cpu = run.out;
    const auto& cpu = run.loss;
    const auto& cpu_norms = run.norms;
    // Ranks beyond the node's GPUs share them, and the job says so once.
    const size_t notes = count(out_gpu, "ranks on this node share its");
    EXPECT_EQ(notes, rt::cuda::device_count() < np ? 1u : 0u) << out_gpu;
    ASSERT_FALSE(cpu.empty()) << out_cpu;
    ASSERT_EQ(gpu.size(), cpu.size()) << out_gpu;
    for (const auto& [step, l] : cpu) {
      ASSERT_TRUE(gpu.count(step)) << "step " << step;
      EXPECT_NEAR(gpu.at(step), l, tol + tol * std::fabs(l)) << backend << " np " << np << " step " << step;
    }
    EXPECT_EQ(cpu_norms.empty(), both.find("clip_grad_norm") == std::string::npos) << out_cpu;
    EXPECT_EQ(gpu_norms.size(), cpu_norms.size()) << out_gpu;
    for (const auto& [step, g] : cpu_norms)
      EXPECT_NEAR(gpu_norms.count(step) ? gpu_norms.at(step) : -1, g, tol * g)
          << backend << " np " << np << " step " << step << ": the gradient's norm";
  }
}

// fp32 on the device against the CPU: cuDNN's algorithms sum in orders of their own, so on a GPU
// the losses agree to about 1e-3; the emulator sums in double, and its losses agree with oneDNN's
// to the 6 digits the metrics file keeps, so there a tenth of that catches what a GPU's tolerance
// would let through (averaged gradients summed instead, say: 5e-4 off by the second step).
#ifdef RT_CUDA_EMULATOR
constexpr double kFp32Tol = 1e-4;
#else
constexpr double kFp32Tol = 1e-3;
#endif

// This one evaluates at the end too (the device's evaluation path end to end); the others
// compare training steps only and skip it, which on the emulator is a fifth of a run. Both runs
// clip the gradient's norm (train.clip_grad_norm) at a limit three of the four steps are above: the
// device's norm must be the CPU's (its scaling: Backend::scale_count_nonfinite, tested on its own);
// and freeze the first block (optimizer.freeze: its gradients zeroed on the device's stream before
// the norm, which then differs from an unfrozen run's by half a percent, far beyond the tolerance).
TEST(GpuTrainer, CudaMatchesCpuOnOneAndTwoRanks) {
  expect_matches_cpu("cuda", kFp32Tol, "", "--set train.clip_grad_norm=0.3 --set optimizer.freeze=[layer1.0]");
}
const char* const kNoEval = "eval: {at_end: false, every_epochs: 0}\n";

// bf16 activations round each stored value to 8 significant bits: the loss stays within a few
// percent over these few steps, where a broken layer or a lost gradient is far off.
TEST(GpuTrainer, CudaBf16FollowsCpuOnOneAndTwoRanks) { expect_matches_cpu("cuda-bf16", 5e-2, kNoEval); }

// fp16 (11 significant bits) with a static loss scale that cannot overflow this small network's
// gradients, so that no step is skipped and every step's loss has a CPU counterpart.
TEST(GpuTrainer, CudaFp16FollowsCpuOnOneAndTwoRanks) {
  expect_matches_cpu("cuda-fp16", 2e-2, std::string(kNoEval) + "loss_scale: {mode: static, init: 128}\n");
}

// model.bn_group (0: all ranks): on 2 ranks every batch norm normalises over both ranks' batches,
// its sums added through the host as the CPU backends add them (on 1 rank the group is the rank
// alone); fp32 (our batch norm in place of cuDNN's) and fp16 as above. Over these few steps the
// losses with and without the group's sums are close; the running statistics tell: every rank
// normalised with the group's, so each rank's own (kept apart in the checkpoint's "bn_ranks") are
// the same bits on both ranks, on the device as on the CPU, where ranks of their own batches part
// at once.
TEST(GpuTrainer, SynchronisedBatchNormFollowsCpu) {
  RT_REQUIRE_GPU();
  const char* const group = "--set model.bn_group=0";
  expect_matches_cpu("cuda", kFp32Tol, kNoEval, group);
  expect_matches_cpu("cuda-fp16", 2e-2, std::string(kNoEval) + "loss_scale: {mode: static, init: 128}\n", group);
  for (const std::string backend : {"cuda", "cuda-fp16", RT_CPU_BACKEND}) {
    const auto files = rt::trainer::checkpoint_list(run_dir(backend + "_np2") + "/checkpoints");
    ASSERT_FALSE(files.empty()) << backend;
    const rt::trainer::Checkpoint ck = rt::trainer::checkpoint_read(files.front());
    const size_t n = ck.state.size();
    ASSERT_EQ(ck.rank_state.size(), 2 * n) << backend;
    EXPECT_TRUE(std::equal(ck.rank_state.begin(), ck.rank_state.begin() + long(n), ck.rank_state.begin() + long(n)))
        << backend << ": the two ranks' running statistics differ";
  }
}

// Mixup and CutMix (either per batch): the 8-bit batches (both runs take them here, so both mix
// the same bytes) are mixed before the device's copy of the prefetched next batch is queued, so
// the device trains on the images the CPU does; the loss's blended targets come from the same
// draws.
TEST(GpuTrainer, MixupMatchesCpu) {
  expect_matches_cpu("cuda", kFp32Tol, kNoEval, "--set train.mixup=0.4 --set train.cutmix=1 --set data.output=u8");
}

// BCE (ResNet strikes back's loss) on blended targets made 0 or 1 by a threshold: the device's
// sigmoid loss and its gradient, mean over batch and classes, give the CPU run's losses.
TEST(GpuTrainer, BceMatchesCpu) {
  expect_matches_cpu("cuda", kFp32Tol, kNoEval,
                     "--set train.loss=bce --set train.bce_threshold=0.2 --set train.mixup=0.4 --set data.output=u8");
}

// Stochastic depth: the device draws no masks of its own; the host's (a function of seed, step,
// pass and rank) scale the same samples' branches, so the losses are the CPU run's.
TEST(GpuTrainer, DropPathMatchesCpu) {
  expect_matches_cpu("cuda", kFp32Tol, kNoEval, "--set model.drop_path=0.5");
}

// A frozen stem whose batch norms keep their statistics (optimizer.freeze_bn_stats): the device's
// inference-mode batch norms in training; in bf16 also those fused with their residual add (whose
// gamma would be 0 with zero_init_residual, and the statistics then not matter).
TEST(GpuTrainer, FrozenStatisticsMatchCpu) {
  const char* flags = "--set 'optimizer.freeze=[conv1, bn1, layer1]' --set optimizer.freeze_bn_stats=true "
                      "--set model.zero_init_residual=false";
  expect_matches_cpu("cuda", kFp32Tol, kNoEval, flags);
  expect_matches_cpu("cuda-bf16", 5e-2, kNoEval, flags);
}

// LAMB (and so AdamW's moments) through the trainer: the device optimizer's second moment, its
// trust ratios and the staged gradients give the CPU run's losses.
TEST(GpuTrainer, LambMatchesCpu) {
  expect_matches_cpu("cuda", kFp32Tol, kNoEval, "--set optimizer.kind=lamb --set optimizer.lr=0.16");
}

// The direct path end to end (MPI reads the device buffers, our kernels reduce them there). It
// needs an MPI that takes device pointers, declared with RINGTRAIN_MPI_CUDA_AWARE=1 where the
// library cannot say so itself; on the emulator, whose device memory is host memory, any MPI does.
TEST(GpuTrainer, CudaDirectPathMatchesCpu) {
#ifdef RT_CUDA_EMULATOR
  setenv("RINGTRAIN_MPI_CUDA_AWARE", "1", 1);  // inherited by mpirun and its ranks
#endif
  const char* aware = std::getenv("RINGTRAIN_MPI_CUDA_AWARE");
  if (!aware || std::string(aware) != "1")
    GTEST_SKIP() << "comm.device_path: direct needs a CUDA-aware MPI; declare one with "
                    "RINGTRAIN_MPI_CUDA_AWARE=1 to run this";
  expect_matches_cpu("cuda", kFp32Tol, std::string(kNoEval) + "comm: {device_path: direct}\n");
}

// comm.algorithm nccl end to end: each bucket of device gradients reduced by ncclAllReduce. NCCL
// needs a GPU per rank, so on real hardware this takes 2 GPUs; the emulator gives each rank one.
bool nccl_runs_here(std::string* why) {
#if !defined(RT_TRAINER_HAS_NCCL)
  *why = "trainer_cuda was built without NCCL";
  return false;
#elif defined(RT_CUDA_EMULATOR)
  (void)why;
  return true;
#else
  if (rt::cuda::device_count() >= 2) return true;
  *why = "comm.algorithm nccl needs a GPU per rank: 2 GPUs for this test";
  return false;
#endif
}

TEST(GpuTrainer, NcclMatchesCpu) {
  RT_REQUIRE_GPU();
  if (std::string why; !nccl_runs_here(&why)) GTEST_SKIP() << why;
  expect_matches_cpu("cuda", kFp32Tol, std::string(kNoEval) + "comm: {algorithm: nccl}\n");
}

// A collective that fails inside NCCL (a lost peer connection, here the emulator's injected one on
// rank 1's third bucket) ends the job: that rank names the call and NCCL's reason, the others,
// left waiting in the collective, are taken down with it, and mpirun's status is not 0.
TEST(GpuTrainer, NcclFailureEndsTheJob) {
  RT_REQUIRE_GPU();
#ifndef RT_CUDA_EMULATOR
  GTEST_SKIP() << "injects a failure into NCCL, which only the emulator can (RT_EMU_NCCL_FAIL)";
#endif
  if (std::string why; !nccl_runs_here(&why)) GTEST_SKIP() << why;
  std::string out;
  EXPECT_NE(run_trainer("cuda", 2, &out, std::string(kNoEval) + "comm: {algorithm: nccl}\n",
                        "RT_EMU_NCCL_FAIL=1:3"), 0) << out;
  for (const char* want : {"ringtrain: rank 1", "ncclAllReduce (asynchronous)",
                           "remote process exited or there was a network error",
                           "the failure RT_EMU_NCCL_FAIL asked for"})
    EXPECT_NE(out.find(want), std::string::npos) << "no '" << want << "' in:\n" << out;
}

// A rank that never reaches a step's collective (debug.fault: stall) while the others wait in
// ncclAllReduce: the stall check names it and stops the job, as with our own allreduces.
TEST(GpuTrainer, NcclStallIsNamedAndStopsTheJob) {
  RT_REQUIRE_GPU();
  if (std::string why; !nccl_runs_here(&why)) GTEST_SKIP() << why;
  std::string out;
  EXPECT_NE(run_trainer("cuda", 2, &out,
                        std::string(kNoEval) + "comm: {algorithm: nccl, stall_warning_s: 1, stall_abort_s: 4}\n"
                                               "debug: {fault: stall, rank: 1, step: 3}\n"),
            0) << out;
  for (const char* want : {"warning: stall: rank(s) 1 of 2 have not reached the gradient allreduce of step 3",
                           "stopping the job (comm.stall_abort_s: 4.0 s)"})
    EXPECT_NE(out.find(want), std::string::npos) << "no '" << want << "' in:\n" << out;
}

// A model that does not fit the device: every rank stops with an error saying what was asked,
// what the device had free, and which key of which file to lower; nothing hangs. Only the
// emulator's device size can be set (RT_EMU_DEVICE_MIB): a real one would need a job too large
// to be worth its time here (tests/gpu/gpu_memory.cc checks the message on a real device).
// A static loss scale too large for fp16 overflows backward on every step, and does not back
// off: the diagnosis says the scale is the likely cause.
TEST(GpuTrainer, StaticLossScaleOverflowIsNamed) {
  RT_REQUIRE_GPU();
  std::string out;
  EXPECT_NE(run_trainer("cuda-fp16", 1, &out, "loss_scale: {mode: static, init: 1048576}\n"), 0) << out;
  for (const char* want : {"non-finite gradients at step 1", "they arose in backward (with the loss multiplied by "
                                                              "loss_scale.init ",
                           ", static: backward's values may pass the element type's range"})
    EXPECT_NE(out.find(want), std::string::npos) << "no '" << want << "' in:\n" << out;
}

TEST(GpuTrainer, OutOfDeviceMemoryNamesTheKeyToLower) {
  RT_REQUIRE_GPU();
#ifndef RT_CUDA_EMULATOR
  GTEST_SKIP() << "sets the device's size, which only the emulator can (RT_EMU_DEVICE_MIB)";
#endif
  std::string out;
  EXPECT_NE(run_trainer("cuda-bf16", 2, &out, "", "RT_EMU_DEVICE_MIB=1"), 0) << out;
  for (const char* want : {"ringtrain: rank ", "out of memory", " free of 1.00 MiB",
                           "resnet20 (model.width ", "with train.batch 8 per rank (", "job.yaml:",
                           "backend cuda-bf16 does not fit in memory: lower train.batch"})
    EXPECT_NE(out.find(want), std::string::npos) << "no '" << want << "' in:\n" << out;
}

// The newest checkpoint under `dir` (names are ckpt-<step, 10 digits>.rtck), or "".
std::string newest_checkpoint(const std::string& dir) {
  std::string newest;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir))
    if (f.path().extension() == ".rtck" &&
        f.path().filename().string() > std::filesystem::path(newest).filename().string())
      newest = f.path().string();
  return newest;
}

// The same floats, bit for bit.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The value of `key` in the last JSON record of `type` in `dir`'s metrics.jsonl (NaN if none).
double last_metric(const std::string& dir, const std::string& type, const std::string& key) {
  std::ifstream f(dir + "/metrics.jsonl");
  const std::regex re("\"type\":\"" + type + "\".*\"" + key + "\":([-0-9.eE+]+)");
  double value = std::nan("");
  for (std::string line; std::getline(f, line);)
    if (std::smatch m; std::regex_search(line, m, re)) value = std::stod(m[1]);
  return value;
}

// Evaluation at a side of its own (data.eval_image_size): a second network of the model on the
// device, set up for that input and forward only, takes the weights and the ranks' averaged
// statistics from training's; its validation loss must be the CPU's, in fp32 and in bf16. The
// device evaluates at a batch of its own too (eval.batch, a short last batch), which changes no
// figure.
TEST(GpuTrainer, EvaluationAtItsOwnSideMatchesCpu) {
  RT_REQUIRE_GPU();
  const std::string both = "--set data.eval_image_size=24 --set train.ema=0.5";
  std::string out_cpu;
  train(RT_CPU_BACKEND, 2, &out_cpu, "", both);
  for (const auto& [backend, tol] : {std::pair<std::string, double>{"cuda", kFp32Tol}, {"cuda-bf16", 5e-2}}) {
    std::string out_gpu;
    train(backend, 2, &out_gpu, "", both + " --set eval.batch=7");
    for (const char* key : {"val_loss", "ema_val_loss"}) {
      const double g = last_metric(run_dir(backend + "_np2"), "epoch", key);
      const double c = last_metric(run_dir(std::string(RT_CPU_BACKEND) + "_np2"), "epoch", key);
      ASSERT_FALSE(std::isnan(c)) << out_cpu;
      EXPECT_NEAR(g, c, tol * c) << backend << " " << key << "\n" << out_gpu;
    }
  }
}

// Deterministic and exactly resumable on the device: 2 ranks of AdamW in fp16 with dynamic loss
// scaling (its scale grows after 3 good steps, so at the stop it is part-way to growing) and
// cuda.deterministic (deterministic cuDNN algorithms chosen by heuristics, as timing could choose
// others next run; our kernels and the ring reduce in a fixed order). A run of 4 steps, and the
// same job stopped after step 2 and continued by --resume auto in a new process, must end in the
// same state bit for bit: in the final checkpoints, parameters, both moments, the ranks' own BN
// statistics and their average, the weights' moving average (train.ema, kept on the device),
// step, data position, loss scale and its good-step count. Only the resumed run evaluates at its
// end (the model, then its average), which must then have left the state alone. Its checkpoint,
// written from device memory, evaluated by the CPU backend must give the device's validation
// losses within fp16's tolerance.
TEST(GpuTrainer, DeterministicRunsEndInTheSameStateWhenResumed) {
  RT_REQUIRE_GPU();
  const std::string job = "cuda: {deterministic: true}\nloss_scale: {mode: dynamic, init: 1024, growth_interval: 3}\n"
                          "optimizer: {kind: adamw, lr: 0.32}\n";
  const std::string ema = " --set train.ema=0.9";
  const std::string no_eval = ema + " --set eval.every_epochs=0 --set eval.at_end=false";
  const std::string dir = run_dir("cuda-fp16_np2");
  std::string out;
  ASSERT_EQ(run_trainer("cuda-fp16", 2, &out, job, "", no_eval), 0) << out;
  const std::string whole = newest_checkpoint(dir);
  ASSERT_NE(whole.find("ckpt-0000000004.rtck"), std::string::npos) << "4 steps, a checkpoint at the end:\n" << out;
  const rt::trainer::Checkpoint want = rt::trainer::checkpoint_read(whole);
  ASSERT_EQ(run_trainer("cuda-fp16", 2, &out, job, "", no_eval + " --set train.steps=2"), 0) << out;
  ASSERT_NE(newest_checkpoint(dir).find("ckpt-0000000002.rtck"), std::string::npos) << out;
  ASSERT_EQ(run_trainer("cuda-fp16", 2, &out, job, "", "--resume auto" + ema, /*fresh=*/false), 0) << out;
  const std::string resumed = newest_checkpoint(dir);
  ASSERT_NE(resumed.find("ckpt-0000000004.rtck"), std::string::npos) << out;
  const rt::trainer::Checkpoint got = rt::trainer::checkpoint_read(resumed);
  const auto &a = want.meta, &b = got.meta;
  EXPECT_TRUE(b.step == a.step && b.position.epoch == a.position.epoch && b.position.step == a.position.step &&
              b.optimizer_steps == a.optimizer_steps)
      << "the resumed run ended at another step or data position";
  EXPECT_EQ(b.loss_scale, a.loss_scale);
  EXPECT_EQ(b.loss_scale_good, a.loss_scale_good);
  EXPECT_EQ(got.rank_state.size(), 2 * got.state.size()) << "each rank's own BN statistics";
  const std::string differs = " differ from the uninterrupted run's, in " + resumed;
  EXPECT_TRUE(same_bits(got.params, want.params)) << "parameters" << differs;
  EXPECT_TRUE(same_bits(got.momentum, want.momentum)) << "first moments" << differs;
  EXPECT_EQ(got.moment2.size(), got.params.size()) << "AdamW's second moment in " << resumed;
  EXPECT_TRUE(same_bits(got.moment2, want.moment2)) << "second moments" << differs;
  EXPECT_TRUE(same_bits(got.state, want.state)) << "averaged BN statistics" << differs;
  EXPECT_TRUE(same_bits(got.rank_state, want.rank_state)) << "the ranks' own BN statistics" << differs;
  EXPECT_FALSE(got.ema.empty()) << "no moving average in " << resumed;
  EXPECT_TRUE(same_bits(got.ema, want.ema)) << "the moving average" << differs;
  EXPECT_TRUE(same_bits(got.ema_rank_state, want.ema_rank_state)) << "the ranks' own averaged statistics" << differs;
  const double device_ema_loss = last_metric(dir, "epoch", "ema_val_loss");
  const double device_loss = last_metric(dir, "epoch", "val_loss");
  ASSERT_FALSE(std::isnan(device_loss)) << "the resumed run did not evaluate:\n" << out;
  ASSERT_EQ(run_trainer(RT_CPU_BACKEND, 2, &out, job, "", "--eval --checkpoint " + resumed), 0) << out;
  const std::string cpu_dir = run_dir(std::string(RT_CPU_BACKEND) + "_np2");
  const double cpu_loss = last_metric(cpu_dir, "eval", "val_loss");
  EXPECT_NEAR(cpu_loss, device_loss, 2e-2 + 2e-2 * device_loss) << "the CPU backend's evaluation of " << resumed;
  const double cpu_ema_loss = last_metric(cpu_dir, "eval", "ema_val_loss");
  EXPECT_NEAR(cpu_ema_loss, device_ema_loss, 2e-2 + 2e-2 * device_ema_loss) << "the average's, of " << resumed;
  EXPECT_NE(device_ema_loss, device_loss) << "the average evaluated as the model";
}

// cuda.algo_cache end to end: in the first run of a job the 2 ranks share a new file, each
// reading what the other appended so far and appending the rest of its timed choices as whole
// lines; the next run reads all 6 shapes' choices and chooses none. Each run's start record says
// which. ResNet-20's 19 convolutions have 6 shapes.
TEST(GpuTrainer, AlgorithmCacheServesTheNextRun) {
  RT_REQUIRE_GPU();
  const std::string file = run_dir("algos.tsv");
  std::filesystem::remove(file);
  auto file_lines = [&] {
    std::ifstream in(file);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);)
      if (line.rfind("#", 0) != 0) lines.push_back(line);
    return lines;
  };
  std::vector<std::string> first;
  for (int run = 0; run < 2; ++run) {
    std::string out;
    ASSERT_EQ(run_trainer("cuda-bf16", 2, &out, "cuda: {algo_cache: " + file + "}\n"), 0) << out;
    std::ifstream metrics(run_dir("cuda-bf16_np2") + "/metrics.jsonl");
    std::string start;
    std::getline(metrics, start);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(start, m, std::regex("\"setup\":\"cuDNN convolution algorithms timed: "
                                                       "6 convolution shapes for 19 layers; ([0-9]) choices? "
                                                       "read from ([^,]+), ([0-9]) added to it\"")))
        << start;
    EXPECT_EQ(m[2], file);
    const int read = std::stoi(m[1]), added = std::stoi(m[3]);
    EXPECT_EQ(read + added, 6);
    if (run == 1) {
      EXPECT_EQ(read, 6);
    }
    const auto lines = file_lines();
    if (run == 0) {
      first = lines;
      EXPECT_GE(lines.size(), 6u);  // each shape once, or twice when both ranks chose it
      EXPECT_LE(lines.size(), 12u);
      std::set<std::string> shapes;
      for (const auto& line : lines) {
        EXPECT_TRUE(std::regex_match(line, std::regex("[^\t]+\t[^\t]+\t[0-9]+( [0-9]+){5}"))) << line;
        shapes.insert(line.substr(0, line.rfind('\t')));
      }
      EXPECT_EQ(shapes.size(), 6u);
    } else {
      EXPECT_EQ(lines, first);  // nothing appended
    }
  }
}

// cuda.workspace_mib reaches the convolutions: the emulated cuDNN offers one algorithm, needing
// 4 KiB, so none fits in 0 and the job stops naming the layer. (A real cuDNN has algorithms that
// need no workspace, which the job would take.)
TEST(GpuTrainer, WorkspaceLimitReachesTheConvolutions) {
  RT_REQUIRE_GPU();
#ifndef RT_CUDA_EMULATOR
  GTEST_SKIP() << "needs the emulated cuDNN, whose every algorithm needs workspace";
#endif
  std::string out;
  EXPECT_NE(run_trainer("cuda", 1, &out, "cuda: {workspace_mib: 0}\n"), 0) << out;
  EXPECT_NE(out.find("fits a workspace of 0 bytes"), std::string::npos) << out;
  EXPECT_NE(out.find("layer conv1"), std::string::npos) << out;
}

}  // namespace

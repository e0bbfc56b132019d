// The trainer program on `backend: cuda` under mpirun, 1 and 2 ranks on one GPU, against the
// same job on a CPU backend (RT_CPU_BACKEND: oneDNN, or the reference in GPU-only builds): each run must finish, and the loss of every step must agree
// within float tolerance (same synthetic data, same initialisation; the averaged gradients cross
// the ring allreduce through the reducer's device hooks, the arena being device memory).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

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
// `extra`: more YAML lines for the job; `env`: variables set for mpirun and its ranks.
int run_trainer(const std::string& backend, int np, std::string* out, const std::string& extra = "",
                const std::string& env = "") {
  const std::string dir = run_dir(backend + "_np" + std::to_string(np));
  std::filesystem::remove_all(dir);
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
  const std::string cmd = env + " " + RT_MPIEXEC + " -np " + std::to_string(np) +
                          " --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " RT_TRAINER_BIN
                          " --config " + dir + "/job.yaml 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out->append(buf, n);
  return pclose(p);
}

// Runs the trainer, which must succeed, and returns rank 0's loss per step from its metrics file.
std::map<long, double> train(const std::string& backend, int np, std::string* out,
                             const std::string& extra = "") {
  EXPECT_EQ(run_trainer(backend, np, out, extra), 0) << *out;
  const std::string dir = run_dir(backend + "_np" + std::to_string(np));
  std::map<long, double> loss;
  std::ifstream f(dir + "/metrics.jsonl");
  const std::regex step_re("\"type\":\"step\".*\"step\":([0-9]+).*\"loss\":([-0-9.eE+]+)");
  for (std::string line; std::getline(f, line);) {
    std::smatch m;
    if (std::regex_search(line, m, step_re)) loss[std::stol(m[1])] = std::stod(m[2]);
  }
  return loss;
}

// Trains with `backend` on the GPU and with RT_CPU_BACKEND on 1 and 2 ranks: rank 0's loss of every
// step must agree within tol + tol * |loss|.
void expect_matches_cpu(const std::string& backend, double tol, const std::string& extra = "") {
  RT_REQUIRE_GPU();
  for (int np : {1, 2}) {
    std::string out_gpu, out_cpu;
    const auto gpu = train(backend, np, &out_gpu, extra), cpu = train(RT_CPU_BACKEND, np, &out_cpu);
    // Ranks beyond the node's GPUs share them, and the job says so once.
    const size_t notes = count(out_gpu, "ranks on this node share its");
    EXPECT_EQ(notes, rt::cuda::device_count() < np ? 1u : 0u) << out_gpu;
    ASSERT_FALSE(cpu.empty()) << out_cpu;
    ASSERT_EQ(gpu.size(), cpu.size()) << out_gpu;
    for (const auto& [step, l] : cpu) {
      ASSERT_TRUE(gpu.count(step)) << "step " << step;
      EXPECT_NEAR(gpu.at(step), l, tol + tol * std::fabs(l)) << backend << " np " << np << " step " << step;
    }
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
// compare training steps only and skip it, which on the emulator is a fifth of a run.
TEST(GpuTrainer, CudaMatchesCpuOnOneAndTwoRanks) { expect_matches_cpu("cuda", kFp32Tol); }
const char* const kNoEval = "eval: {at_end: false, every_epochs: 0}\n";

// bf16 activations round each stored value to 8 significant bits: the loss stays within a few
// percent over these few steps, where a broken layer or a lost gradient is far off.
TEST(GpuTrainer, CudaBf16FollowsCpuOnOneAndTwoRanks) { expect_matches_cpu("cuda-bf16", 5e-2, kNoEval); }

// fp16 (11 significant bits) with a static loss scale that cannot overflow this small network's
// gradients, so that no step is skipped and every step's loss has a CPU counterpart.
TEST(GpuTrainer, CudaFp16FollowsCpuOnOneAndTwoRanks) {
  expect_matches_cpu("cuda-fp16", 2e-2, std::string(kNoEval) + "loss_scale: {mode: static, init: 128}\n");
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

// A model that does not fit the device: every rank stops with an error saying what was asked,
// what the device had free, and which key of which file to lower; nothing hangs. Only the
// emulator's device size can be set (RT_EMU_DEVICE_MIB): a real one would need a job too large
// to be worth its time here (tests/gpu/gpu_memory.cc checks the message on a real device).
TEST(GpuTrainer, OutOfDeviceMemoryNamesTheKeyToLower) {
  RT_REQUIRE_GPU();
#ifndef RT_CUDA_EMULATOR
  GTEST_SKIP() << "sets the device's size, which only the emulator can (RT_EMU_DEVICE_MIB)";
#endif
  std::string out;
  EXPECT_NE(run_trainer("cuda-bf16", 2, &out, "", "RT_EMU_DEVICE_MIB=1"), 0) << out;
  for (const char* want : {"ringtrain: rank ", "out of memory", " free of 1.00 MiB",
                           "job.yaml: resnet20 with train.batch 8 per rank",
                           "backend cuda-bf16 does not fit in memory: lower train.batch"})
    EXPECT_NE(out.find(want), std::string::npos) << "no '" << want << "' in:\n" << out;
}

// cuda.deterministic: two runs of one job (2 ranks, bf16) end in the same checkpoint, bit for bit:
// parameters, BN statistics and momentum. Deterministic cuDNN algorithms chosen by heuristics
// (timing could choose others next run); our kernels and the ring reduce in a fixed order.
TEST(GpuTrainer, DeterministicRunsEndInTheSameCheckpoint) {
  RT_REQUIRE_GPU();
  std::string first;
  for (int run = 0; run < 2; ++run) {
    std::string out;
    ASSERT_EQ(run_trainer("cuda-bf16", 2, &out, "cuda: {deterministic: true}\ncheckpoint: {at_epoch_end: true}\n"),
              0) << out;
    std::string ckpt;  // the run folder is the same for both runs, so is the checkpoint's text
    for (const auto& f : std::filesystem::recursive_directory_iterator(run_dir("cuda-bf16_np2")))
      if (f.path().extension() == ".rtck") ckpt = f.path().string();
    ASSERT_FALSE(ckpt.empty()) << "no checkpoint written:\n" << out;
    std::ifstream in(ckpt, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 100000u) << ckpt;
    if (run == 0) first = bytes;
    else EXPECT_TRUE(bytes == first) << "run 2 ended in another checkpoint than run 1 (" << ckpt << ")";
  }
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

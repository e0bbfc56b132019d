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
#include <map>
#include <regex>
#include <string>

#include "tests/gpu/gpu_test_util.h"

namespace {

// One folder per test and run: ctest may run these tests at the same time, and two runs of one
// backend (the CPU reference of every test, "cuda" of two) must not share one.
std::string run_dir(const std::string& tag) {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  return (std::filesystem::temp_directory_path() / ("rt_gpu_trainer_" + test + "_" + tag)).string();
}

// Runs the trainer and returns rank 0's loss per step from its metrics file.
// `extra`: more YAML lines for the job.
std::map<long, double> train(const std::string& backend, int np, std::string* out,
                             const std::string& extra = "") {
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
  const std::string cmd = std::string(RT_MPIEXEC) + " -np " + std::to_string(np) +
                          " --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " RT_TRAINER_BIN
                          " --config " + dir + "/job.yaml 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out->append(buf, n);
  EXPECT_EQ(pclose(p), 0) << cmd << "\n" << *out;
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
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);  // GPU machines often run their jobs as root
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  for (int np : {1, 2}) {
    std::string out_gpu, out_cpu;
    const auto gpu = train(backend, np, &out_gpu, extra), cpu = train(RT_CPU_BACKEND, np, &out_cpu);
    ASSERT_FALSE(cpu.empty()) << out_cpu;
    ASSERT_EQ(gpu.size(), cpu.size()) << out_gpu;
    for (const auto& [step, l] : cpu) {
      ASSERT_TRUE(gpu.count(step)) << "step " << step;
      EXPECT_NEAR(gpu.at(step), l, tol + tol * std::fabs(l)) << backend << " np " << np << " step " << step;
    }
  }
}

TEST(GpuTrainer, CudaMatchesCpuOnOneAndTwoRanks) { expect_matches_cpu("cuda", 1e-3); }

// bf16 activations round each stored value to 8 significant bits: the loss stays within a few
// percent over these few steps, where a broken layer or a lost gradient is far off.
TEST(GpuTrainer, CudaBf16FollowsCpuOnOneAndTwoRanks) { expect_matches_cpu("cuda-bf16", 5e-2); }

// fp16 (11 significant bits) with a static loss scale that cannot overflow this small network's
// gradients, so that no step is skipped and every step's loss has a CPU counterpart.
TEST(GpuTrainer, CudaFp16FollowsCpuOnOneAndTwoRanks) {
  expect_matches_cpu("cuda-fp16", 2e-2, "loss_scale: {mode: static, init: 128}\n");
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
  expect_matches_cpu("cuda", 1e-3, "comm: {device_path: direct}\n");
}

}  // namespace

// Runs tests/gpu/mpi/gpu_mpi_device_grads.cc under `mpirun -np 2` on this machine's GPU, once
// per device path; that program checks the averages and allocations and says why it skips.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/gpu/gpu_test_util.h"

namespace {

// Runs the program on `path`; returns its exit status and fills *out with its output.
int run_program(const std::string& path, std::string* out) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);  // GPU machines often run their jobs as root
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  // Appended piece by piece: GCC 12 warns falsely (-Warray-bounds) on string(literal) + literal.
  std::string cmd = RT_MPIEXEC;
  cmd += " -np 2 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " RT_MPI_DEVICE_GRADS_BIN " ";
  cmd += path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out->append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// The program's "SKIP: ..." line, or "".
std::string skip_reason(const std::string& out) {
  const size_t at = out.find("SKIP: ");
  return at == std::string::npos ? "" : out.substr(at + 6, out.find('\n', at) - at - 6);
}

void run_path(const std::string& path) {
  std::string out;
  const int rc = run_program(path, &out);
  const std::string why = skip_reason(out);
  if (!why.empty()) GTEST_SKIP() << path << ": " << why;
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("passed with 2 ranks"), std::string::npos) << out;
}

TEST(GpuDeviceGradsMpi, StagedRingOnOneGpu) {
  RT_REQUIRE_GPU();
  run_path("staged");
}

// Skips, saying so, where MPI is not CUDA-aware.
TEST(GpuDeviceGradsMpi, DirectRingOnOneGpu) {
  RT_REQUIRE_GPU();
  run_path("direct");
}

}  // namespace

// The nccl allreducer's host side, which needs the CUDA and NCCL libraries but no GPU: NCCL_CHECK's
// message, make_allreducer("nccl") once register_nccl_allreducer() has run (without a device
// the error gives the runtime's reason), and the refusal of two ranks on one GPU.
#include <gtest/gtest.h>

#include <string>

#include "comm/mpi_check.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/nccl_allreducer.h"
#include "tests/error_of.h"
#include "tests/gtest_mpi.h"

namespace rt::cuda {
namespace {

using rt_test::error_of;

ncclResult_t fail_nccl() { return ncclInvalidArgument; }

TEST(NcclCheck, ErrorNamesPlaceCallAndReason) {
  const std::string m = error_of([] { NCCL_CHECK(fail_nccl()); });
  EXPECT_NE(m.find("test_nccl_host.cc:"), std::string::npos) << m;
  EXPECT_NE(m.find("fail_nccl()"), std::string::npos) << m;
  EXPECT_NE(m.find(ncclGetErrorString(ncclInvalidArgument)), std::string::npos) << m;
  EXPECT_EQ(error_of([] { NCCL_CHECK(ncclSuccess); }), "");
}

TEST(NcclRegistration, MakeAllreducerBuildsNcclOrSaysWhyNot) {
  register_nccl_allreducer();
  comm::Communicator comm(MPI_COMM_SELF);
  comm::CommConfig cfg;
  cfg.algorithm = "nccl";
  std::string why;
  if (device_count(&why) == 0) {
    const std::string m = error_of([&] { comm::make_allreducer(cfg, comm); });
    EXPECT_NE(m.find("allreduce 'nccl': no usable CUDA device: " + why), std::string::npos) << m;
  } else {
    EXPECT_STREQ(comm::make_allreducer(cfg, comm)->name(), "nccl");
  }
}

// Two ranks of one NCCL communicator on one GPU: refused up front, naming both ranks and the GPU.
TEST(NcclSharedGpu, TwoRanksOnOneGpuAreNamed) {
  EXPECT_EQ(nccl_shared_gpu_error({}), "");
  EXPECT_EQ(nccl_shared_gpu_error({"a/0000:1B:00.0", "a/0000:1C:00.0", "b/0000:1B:00.0"}), "");
  const std::string m =
      nccl_shared_gpu_error({"a/0000:1B:00.0", "a/0000:1C:00.0", "b/0000:1B:00.0", "a/0000:1C:00.0"});
  EXPECT_NE(m.find("ranks 1 and 3 would share GPU a/0000:1C:00.0"), std::string::npos) << m;
  EXPECT_NE(m.find("comm.algorithm ring"), std::string::npos) << m;
}

}  // namespace
}  // namespace rt::cuda

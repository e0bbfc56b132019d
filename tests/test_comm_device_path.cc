// comm.device_path: what auto, staged and direct resolve to with and without a CUDA-aware MPI
// (the library's answer is passed in, so no MPI runs here) and with nccl, the error for direct
// without one, the environment's override of the answer, and the trainer's key (default,
// parsing, validation, printing).
#include <gtest/gtest.h>

#include <string>

#include "comm/cuda_aware.h"
#include "comm/mpi_check.h"
#include "trainer/config.h"

namespace rt::comm {
namespace {

const CudaAwareness kAware{true, "test: aware"};
const CudaAwareness kNotAware{false, "mpi-ext.h MPIX_CUDA_AWARE_SUPPORT 0, MPIX_Query_cuda_support() 0"};

DevicePath resolve(const std::string& setting, const CudaAwareness& mpi, const std::string& algorithm = "ring") {
  CommConfig cfg;
  cfg.device_path = setting;
  cfg.algorithm = algorithm;
  return resolve_device_path(cfg, mpi);
}

TEST(comm_device_path, AutoFollowsTheLibrary) {
  EXPECT_EQ(resolve("auto", kAware), DevicePath::direct);
  EXPECT_EQ(resolve("auto", kNotAware), DevicePath::staged);
}

TEST(comm_device_path, StagedWorksWithAnyLibrary) {
  EXPECT_EQ(resolve("staged", kAware), DevicePath::staged);
  EXPECT_EQ(resolve("staged", kNotAware), DevicePath::staged);
}

TEST(comm_device_path, DirectNeedsCudaAwareMpi) {
  EXPECT_EQ(resolve("direct", kAware), DevicePath::direct);
  try {
    resolve("direct", kNotAware);
    FAIL() << "direct without a CUDA-aware MPI was accepted";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("comm.device_path: direct needs an MPI that takes device pointers"), std::string::npos) << m;
    EXPECT_NE(m.find("MPIX_CUDA_AWARE_SUPPORT 0"), std::string::npos) << m;  // what the library said
    EXPECT_NE(m.find("use staged or auto"), std::string::npos) << m;
  }
}

TEST(comm_device_path, EnvironmentOverridesTheLibrarysAnswer) {
  EXPECT_FALSE(cuda_aware_override(kNotAware, nullptr).aware);  // unset: the library's answer
  EXPECT_TRUE(cuda_aware_override(kAware, nullptr).aware);
  const CudaAwareness on = cuda_aware_override(kNotAware, "1");
  EXPECT_TRUE(on.aware);
  EXPECT_NE(on.detail.find("RINGTRAIN_MPI_CUDA_AWARE=1"), std::string::npos) << on.detail;
  EXPECT_NE(on.detail.find("MPIX_CUDA_AWARE_SUPPORT 0"), std::string::npos) << on.detail;
  EXPECT_EQ(resolve("direct", on), DevicePath::direct);
  const CudaAwareness off = cuda_aware_override(kAware, "0");
  EXPECT_FALSE(off.aware);
  EXPECT_EQ(resolve("auto", off), DevicePath::staged);
  for (const char* bad : {"", "yes", "2"}) {
    try {
      cuda_aware_override(kAware, bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("RINGTRAIN_MPI_CUDA_AWARE: '"), std::string::npos) << e.what();
    }
  }
}

// NCCL moves device memory itself: no CUDA-aware MPI needed, and no host mirror possible.
TEST(comm_device_path, NcclIsAlwaysDirect) {
  for (const CudaAwareness& mpi : {kAware, kNotAware}) {
    EXPECT_EQ(resolve("auto", mpi, "nccl"), DevicePath::direct);
    EXPECT_EQ(resolve("direct", mpi, "nccl"), DevicePath::direct);
    try {
      resolve("staged", mpi, "nccl");
      FAIL() << "staged with nccl accepted";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("comm.device_path: staged cannot be used with comm.algorithm nccl"),
                std::string::npos) << e.what();
    }
  }
}

TEST(comm_device_path, UnknownValueNamesTheKey) {
  for (const char* bad : {"", "Direct", "host", "staged "}) {
    try {
      resolve(bad, kAware);
      FAIL() << "accepted '" << bad << "'";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("comm.device_path: unknown value"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(device_path_names(), (std::vector<std::string>{"auto", "staged", "direct"}));
  EXPECT_STREQ(device_path_name(DevicePath::direct), "direct");
  EXPECT_STREQ(device_path_name(DevicePath::staged), "staged");
}

TEST(comm_device_path, TrainerKey) {
  using trainer::config_parse;
  EXPECT_EQ(CommConfig{}.device_path, "auto");
  EXPECT_EQ(config_parse("", "d.yaml").comm.device_path, "auto");
  for (const std::string& v : device_path_names()) {
    const trainer::Config c = config_parse("data: {synthetic: true}\ncomm: {device_path: " + v + "}\n", "d.yaml");
    EXPECT_EQ(c.comm.device_path, v);
    EXPECT_NO_THROW(trainer::config_validate(c)) << v;
    EXPECT_NE(trainer::config_to_yaml(c).find("device_path: " + v), std::string::npos) << v;
  }
  try {
    trainer::config_validate(
        config_parse("data: {synthetic: true}\nbackend: cuda\ncomm: {algorithm: nccl, device_path: staged}\n", "n.yaml"));
    FAIL() << "nccl with staged accepted";
  } catch (const trainer::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n.yaml:3: key 'comm.device_path' staged cannot be used with comm.algorithm nccl"),
              std::string::npos) << e.what();
  }
  try {
    trainer::config_validate(config_parse("data: {synthetic: true}\ncomm: {device_path: nvlink}\n", "d.yaml"));
    FAIL() << "comm.device_path nvlink accepted";
  } catch (const trainer::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("d.yaml:2: key 'comm.device_path' must be auto, staged or direct (got nvlink)"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rt::comm

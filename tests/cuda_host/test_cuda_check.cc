// The CUDA backend's error reporting and allocation accounting, on the host: needs the CUDA
// libraries (error strings are lookups), not a GPU.
#include <gtest/gtest.h>

#include <string>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/device.h"
#include "cuda/memory.h"
#include "tests/error_of.h"

namespace rt::cuda {
namespace {

using rt_test::error_of;

cudaError_t fail_runtime() { return cudaErrorInvalidValue; }
cudnnStatus_t fail_cudnn() { return CUDNN_STATUS_BAD_PARAM; }
cublasStatus_t fail_cublas() { return CUBLAS_STATUS_INVALID_VALUE; }

TEST(CudaCheck, RuntimeErrorNamesPlaceCallAndReason) {
  const std::string m = error_of([] { CUDA_CHECK(fail_runtime()); });
  EXPECT_NE(m.find("test_cuda_check.cc:"), std::string::npos) << m;
  EXPECT_NE(m.find("fail_runtime()"), std::string::npos) << m;
  EXPECT_NE(m.find("cudaErrorInvalidValue"), std::string::npos) << m;
  EXPECT_NE(m.find(cudaGetErrorString(cudaErrorInvalidValue)), std::string::npos) << m;
  EXPECT_EQ(error_of([] { CUDA_CHECK(cudaSuccess); }), "");
}

TEST(CudaCheck, CudnnErrorNamesPlaceCallAndReason) {
  const std::string m = error_of([] { CUDNN_CHECK(fail_cudnn()); });
  EXPECT_NE(m.find("test_cuda_check.cc:"), std::string::npos) << m;
  EXPECT_NE(m.find("fail_cudnn()"), std::string::npos) << m;
  EXPECT_NE(m.find("CUDNN_STATUS_BAD_PARAM"), std::string::npos) << m;
  EXPECT_EQ(error_of([] { CUDNN_CHECK(CUDNN_STATUS_SUCCESS); }), "");
}

TEST(CudaCheck, CublasErrorNamesPlaceCallAndReason) {
  const std::string m = error_of([] { CUBLAS_CHECK(fail_cublas()); });
  EXPECT_NE(m.find("test_cuda_check.cc:"), std::string::npos) << m;
  EXPECT_NE(m.find("fail_cublas()"), std::string::npos) << m;
  EXPECT_NE(m.find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << m;
  EXPECT_EQ(error_of([] { CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS); }), "");
}

// A library saying an allocation failed is rt::OutOfMemory (the trainer then names the setting to
// lower); any other failure is a plain rt::Error.
template <class F>
bool throws_out_of_memory(F f) {
  try {
    f();
  } catch (const OutOfMemory&) {
    return true;
  } catch (const Error&) {
  }
  return false;
}

cudaError_t oom_runtime() { return cudaErrorMemoryAllocation; }
cudnnStatus_t oom_cudnn_device() { return CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED; }
cudnnStatus_t oom_cudnn_host() { return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED; }
cublasStatus_t oom_cublas() { return CUBLAS_STATUS_ALLOC_FAILED; }

TEST(CudaCheck, AllocationFailuresAreOutOfMemory) {
  EXPECT_TRUE(throws_out_of_memory([] { CUDA_CHECK(oom_runtime()); }));
  EXPECT_TRUE(throws_out_of_memory([] { CUDNN_CHECK(oom_cudnn_device()); }));
  EXPECT_TRUE(throws_out_of_memory([] { CUDNN_CHECK(oom_cudnn_host()); }));
  EXPECT_TRUE(throws_out_of_memory([] { CUBLAS_CHECK(oom_cublas()); }));
  EXPECT_FALSE(throws_out_of_memory([] { CUDA_CHECK(fail_runtime()); }));
  EXPECT_FALSE(throws_out_of_memory([] { CUDNN_CHECK(fail_cudnn()); }));
  EXPECT_FALSE(throws_out_of_memory([] { CUBLAS_CHECK(fail_cublas()); }));
  const std::string m = error_of([] { CUDA_CHECK(oom_runtime()); });
  EXPECT_NE(m.find("oom_runtime()"), std::string::npos) << m;
  EXPECT_NE(m.find("cudaErrorMemoryAllocation"), std::string::npos) << m;
}

TEST(CudaCheck, LaunchErrorIsReportedAtTheLaunch) {
  const std::string m = error_of([] {
    cudaError_t e = cudaErrorInvalidConfiguration;
    if (e != cudaSuccess) ::rt::cuda::throw_cuda_error(__FILE__, __LINE__, "kernel launch", e);
  });
  EXPECT_NE(m.find("kernel launch"), std::string::npos) << m;
  EXPECT_NE(m.find("cudaErrorInvalidConfiguration"), std::string::npos) << m;
}

TEST(CudaMemory, ZeroBytesAllocateNothing) {
  const AllocStats before = alloc_stats();
  EXPECT_EQ(device_malloc(0), nullptr);
  EXPECT_EQ(pinned_malloc(0), nullptr);
  device_free(nullptr, 0);
  DeviceBuffer empty;
  EXPECT_EQ(empty.get(), nullptr);
  const AllocStats after = alloc_stats();
  EXPECT_EQ(after.device_allocs, before.device_allocs);
  EXPECT_EQ(after.pinned_allocs, before.pinned_allocs);
}

TEST(CudaMemory, WithoutADeviceAllocationFailsWithAClearError) {
  std::string why;
  if (device_count(&why) > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_FALSE(why.empty());
  const std::string m = error_of([] { DeviceBuffer b(1024); });
  EXPECT_NE(m.find("cudaMalloc of 1024 bytes failed"), std::string::npos) << m;
  EXPECT_EQ(alloc_stats().device_bytes, 0);
}

// A cuDNN built for another CUDA major version than the runtime is named with its file and both
// versions; a minor difference, or an unknown runtime, says nothing.
TEST(CudaContextHost, CudnnForAnotherCudaIsNamed) {
  EXPECT_EQ(cudnn_cuda_mismatch(91300, 13000, 13000, "/usr/local/cuda/lib64/libcudnn.so.9"), "");
  EXPECT_EQ(cudnn_cuda_mismatch(91300, 13000, 13010, ""), "");
  EXPECT_EQ(cudnn_cuda_mismatch(91300, 12080, 0, ""), "");
  const std::string m = cudnn_cuda_mismatch(90800, 12080, 13000, "/w/nvidia/cudnn/lib/libcudnn.so.9");
  for (const char* want : {"warning: cuDNN 9.8.0 (/w/nvidia/cudnn/lib/libcudnn.so.9) was built for CUDA 12.8",
                           "this program runs CUDA 13.0", "a cuDNN 9 for CUDA 13"})
    EXPECT_NE(m.find(want), std::string::npos) << "no '" << want << "' in: " << m;
}

}  // namespace
}  // namespace rt::cuda

// make_backend<float>("cuda"), "cuda-tf32", "cuda-bf16" and "cuda-fp16" before and after
// rt::cuda::register_backend(): without a device the error names the backend and gives the
// runtime's reason.
#include <gtest/gtest.h>

#include <string>

#include "cuda/backend.h"
#include "cuda/device.h"

namespace rt::cuda {
namespace {

std::string error_of(const std::string& name) {
  try {
    make_backend<float>(name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaBackendRegistry, UnregisteredThenRegistered) {
  const char* names[] = {"cuda", "cuda-tf32", "cuda-bf16", "cuda-fp16"};
  for (const char* n : names)
    EXPECT_NE(error_of(n).find("rt::cuda::register_backend()"), std::string::npos) << n;
  register_backend();
  register_backend();  // harmless twice
  std::string why;
  for (const std::string n : names) {
    const std::string family = n == "cuda-tf32" ? "cuda" : n;  // cuda-tf32 is the cuda backend
    if (device_count(&why) == 0) {
      const std::string m = error_of(n);
      EXPECT_NE(m.find("backend '" + family + "': no usable CUDA device: " + why), std::string::npos) << m;
    } else {
      EXPECT_EQ(make_backend<float>(n)->name(), family);
    }
  }
}

}  // namespace
}  // namespace rt::cuda

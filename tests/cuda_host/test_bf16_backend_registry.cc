// make_backend<float>("cuda-bf16") before and after rt::cuda::register_backend(): without a
// device the error names the backend and gives the runtime's reason.
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

TEST(Bf16BackendRegistry, UnregisteredThenRegistered) {
  EXPECT_NE(error_of("cuda-bf16").find("rt::cuda::register_backend()"), std::string::npos);
  register_backend();
  std::string why;
  if (device_count(&why) == 0) {
    const std::string m = error_of("cuda-bf16");
    EXPECT_NE(m.find("backend 'cuda-bf16': no usable CUDA device: " + why), std::string::npos) << m;
  } else {
    EXPECT_EQ(make_backend<float>("cuda-bf16")->name(), "cuda-bf16");
  }
}

}  // namespace
}  // namespace rt::cuda

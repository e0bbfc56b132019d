// make_backend<float>("cuda") before and after rt::cuda::register_backend(): without a device
// the error names the backend and gives the runtime's reason.
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
  EXPECT_NE(error_of("cuda").find("rt::cuda::register_backend()"), std::string::npos);
  register_backend();
  register_backend();  // harmless twice
  std::string why;
  if (device_count(&why) == 0) {
    const std::string m = error_of("cuda");
    EXPECT_NE(m.find("backend 'cuda': no usable CUDA device: " + why), std::string::npos) << m;
  } else {
    EXPECT_EQ(make_backend<float>("cuda")->name(), "cuda");
  }
}

}  // namespace
}  // namespace rt::cuda

// Shared by the GPU tests: skip (saying why) without a device; host <-> device vector copies.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/memory.h"
#include "nn/tensor.h"

// Skips the current test when no CUDA device can be used, with the runtime's reason.
#define RT_REQUIRE_GPU()                                                        \
  do {                                                                          \
    std::string rt_why_;                                                        \
    if (::rt::cuda::device_count(&rt_why_) == 0)                                \
      GTEST_SKIP() << "no CUDA device: " << rt_why_;                            \
  } while (0)

namespace rt::cuda::test {

template <class T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <class T>
std::vector<T> to_host(const DeviceBuffer& b, size_t n, size_t offset_elems = 0) {
  std::vector<T> v(n);
  b.download(v.data(), n * sizeof(T), offset_elems * sizeof(T));
  return v;
}

}  // namespace rt::cuda::test

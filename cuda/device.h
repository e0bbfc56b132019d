// GPU discovery, and the reason a GPU cannot be used (for tests that must skip and say why).
#pragma once
#include <string>

namespace rt::cuda {

// Number of usable CUDA devices; 0 (with why_not filled) when there is no driver or device.
int device_count(std::string* why_not = nullptr);

// Fills y[i] = a * x[i] + y[i] on the device: a smoke test that the toolchain's code runs.
void saxpy_host(int n, float a, const float* x, float* y);

}  // namespace rt::cuda

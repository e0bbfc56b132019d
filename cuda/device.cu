// GPU discovery and a minimal kernel proving the build targets run on the device.
#include "cuda/check.h"
#include "cuda/device.h"

namespace rt::cuda {

int device_count(std::string* why_not) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why_not) *why_not = cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error so later checks start clean
    return 0;
  }
  if (n == 0 && why_not) *why_not = "no CUDA device present";
  return n;
}

__global__ void saxpy_kernel(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

void saxpy_host(int n, float a, const float* x, float* y) {
  if (n <= 0) return;  // no blocks to launch (an invalid launch on a real device)
  float *dx = nullptr, *dy = nullptr;
  CUDA_CHECK(cudaMalloc(&dx, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&dy, n * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(dx, x, n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dy, y, n * sizeof(float), cudaMemcpyHostToDevice));
  saxpy_kernel<<<(n + 255) / 256, 256>>>(n, a, dx, dy);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemcpy(y, dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(dx));
  CUDA_CHECK(cudaFree(dy));
}

}  // namespace rt::cuda

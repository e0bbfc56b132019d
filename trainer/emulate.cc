// Emulated compute: the schedule of gradient readiness over a step, without the arithmetic.
#include "trainer/emulate.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace rt::trainer {
namespace {

void sleep_until_s(double t) {
  using namespace std::chrono;
  std::this_thread::sleep_until(steady_clock::time_point(duration_cast<steady_clock::duration>(duration<double>(t))));
}

}  // namespace

std::vector<size_t> emulate_ready_points(const std::vector<size_t>& offsets, size_t total) {
  std::vector<size_t> points;
  for (size_t i = 1; i < offsets.size(); ++i)
    if (offsets[i] > offsets[i - 1] && offsets[i] < total) points.push_back(offsets[i]);
  points.push_back(total);
  return points;
}

float emulated_grad(int rank, int64_t step, size_t k) {
  return float((rank + 1 + step % 5) * int64_t(k % 7 + 1)) * (1.0f / 4096);
}

void emulate_compute(const EmulateConfig& cfg, double t0, std::span<float> grads,
                     const std::vector<size_t>& ready_points, int rank, int64_t step,
                     const std::function<void(size_t)>& on_ready) {
  const double total_s = cfg.compute_ms / 1000.0, fwd_s = total_s * cfg.forward_fraction;
  sleep_until_s(t0 + fwd_s);
  const double total = double(std::max<size_t>(grads.size(), 1));
  size_t begin = 0;
  for (size_t k = 0; k < ready_points.size(); ++k) {
    const size_t end = std::min(ready_points[k], grads.size());
    std::fill(grads.begin() + long(begin), grads.begin() + long(end), emulated_grad(rank, step, k));
    sleep_until_s(t0 + fwd_s + (total_s - fwd_s) * double(end) / total);
    if (on_ready) on_ready(end);
    begin = end;
  }
}

}  // namespace rt::trainer

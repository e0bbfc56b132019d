// Emulated compute: a training step that waits instead of running forward and backward, and hands
// the gradient buffer to the reducer at the pace real backward would, so that communication and
// its overlap can be measured for any compute speed (a GPU's, say) with the real gradient sizes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace rt::trainer {

struct EmulateConfig {                // key prefix: emulate.
  double compute_ms = 0;              // >0: forward + backward replaced by this much wall time
  double forward_fraction = 1.0 / 3;  // share of compute_ms before the first gradient is ready
};

// Where emulated backward reports progress: each parameter's end offset in the gradient buffer
// (offsets: the parameters' start offsets in buffer order), the last one `total`.
std::vector<size_t> emulate_ready_points(const std::vector<size_t>& offsets, size_t total);

// The value emulated backward writes into chunk k (between ready points k-1 and k) on `rank` in
// step `step`: a multiple of 2^-12, so sums over ranks are exact, that differs between ranks,
// steps and neighbouring chunks, so a bucket the reducer skipped or misplaced shows.
float emulated_grad(int rank, int64_t step, size_t k);

// One emulated forward + backward that started at t0 (steady-clock seconds): waits until the
// forward share has passed, then fills each chunk and reports it with on_ready at the moment its
// share of the bytes is done, so the last gradient is ready at t0 + compute_ms. The deadlines are
// absolute: the fill counts as compute (real backward writes the gradients too).
void emulate_compute(const EmulateConfig& cfg, double t0, std::span<float> grads,
                     const std::vector<size_t>& ready_points, int rank, int64_t step,
                     const std::function<void(size_t)>& on_ready);

}  // namespace rt::trainer

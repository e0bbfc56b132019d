// The host's clock for timings: seconds on the steady clock (step phases, saves, timelines,
// per-node profiles, benchmarks).
#pragma once
#include <chrono>

namespace rt {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace rt

// The trainer's host clock: seconds on the steady clock, for step phases, saves and timelines.
#pragma once
#include <chrono>

namespace rt::trainer {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace rt::trainer

// log.timeline: a window of training steps of one rank as a Chrome trace (Trace Event Format,
// JSON array), for chrome://tracing or ui.perfetto.dev: the main thread's phases (data, forward,
// backward, waiting for gradients, optimizer), each gradient bucket's ready time, and each
// bucket's allreduce on the communication thread — what Horovod's timeline shows for its
// tensors. One event per line, flushed after every step, so a job that dies leaves what it
// recorded (the viewers accept an array without its closing bracket).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include "comm/gradient_reducer.h"

namespace rt::trainer {

class Timeline {
 public:
  // Tracks (the trace's thread ids).
  enum Track : int { kMain = 0, kComm = 1 };

  // Writes to `path` (created or truncated; an error naming `key` and the path if it cannot be),
  // as process `rank`; times are seconds on the steady clock, shown relative to origin_s.
  Timeline(const std::string& path, const std::string& key, int rank, double origin_s);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // A complete event [t0, t1] on a track; args: the inside of a JSON object ("" for none).
  void span(Track track, const char* name, double t0, double t1, const std::string& args = "");
  // An instant on a track.
  void instant(Track track, const char* name, double t, const std::string& args = "");
  // Flushes what this step recorded. A write that fails (a full disk) closes the file and keeps
  // the reason in error(): a diagnostic must not stop the training.
  void flush();
  const std::string& error() const { return error_; }
  // Ends the array; nothing more is recorded. Called by the destructor if not before.
  void close();
  bool closed() const { return !f_; }

 private:
  void event(const char* ph, Track track, const char* name, double t, double dur,
             const std::string& args);

  std::FILE* f_ = nullptr;
  std::string path_, error_;
  int rank_;
  double origin_s_;
};

// The host's clock (seconds, steady clock) at a training step's phase boundaries.
struct StepPhases {
  double start = 0, data = 0, forward = 0, backward = 0, wait = 0, end = 0;
  double prefetch0 = 0, prefetch1 = 0;  // the next batch's prefetch during backward (0, 0: none)
  bool emulated = false;                // emulate.compute_ms: forward and backward are one wait
};

// Records step `step` (1-based): its phases on the main track, each bucket's ready instant there,
// and each bucket's allreduce (and any wait for the device before it) on the communication track.
// Flushes (see Timeline::flush).
void timeline_step(Timeline& tl, int64_t step, const StepPhases& p, const comm::GradientReducer& r);

}  // namespace rt::trainer

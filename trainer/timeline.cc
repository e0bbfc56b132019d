// The Chrome trace writer of log.timeline.
#include "trainer/timeline.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include "nn/error.h"

namespace rt::trainer {

Timeline::Timeline(const std::string& path, const std::string& key, int rank, double origin_s)
    : path_(path), rank_(rank), origin_s_(origin_s) {
  f_ = std::fopen(path.c_str(), "w");
  if (!f_)
    throw Error(str_cat(key, ": cannot write the timeline '", path, "': ", std::strerror(errno)));
  // Names for the process and its two tracks, and ranks sorted by number in the viewer.
  std::fprintf(f_,
               "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}"
               ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}}"
               ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":"
               "\"main: data, forward, backward, optimizer\"}}"
               ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":"
               "\"communication: bucket allreduce\"}}",
               rank, rank, rank, rank, rank, int(kMain), rank, int(kComm));
}

Timeline::~Timeline() { close(); }

void Timeline::event(const char* ph, Track track, const char* name, double t, double dur,
                     const std::string& args) {
  if (!f_) return;
  // Microseconds with a fraction: the viewers' unit.
  // Each event starts its own line after the previous one's comma, so the file read so far is
  // always an array the viewers accept (the closing bracket is optional to them).
  std::fprintf(f_, ",\n{\"name\":\"%s\",\"ph\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f", name, ph, rank_,
               int(track), (t - origin_s_) * 1e6);
  if (dur >= 0) std::fprintf(f_, ",\"dur\":%.3f", dur * 1e6);
  if (ph[0] == 'i') std::fputs(",\"s\":\"t\"", f_);  // an instant on its thread's track
  if (!args.empty()) std::fprintf(f_, ",\"args\":{%s}", args.c_str());
  std::fputc('}', f_);
}

void Timeline::span(Track track, const char* name, double t0, double t1, const std::string& args) {
  event("X", track, name, t0, t1 > t0 ? t1 - t0 : 0, args);
}

void Timeline::instant(Track track, const char* name, double t, const std::string& args) {
  event("i", track, name, t, -1, args);
}

void Timeline::flush() {
  if (!f_ || (std::fflush(f_) == 0 && !std::ferror(f_))) return;
  error_ = str_cat("writing '", path_, "' failed: ", std::strerror(errno));
  std::fclose(f_);
  f_ = nullptr;
}

void Timeline::close() {
  if (!f_) return;
  std::fputs("\n]\n", f_);
  std::fclose(f_);
  f_ = nullptr;
}

namespace {
double seconds(comm::GradientReducer::Clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}
}  // namespace

void timeline_step(Timeline& tl, int64_t step, const StepPhases& p, const comm::GradientReducer& r) {
  const std::string at = str_cat("\"step\":", step);
  using T = Timeline::Track;
  tl.span(T::kMain, "step", p.start, p.end, at);
  if (p.data > p.start) tl.span(T::kMain, "data", p.start, p.data, at);
  if (p.emulated) {
    tl.span(T::kMain, "forward + backward (emulated)", p.data, p.backward, at);
  } else {
    // On a GPU backend these are the host's queueing; the device's own time is in the metrics.
    tl.span(T::kMain, "forward", p.data, p.forward, at);
    tl.span(T::kMain, "backward", p.forward, p.prefetch1 > 0 ? p.prefetch0 : p.backward, at);
    if (p.prefetch1 > 0) tl.span(T::kMain, "prefetch next batch", p.prefetch0, p.prefetch1, at);
  }
  tl.span(T::kMain, "wait for gradients", p.backward, p.wait, at);
  tl.span(T::kMain, "optimizer", p.wait, p.end, at);
  const auto& times = r.last_bucket_times();
  const size_t wire = dtype_size(r.wire_type());
  for (size_t b = 0; b < times.size(); ++b) {
    const comm::GradientReducer::BucketTimes& t = times[b];
    const std::string args = str_cat(at, ",\"bucket\":", b, ",\"bytes\":", r.bucket(b).len * wire,
                                     ",\"type\":\"", dtype_name(r.wire_type()), "\"");
    tl.instant(T::kMain, "bucket ready", seconds(t.ready), args);
    if (t.fenced > t.start) tl.span(T::kComm, "wait for the device", seconds(t.start), seconds(t.fenced), args);
    tl.span(T::kComm, "allreduce", seconds(t.fenced), seconds(t.end), args);
  }
  tl.flush();
}

}  // namespace rt::trainer

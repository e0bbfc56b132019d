// What a run reports: JSON-lines metrics (one object per line: start, step, epoch, eval,
// checkpoint records) and rank 0's progress display (a live bar on a terminal, plain lines
// when piped).
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace rt::trainer {

// One optimizer step's numbers on this rank (times in seconds).
struct StepRecord {
  int64_t step = 0;              // 1-based count of steps done after this one
  int64_t epoch = 0;             // 0-based epoch the step belongs to
  int64_t epoch_step = 0;        // 1-based step within the epoch
  double loss = 0, lr = 0;
  double step_s = 0;             // whole step: data wait + compute + exposed comm + optimizer
  double compute_s = 0;          // forward + backward (a GPU backend: the device's own time)
  double data_wait_s = 0;        // blocked waiting for the next batch
  double exposed_comm_s = 0;     // allreduce time not hidden behind backward
  double total_comm_s = 0;       // allreduce time, hidden or not
  double optimizer_s = 0;
  int64_t global_images = 0;     // images all ranks consumed in this step
  double loss_scale = 1;         // the step's loss scale (1 without loss scaling)
  bool skipped = false;          // a gradient overflowed: no update (dynamic loss scaling)
  double grad_norm = -1;         // train.clip_grad_norm, log.grad_norm: the gradient's L2 norm
                                 //   before clipping (-1: not computed: both off, or the step skipped)
  bool clipped = false;          // ... and whether it was above the limit (scaled down to it)
  double bn_sync_s = -1;         // model.bn_group: time in the batch norms' group sums, part of
                                 //   compute_s (-1: no groups)
};

// A flat JSON object built field by field: {"type":"epoch","epoch":3,...}.
class JsonLine {
 public:
  explicit JsonLine(const char* type);
  JsonLine& add(const char* key, double v);
  JsonLine& add(const char* key, int64_t v);
  JsonLine& add(const char* key, int v) { return add(key, int64_t(v)); }
  JsonLine& add(const char* key, const std::string& v);
  JsonLine& add(const char* key, const char* v) { return add(key, std::string(v)); }
  JsonLine& add(const char* key, const std::vector<std::string>& v);
  JsonLine& add(const char* key, const std::vector<double>& v);
  std::string str() const { return s_ + "}"; }

 private:
  std::string s_;
};

// Appends JSON lines to a file; does nothing when the path is empty. Lines are flushed at every
// record except step records (flushed every 50 steps), so a killed run loses little.
class Metrics {
 public:
  Metrics() = default;
  // Throws rt::Error naming the path when it cannot be opened.
  explicit Metrics(const std::string& path);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;
  bool enabled() const { return f_ != nullptr; }
  const std::string& path() const { return path_; }
  void step(int rank, const StepRecord& r);  // formats straight into the file: no allocation
  void write(const JsonLine& line);

 private:
  // After a flush: a write that failed (a full disk) is said once on stderr, naming the file, and
  // the file is closed; training goes on without its records. A file deleted meanwhile is made
  // again.
  void check_written();
  void open();  // path_ (its folder made), appending; throws rt::Error naming it
  void reopen_if_deleted();
  std::FILE* f_ = nullptr;
  std::string path_;
  int64_t unflushed_ = 0;
  int64_t records_ = 0;
  bool made_file_ = false;            // open() made the file: removed again if no record came
  std::string made_dir_;              // the outermost folder open() made for it, if any
};

// Rank 0's progress: every `interval` steps one update with epoch, step/steps, loss (mean over
// the interval), running top-1 of the epoch, lr, global images/s, data-wait % and exposed-comm %
// over the interval's steps, and the ETA of the training steps left.
class Progress {
 public:
  // live: rewrite one line with '\r' (a terminal); otherwise print one line per update.
  Progress(bool enabled, bool live, int64_t interval, int64_t epochs, int64_t steps_per_epoch,
           int64_t total_steps);
  ~Progress();
  void step(const StepRecord& r, double running_top1_pct);
  // A line of its own (ends a live bar first).
  void message(const std::string& s);
  void end_line();

 private:
  bool enabled_, live_;
  int64_t interval_, epochs_, steps_per_epoch_, total_steps_;
  int64_t n_ = 0;                 // steps in the current window
  double step_s_ = 0, wait_s_ = 0, comm_s_ = 0, images_ = 0, loss_ = 0;  // sums over the window
  bool open_line_ = false;        // a live bar is on screen
  int tty_ = -1;                  // where the terminal's width is asked (live only)
};

// A descriptor of the terminal rank 0's output reaches (under mpirun, mpirun's: a rank's own
// pseudo-terminal has no width of the user's), or -1.
int open_output_terminal();
// The terminal's width in columns, or `fallback` where it cannot say.
int terminal_columns(int fd, int fallback);
// A progress line's fields (text, drop rank) joined by spaces within `width` characters: where
// they do not fit, the fields of highest drop rank are left out first (0: never), then the text
// is cut. A live bar longer than its terminal wraps, and '\r' then rewrites only the last row.
std::string fit_fields(const std::vector<std::pair<std::string, int>>& fields, size_t width);
// v with `decimals` digits after the point.
std::string fixed(double v, int decimals);
// "1:02:03" / "4:05".
std::string format_duration(double seconds);

// This process's resident memory and open file descriptors (Linux /proc), recorded with every
// epoch so that a long run shows growth, if any.
struct ProcessUsage {
  double rss_mib = 0;
  int64_t open_fds = 0;
};
ProcessUsage process_usage();

}  // namespace rt::trainer

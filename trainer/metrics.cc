// JSON-lines metrics and the progress display.
#include "trainer/metrics.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "nn/console.h"
#include "nn/error.h"

namespace rt::trainer {
namespace {

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// JSON has no NaN or infinity: write null for them.
void append_number(std::string& s, double v) {
  if (!std::isfinite(v)) {
    s += "null";
    return;
  }
  char buf[32];  // 9 digits: a float's exact value, and a learning rate to check against its formula
  std::snprintf(buf, sizeof buf, "%.9g", v);
  s += buf;
}

}  // namespace

JsonLine::JsonLine(const char* type) { s_ = std::string("{\"type\":\"") + type + "\""; }

JsonLine& JsonLine::add(const char* key, double v) {
  s_ += ",\"";
  s_ += key;
  s_ += "\":";
  append_number(s_, v);
  return *this;
}
JsonLine& JsonLine::add(const char* key, int64_t v) {
  s_ += str_cat(",\"", key, "\":", v);
  return *this;
}
JsonLine& JsonLine::add(const char* key, const std::string& v) {
  s_ += str_cat(",\"", key, "\":\"", json_escape(v), "\"");
  return *this;
}
JsonLine& JsonLine::add(const char* key, const std::vector<std::string>& v) {
  s_ += str_cat(",\"", key, "\":[");
  for (size_t i = 0; i < v.size(); ++i) s_ += str_cat(i ? "," : "", "\"", json_escape(v[i]), "\"");
  s_ += "]";
  return *this;
}
JsonLine& JsonLine::add(const char* key, const std::vector<double>& v) {
  s_ += str_cat(",\"", key, "\":[");
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s_ += ",";
    append_number(s_, v[i]);
  }
  s_ += "]";
  return *this;
}

Metrics::Metrics(const std::string& path) : path_(path) { open(); }

void Metrics::open() {
  if (path_.empty()) return;
  std::filesystem::path p(path_);
  std::error_code ec;
  // What this opening makes (the file, its first missing folder) goes again if no record comes:
  // a job refused at start leaves no empty metrics file in a run folder of its own making.
  made_file_ = !std::filesystem::exists(p, ec);
  made_dir_ = first_missing_folder(p.parent_path().string());
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  if (ec)  // the cause (a read-only file system, say), not the missing folder it leaves
    throw Error(str_cat(p.parent_path().string(), ": cannot create the folder of the metrics file (", ec.message(), ")"));
  f_ = std::fopen(path_.c_str(), "a+");  // a+: the last byte can be read; writes still append
  if (!f_) throw Error(str_cat(path_, ": cannot open the metrics file (", std::strerror(errno), ")"));
  // A run killed mid-write leaves half a record: this run's records start on a line of their own.
  const bool cut = std::fseek(f_, -1, SEEK_END) == 0 && std::fgetc(f_) != '\n';
  std::fseek(f_, 0, SEEK_END);  // a read is followed by a write only after a seek
  if (cut) std::fputc('\n', f_);
}

Metrics::~Metrics() {
  if (f_) std::fclose(f_);
  if (!f_ || records_ || !made_file_) return;
  std::error_code ec;
  std::filesystem::remove(path_, ec);
  remove_made_folders(std::filesystem::path(path_).parent_path().string(), made_dir_);
}

void Metrics::step(int rank, const StepRecord& r) {
  if (!f_) return;
  ++records_;
  std::fprintf(f_,
               "{\"type\":\"step\",\"rank\":%d,\"step\":%lld,\"epoch\":%lld,\"epoch_step\":%lld,"
               "\"loss\":%.9g,\"lr\":%.9g,\"step_s\":%.6f,\"compute_s\":%.6f,\"data_wait_s\":%.6f,"
               "\"exposed_comm_s\":%.6f,\"total_comm_s\":%.6f,\"optimizer_s\":%.6f,\"img_s\":%.2f,"
               "\"loss_scale\":%.6g,\"skipped\":%d",
               rank, (long long)r.step, (long long)r.epoch, (long long)r.epoch_step,
               std::isfinite(r.loss) ? r.loss : -1.0, r.lr, r.step_s, r.compute_s, r.data_wait_s,
               r.exposed_comm_s, r.total_comm_s, r.optimizer_s,
               r.step_s > 0 ? double(r.global_images) / r.step_s : 0.0, r.loss_scale, int(r.skipped));
  if (r.grad_norm >= 0 || std::isnan(r.grad_norm))  // JSON has no inf or NaN: -1 stands for them too
    std::fprintf(f_, ",\"grad_norm\":%.9g,\"clipped\":%d", std::isfinite(r.grad_norm) ? r.grad_norm : -1.0,
                 int(r.clipped));
  if (r.bn_sync_s >= 0) std::fprintf(f_, ",\"bn_sync_s\":%.6f", r.bn_sync_s);
  std::fputs("}\n", f_);
  if (++unflushed_ >= 50) {
    std::fflush(f_);
    unflushed_ = 0;
    check_written();
    reopen_if_deleted();
  }
}

void Metrics::reopen_if_deleted() {
  // Deleted under the run (its folder removed, say): the records would go to a file nobody can
  // see. Made anew, and said.
  struct stat st;
  if (!f_ || fstat(fileno(f_), &st) != 0 || st.st_nlink != 0) return;
  std::fclose(f_);
  f_ = nullptr;
  try {
    open();
    stderr_line(str_cat("ringtrain: warning: the metrics file ", path_, " was deleted during the run: written anew from here on"));
  } catch (const Error& e) {
    stderr_line(str_cat("ringtrain: warning: the metrics file was deleted during the run and cannot be made again: ", e.what(),
                        "; its records from here on are lost"));
  }
}

void Metrics::check_written() {
  if (!std::ferror(f_)) return;
  stderr_line(str_cat("ringtrain: warning: writing the metrics file ", path_, " failed (", std::strerror(errno),
                      "): its records from here on are lost"));
  std::fclose(f_);
  f_ = nullptr;
}

void Metrics::write(const JsonLine& line) {
  reopen_if_deleted();
  if (!f_) return;
  ++records_;
  std::fputs(line.str().c_str(), f_);
  std::fputc('\n', f_);
  std::fflush(f_);
  unflushed_ = 0;
  check_written();
}


std::string fixed(double v, int decimals) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = std::lround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

Progress::Progress(bool enabled, bool live, int64_t interval, int64_t epochs, int64_t steps_per_epoch,
                   int64_t total_steps)
    : enabled_(enabled), live_(live), interval_(std::max<int64_t>(1, interval)), epochs_(epochs),
      steps_per_epoch_(steps_per_epoch), total_steps_(total_steps) {
  if (enabled_ && live_) tty_ = open_output_terminal();
}

Progress::~Progress() {
  end_line();
  if (tty_ >= 0 && tty_ != STDOUT_FILENO) ::close(tty_);
}

int open_output_terminal() {
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return isatty(STDOUT_FILENO) ? STDOUT_FILENO : -1;
  return ::open(launcher_fd(STDOUT_FILENO).c_str(), O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);  // only where stdout_is_terminal()
}

int terminal_columns(int fd, int fallback) {
  winsize w{};
  if (fd >= 0 && ::ioctl(fd, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  return fallback;
}

std::string fit_fields(const std::vector<std::pair<std::string, int>>& fields, size_t width) {
  const auto join = [&](int max_rank) {
    std::string s;
    for (const auto& [text, rank] : fields)
      if (rank <= max_rank) s += (s.empty() ? "" : " ") + text;
    return s;
  };
  int max_rank = 0;
  for (const auto& f : fields) max_rank = std::max(max_rank, f.second);
  for (int r = max_rank; r > 0; --r)
    if (std::string s = join(r); s.size() <= width) return s;
  std::string s = join(0);
  if (s.size() > width) s.resize(width);
  return s;
}

void Progress::step(const StepRecord& r, double top1) {
  if (!enabled_) return;
  ++n_;
  step_s_ += r.step_s;
  wait_s_ += r.data_wait_s;
  comm_s_ += r.exposed_comm_s;
  images_ += double(r.global_images);
  loss_ += r.loss;
  const bool last = r.step >= total_steps_ || r.epoch_step == steps_per_epoch_;
  if (n_ < interval_ && !last) return;
  const double mean = step_s_ / double(n_);
  char f[9][64];
  std::snprintf(f[0], sizeof f[0], "epoch %lld/%lld", (long long)r.epoch + 1, (long long)epochs_);
  std::snprintf(f[1], sizeof f[1], "step %lld/%lld", (long long)r.epoch_step, (long long)steps_per_epoch_);
  std::snprintf(f[2], sizeof f[2], "loss %.4f", loss_ / double(n_));
  std::snprintf(f[3], sizeof f[3], "top1 %.1f%%", top1);
  std::snprintf(f[4], sizeof f[4], "lr %.4g", r.lr);
  std::snprintf(f[5], sizeof f[5], "%.1f img/s", images_ / step_s_);
  std::snprintf(f[6], sizeof f[6], "data %.0f%%", 100 * wait_s_ / step_s_);
  std::snprintf(f[7], sizeof f[7], "comm %.0f%%", 100 * comm_s_ / step_s_);
  std::snprintf(f[8], sizeof f[8], "ETA %s", format_duration(mean * double(total_steps_ - r.step)).c_str());
  // On a narrow terminal the rate and the ETA outlast lr, the data and top-1 figures.
  const std::vector<std::pair<std::string, int>> fields = {{f[0], 0}, {f[1], 0}, {f[2], 0}, {f[3], 3}, {f[4], 5},
                                                           {f[5], 1}, {f[6], 4}, {f[7], 2}, {f[8], 0}};
  if (live_) {
    // The last column stays free (a full row wraps on some terminals); "\033[K" clears what a
    // longer previous update left.
    const size_t width = size_t(std::max(20, terminal_columns(tty_, 80) - 1));
    std::printf("\r%s\033[K", fit_fields(fields, width).c_str());
    open_line_ = true;
    if (r.epoch_step == steps_per_epoch_) end_line();  // keep each epoch's final state on screen
  } else {
    std::printf("%s\n", fit_fields(fields, std::string::npos).c_str());
  }
  std::fflush(stdout);
  n_ = 0;
  step_s_ = wait_s_ = comm_s_ = images_ = loss_ = 0;
}

void Progress::message(const std::string& s) {
  if (!enabled_) return;
  end_line();
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

void Progress::end_line() {
  if (open_line_) {
    std::printf("\n");
    std::fflush(stdout);
    open_line_ = false;
  }
}

ProcessUsage process_usage() {
  ProcessUsage u;
  long pages_total = 0, pages_resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages_total, &pages_resident) == 2)
      u.rss_mib = double(pages_resident) * double(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
    std::fclose(f);
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec))
    ++u.open_fds;
  if (u.open_fds > 0) --u.open_fds;  // the descriptor the listing itself holds open
  return u;
}

}  // namespace rt::trainer

// Helpers for tests that drive the trainer program through mpirun from outside (the test itself
// is not an MPI program): run a command, capture its output and exit status, check patterns.
#pragma once
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace cli {

inline int failures = 0;
inline std::string mpiexec, trainer, dir;  // set by main; dir is the test's scratch folder

struct Result {
  int rc = -1;
  std::string out;
  double seconds = 0;
};

// Runs a shell command (stdout and stderr together).
inline Result shell(const std::string& cmd) {
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(("{ " + cmd + "; } 2>&1").c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = pclose(p);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// The trainer with `args` under mpirun with np ranks.
inline Result run(int np, const std::string& args) {
  return shell(mpiexec + " -np " + std::to_string(np) + " --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " +
               trainer + " " + args);
}

inline void expect(bool ok, const std::string& what, const Result& r) {
  if (ok) return;
  ++failures;
  std::printf("FAIL: %s\n  exit %d after %.1f s, output:\n%s\n", what.c_str(), r.rc, r.seconds, r.out.c_str());
}

inline bool matches(const Result& r, const std::string& pattern) {
  return std::regex_search(r.out, std::regex(pattern));
}

// Fails unless the run exited non-zero and its output matches `pattern`.
inline void expect_error(const Result& r, const std::string& pattern, const std::string& what) {
  expect(r.rc != 0 && matches(r, pattern), what + " (expected /" + pattern + "/)", r);
}

inline std::string write(const std::string& name, const std::string& text) {
  const std::string p = dir + "/" + name;
  std::ofstream(p) << text;
  return p;
}

// The part of a test program to run (its third argument, one of the program's `parts`), so
// that ctest runs the parts side by side; none given: every part.
inline std::string part;
inline bool wants(const char* p) { return part.empty() || part == p; }

// Reads MPIEXEC, TRAINER and the part from the command line and makes the scratch folder; false
// (after printing the usage) when the arguments are wrong.
inline bool start(int argc, char** argv, const char* name, std::initializer_list<const char*> parts = {}) {
  bool ok = argc == 3 || (argc == 4 && parts.size() > 0);
  if (argc == 4) {
    part = argv[3];
    ok = ok && std::any_of(parts.begin(), parts.end(), [](const char* p) { return part == p; });
  }
  if (!ok) {
    std::string list;
    for (const char* p : parts) list += (list.empty() ? "" : "|") + std::string(p);
    std::fprintf(stderr, "usage: %s MPIEXEC TRAINER%s\n", name, list.empty() ? "" : (" [" + list + "]").c_str());
    return false;
  }
  mpiexec = argv[1];
  trainer = argv[2];
  std::string tmpl = std::string("/tmp/rt_") + name + "_XXXXXX";
  dir = mkdtemp(tmpl.data());
  return true;
}

// Removes the scratch folder, prints the verdict; the exit status.
inline int finish(const char* name) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) std::printf("note: %s not removed: %s\n", dir.c_str(), ec.message().c_str());
  std::printf("%s: %s (%d failures)\n", name, failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}

// The text of a file ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Polls until pred() holds, for at most `limit` seconds; whether it did.
template <class Pred>
bool wait_for(Pred pred, double limit) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!pred()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The pids of the processes whose command line mentions `needle` (a job's own config file) and,
// if `program` is given, starts with it (the trainer's ranks, not their mpirun). Zombies have an
// empty command line and are left out.
inline std::vector<int> processes_with(const std::string& needle, const std::string& program = "") {
  std::vector<int> pids;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string pid = it->path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = read_file(it->path() / "cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(needle) != std::string::npos && (program.empty() || cmd.rfind(program + " ", 0) == 0))
      pids.push_back(std::stoi(pid));
  }
  return pids;
}

// A small 2-epoch ResNet-20 job on synthetic data with its run folder under dir/run; its path.
inline std::string tiny_config(const std::string& run) {
  return write(run + ".yaml",
               "model: {name: resnet20, classes: 4, width: 0.25}\n"
               "data: {synthetic: true, synthetic_samples: 40, synthetic_classes: 4, image_size: 8, threads: 1}\n"
               "train: {epochs: 2, batch: 4}\n"
               "optimizer: {lr: 3.2}\n"
               "schedule: {kind: cosine, warmup_epochs: 0.5}\n"
               "log: {interval: 2, print_config: false}\n"
               "threads: 1\n"
               "run_dir: " + dir + "/" + run + "\n");
}

// The run's checkpoints, oldest first.
inline std::vector<std::string> checkpoints(const std::string& run) {
  std::vector<std::string> out;
  std::error_code ec;  // no folder: no checkpoints (the caller's expectation reports it)
  for (std::filesystem::directory_iterator it(dir + "/" + run + "/checkpoints", ec), end; !ec && it != end;
       it.increment(ec))
    if (it->path().extension() == ".rtck") out.push_back(it->path().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace cli

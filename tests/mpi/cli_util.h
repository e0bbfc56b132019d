// Helpers for tests that drive the trainer program through mpirun from outside (the test itself
// is not an MPI program): run a command, capture its output and exit status, check patterns.
#pragma once
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <regex>
#include <string>

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

// Reads MPIEXEC and TRAINER from the command line and makes the scratch folder; false (after
// printing the usage) when the arguments are wrong.
inline bool start(int argc, char** argv, const char* name) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MPIEXEC TRAINER\n", name);
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

}  // namespace cli

#include "nn/console.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace rt {

std::string launcher_fd(int fd) { return "/proc/" + std::to_string(getppid()) + "/fd/" + std::to_string(fd); }

bool reaches_terminal(int fd) {
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return isatty(fd) == 1;
  char link[256];
  const ssize_t n = readlink(launcher_fd(fd).c_str(), link, sizeof link - 1);
  if (n <= 0) return false;
  link[n] = 0;
  return std::strncmp(link, "/dev/pts/", 9) == 0 || std::strncmp(link, "/dev/tty", 8) == 0;
}

std::string stderr_text(std::string_view line, bool clear) {
  std::string s = clear ? "\r\033[K" : "";
  s.append(line);
  s += '\n';
  return s;
}

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) && reaches_terminal(STDOUT_FILENO); }

std::string first_missing_folder(const std::string& dir) {
  std::error_code ec;
  std::string made;
  for (auto d = std::filesystem::path(dir); !d.empty() && !std::filesystem::exists(d, ec); d = d.parent_path())
    made = d.string();
  return made;
}

void remove_made_folders(const std::string& dir, const std::string& made) {
  if (made.empty()) return;
  std::error_code ec;  // remove() refuses a folder that is not empty: the walk ends there
  for (auto d = std::filesystem::path(dir); std::filesystem::remove(d, ec) && d != made;) d = d.parent_path();
}

const char* stderr_line_prefix() {
  static const bool clear = stdout_is_terminal() && reaches_terminal(STDERR_FILENO);
  return clear ? "\r\033[K" : "";
}

void stderr_line(std::string_view line) {
  const std::string s = stderr_text(line, *stderr_line_prefix() != 0);
  // One write: lines of the decode threads, or of another rank through the launcher, stay whole.
  std::fwrite(s.data(), 1, s.size(), stderr);
  std::fflush(stderr);
}

}  // namespace rt

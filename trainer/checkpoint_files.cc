// The checkpoint folder: its files by step, the newest that reads back (--resume auto), the best
// one kept apart, pruning to the last K, and setting aside the files a new start supersedes.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <regex>

#include "trainer/checkpoint.h"

namespace rt::trainer {
namespace fs = std::filesystem;
namespace {

std::string os_error() { return std::strerror(errno); }

// The step of a file named ckpt-<10 digits>.rtck, else -1.
int64_t step_of(const fs::path& p) {
  static const std::regex re(R"(ckpt-(\d{10})\.rtck)");
  std::smatch m;
  const std::string name = p.filename().string();
  return std::regex_match(name, m, re) ? std::stoll(m[1].str()) : -1;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "ckpt-%010lld.rtck", static_cast<long long>(step));
  return dir + "/" + name;
}

std::vector<std::string> checkpoint_list(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (const int64_t step = step_of(e.path()); step >= 0) found.emplace_back(step, e.path().string());
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string checkpoint_find_latest(const std::string& dir, std::vector<std::string>* skipped, Checkpoint* found,
                                   const CheckpointParts& keep) {
  for (const auto& p : checkpoint_list(dir)) {
    try {
      Checkpoint ck = checkpoint_read(p, found ? keep : CheckpointParts::none());
      if (found) *found = std::move(ck);
      return p;
    } catch (const CheckpointError& e) {
      if (skipped) skipped->push_back(e.what());
    }
  }
  return "";
}

std::string checkpoint_best_path(const std::string& dir) { return dir + "/best.rtck"; }

bool checkpoint_in(const std::string& path, const std::string& dir) {
  std::error_code ea, eb;
  const fs::path a = fs::weakly_canonical(fs::path(path).parent_path(), ea), b = fs::weakly_canonical(dir, eb);
  return !ea && !eb && a == b;
}

void checkpoint_keep_best(const std::string& path) {
  const fs::path from(path);
  const std::string dir = from.parent_path().empty() ? "." : from.parent_path().string();
  const std::string best = checkpoint_best_path(dir), tmp = dir + "/.best.rtck.tmp";
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_hard_link(from, tmp, ec);
  if (ec) {  // a file system without hard links: the same bytes, copied
    ec.clear();
    fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec);
    if (!ec) {
      const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::fsync(fd) != 0) ec = std::error_code(errno, std::generic_category());
      if (fd >= 0) ::close(fd);
    }
  }
  if (ec || ::rename(tmp.c_str(), best.c_str()) != 0) {
    const std::string why = ec ? ec.message() : os_error();
    fs::remove(tmp, ec);
    throw CheckpointError(str_cat(best, ": cannot make it the best checkpoint, ", path, " (", why, ")"));
  }
  checkpoint_fsync_dir(dir);
}

void checkpoint_prune(const std::string& dir, int keep) {
  auto all = checkpoint_list(dir);
  for (size_t i = size_t(std::max(keep, 1)); i < all.size(); ++i) ::unlink(all[i].c_str());
  // Temporary files of writes that never finished (a killed run): never a final name, so unused.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name[0] == '.' && name.rfind(".tmp") == name.size() - 4) ::unlink(e.path().c_str());
  }
}

std::string checkpoint_set_aside(const std::string& dir, int64_t step, std::vector<std::string>* moved,
                                 int64_t* best_step) {
  std::vector<std::string> later;
  for (const std::string& p : checkpoint_list(dir))
    if (step_of(p) > step) later.push_back(p);
  const std::string best = checkpoint_best_path(dir);
  std::error_code ec;
  if (best_step) *best_step = -1;
  if (fs::exists(best, ec)) {
    int64_t at = -1;  // unreadable: set aside too, it cannot be this run's
    try {
      at = checkpoint_read(best, CheckpointParts::none()).meta.step;
    } catch (const CheckpointError&) {
    }
    if (at < 0 || at > step) later.push_back(best);
    else if (best_step) *best_step = at;
  }
  if (later.empty()) return "";
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  std::string to = dir + "/superseded-" + stamp;
  for (int k = 2; fs::exists(to, ec); ++k) to = dir + "/superseded-" + stamp + "-" + std::to_string(k);
  if (!fs::create_directory(to, ec) || ec)
    throw CheckpointError(str_cat(to, ": cannot create it to set the later checkpoints aside (",
                                  ec ? ec.message() : std::string("exists"), ")"));
  for (const std::string& p : later) {
    if (::rename(p.c_str(), (to + "/" + fs::path(p).filename().string()).c_str()) != 0)
      throw CheckpointError(str_cat(p, ": cannot move it into ", to, " (", os_error(), ")"));
    if (moved) moved->push_back(p);
  }
  checkpoint_fsync_dir(to);
  checkpoint_fsync_dir(dir);
  return to;
}

}  // namespace rt::trainer

// Folder and list-file datasets: an index of (path, label) built once; bytes read per sample.
#include "data/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>

#include "data/shard.h"
#include "nn/error.h"
#include "nn/hash.h"

namespace fs = std::filesystem;

namespace rt::data {

bool read_file(const std::string& path, std::vector<uint8_t>& buf) {
  // O_NONBLOCK: opening a named pipe would otherwise wait for a writer (and hang the rank); on
  // a regular file it changes nothing.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st;
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (ok) {
    buf.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < buf.size()) {
      const ssize_t r = ::read(fd, buf.data() + got, buf.size() - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    ok = got == buf.size();
  }
  ::close(fd);
  return ok;
}

namespace {

// Samples as paths and labels (folder and list datasets).
class PathDataset final : public Dataset {
 public:
  PathDataset(std::vector<std::string> paths, std::vector<int32_t> labels,
              std::vector<std::string> classes)
      : paths_(std::move(paths)), labels_(std::move(labels)), classes_(std::move(classes)) {}
  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  const std::vector<std::string>& class_names() const override { return classes_; }
  int32_t label(int64_t i) const override { return labels_[static_cast<size_t>(i)]; }
  bool read(int64_t i, std::vector<uint8_t>& buf) const override {
    return read_file(paths_[static_cast<size_t>(i)], buf);
  }
  std::string name(int64_t i) const override { return paths_[static_cast<size_t>(i)]; }

 private:
  std::vector<std::string> paths_;
  std::vector<int32_t> labels_;
  std::vector<std::string> classes_;
};

const char* split_name(Split s) { return s == Split::train ? "train" : "val"; }

// Image files under dir, recursively, sorted as torchvision's ImageFolder walks them: by folder,
// then by file name (byte order, which for UTF-8 is code point order, as Python sorts).
// Links are followed; a folder reached twice (a link loop, or two links to one folder) is an
// error rather than its images listed again under this class (another class may link to it). A
// link to an image that is gone is listed, so that the loader warns and counts it as skipped.
std::vector<std::string> list_images(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> found;  // (folder, name)
  std::map<std::pair<dev_t, ino_t>, std::string> folders;   // each folder listed, by identity
  const auto visit = [&](const fs::path& p) {
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) return;  // the iterator reports what it cannot open
    const auto [at, fresh] = folders.emplace(std::make_pair(st.st_dev, st.st_ino), p.string());
    if (!fresh)
      throw Error(str_cat("data: ", p.string(), " is ", at->second,
                          " again (a link loop or a second link to it): its images would be listed twice"));
  };
  visit(dir);
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end;
       !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    const fs::path& p = it->path();
    if (it->is_directory(e2)) {
      visit(p);
      continue;
    }
    const bool dangling = it->is_symlink(e2) && !fs::exists(p, e2);
    if (!it->is_regular_file(e2) && !dangling) continue;
    if (is_image_file(p.string())) found.emplace_back(p.parent_path().string(), p.filename().string());
  }
  if (ec) throw Error(str_cat("data: cannot list ", dir.string(), ": ", ec.message()));
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  out.reserve(found.size());
  for (auto& [folder, name] : found) out.push_back(folder + "/" + name);
  return out;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// Parses a list file into (path, label) entries; throws naming file:line on a bad line.
void parse_list(const std::string& path, std::vector<std::string>* paths, std::vector<int32_t>* labels) {
  std::ifstream in(path);
  if (!in) throw Error(str_cat("data: cannot open list file ", path));
  const fs::path base = fs::path(path).parent_path();
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (no == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 byte order mark
    const size_t hash = line.find('#');
    const std::string t = trim(hash == std::string::npos ? line : line.substr(0, hash));
    if (t.empty()) continue;
    const size_t sp = t.find_last_of(" \t");
    if (sp == std::string::npos)
      throw Error(str_cat(path, ":", no, ": expected \"path label\", got \"", t, "\""));
    const std::string file = trim(t.substr(0, sp)), lab = t.substr(sp + 1);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(lab, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != lab.size() || v < 0)
      throw Error(str_cat(path, ":", no, ": label \"", lab, "\" is not an integer >= 0"));
    // Each class gets a name string up front: a stray huge label must not allocate gigabytes.
    if (v > kMaxListLabel)
      throw Error(str_cat(path, ":", no, ": label ", lab, " is above the largest supported (",
                          kMaxListLabel, ")"));
    const fs::path fp(file);
    paths->push_back(fp.is_absolute() ? file : (base / fp).string());
    labels->push_back(static_cast<int32_t>(v));
  }
  if (in.bad()) throw Error(str_cat("data: error reading list file ", path));
}

}  // namespace

bool is_image_file(const std::string& path) {
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos) return false;
  std::string ext = path.substr(dot + 1);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

std::vector<std::string> folder_classes(const std::string& root) {
  const fs::path train = fs::path(root) / "train";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) throw Error(str_cat("data: dataset root ", root, " is not a folder"));
  if (!fs::is_directory(train, ec))
    throw Error(str_cat("data: ", train.string(), " is not a folder (classes come from the train split)"));
  std::vector<std::string> classes;
  for (const auto& e : fs::directory_iterator(train, ec))
    if (e.is_directory()) classes.push_back(e.path().filename().string());
  if (ec) throw Error(str_cat("data: cannot list ", train.string(), ": ", ec.message()));
  if (classes.empty()) throw Error(str_cat("data: no class folders in ", train.string()));
  std::sort(classes.begin(), classes.end());
  return classes;
}

std::unique_ptr<Dataset> open_folder(const std::string& root, Split split, const std::vector<std::string>& known) {
  std::error_code ec;
  const bool named_elsewhere = !known.empty() && fs::is_directory(root, ec) && !fs::exists(fs::path(root) / "train", ec);
  std::vector<std::string> classes = named_elsewhere ? known : folder_classes(root);
  const fs::path dir = fs::path(root) / split_name(split);
  if (!fs::is_directory(dir, ec)) throw Error(str_cat("data: ", dir.string(), " is not a folder"));
  std::map<std::string, int32_t> index;
  for (size_t c = 0; c < classes.size(); ++c) index[classes[c]] = static_cast<int32_t>(c);
  std::vector<std::string> present;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory()) present.push_back(e.path().filename().string());
  std::sort(present.begin(), present.end());
  std::vector<std::string> paths;
  std::vector<int32_t> labels;
  for (const std::string& cls : present) {
    const auto it = index.find(cls);
    if (it == index.end())
      throw Error(str_cat("data: class folder ", (dir / cls).string(), " has no counterpart in ",
                          named_elsewhere ? "the model's classes" : (fs::path(root) / "train").string()));
    const std::vector<std::string> files = list_images(dir / cls);
    if (files.empty()) throw Error(str_cat("data: class folder ", (dir / cls).string(), " has no images"));
    paths.insert(paths.end(), files.begin(), files.end());
    labels.insert(labels.end(), files.size(), it->second);
  }
  if (paths.empty()) throw Error(str_cat("data: no images found in ", dir.string()));
  return std::make_unique<PathDataset>(std::move(paths), std::move(labels), std::move(classes));
}

int32_t list_max_label(const std::string& path) {
  std::vector<std::string> paths;
  std::vector<int32_t> labels;
  parse_list(path, &paths, &labels);
  return labels.empty() ? -1 : *std::max_element(labels.begin(), labels.end());
}

std::unique_ptr<Dataset> open_list(const std::string& path, int num_classes) {
  std::vector<std::string> paths;
  std::vector<int32_t> labels;
  parse_list(path, &paths, &labels);
  if (paths.empty()) throw Error(str_cat("data: list file ", path, " names no images"));
  const int32_t max_label = *std::max_element(labels.begin(), labels.end());
  const int n = std::max(num_classes, max_label + 1);
  std::vector<std::string> classes;
  for (int c = 0; c < n; ++c) classes.push_back(std::to_string(c));
  return std::make_unique<PathDataset>(std::move(paths), std::move(labels), std::move(classes));
}

std::unique_ptr<Dataset> open_dataset(const DataConfig& cfg, Split split) {
  const bool train = split == Split::train;
  const std::string& shards = train ? cfg.train_shards : cfg.val_shards;
  const std::string& list = train ? cfg.train_list : cfg.val_list;
  if (!shards.empty()) return open_shards(shards, split_name(split));
  if (!list.empty()) {
    // Both splits agree on the class count: the largest label of either list, plus one.
    int classes = 0;
    for (const std::string* other : {&cfg.train_list, &cfg.val_list})
      if (!other->empty() && *other != list) classes = std::max(classes, list_max_label(*other) + 1);
    return open_list(list, classes);
  }
  if (!cfg.root.empty()) return open_folder(cfg.root, split, cfg.known_classes);
  throw Error(str_cat("data: no ", split_name(split), " data given: set root, ", split_name(split),
                      "_list or ", split_name(split), "_shards (or synthetic)"));
}

uint64_t order_hash_add(uint64_t h, int32_t label, std::string_view path) {
  const size_t slash = path.find_last_of('/');
  uint64_t f = 0xcbf29ce484222325ull;  // FNV-1a of the file name
  for (size_t k = slash == std::string_view::npos ? 0 : slash + 1; k < path.size(); ++k)
    f = (f ^ uint8_t(path[k])) * 0x100000001b3ull;
  return hash_key(h, uint32_t(label), f);
}

uint64_t Dataset::order_hash() const {
  uint64_t h = kOrderHashSeed;
  for (int64_t i = 0; i < size(); ++i) h = order_hash_add(h, label(i), name(i));
  return h + (h == 0);
}

std::string split_source(const DataConfig& cfg, Split split) {
  const bool train = split == Split::train;
  if (cfg.synthetic) return "synthetic data";
  if (const std::string& s = train ? cfg.train_shards : cfg.val_shards; !s.empty()) return "shard set " + s;
  if (const std::string& l = train ? cfg.train_list : cfg.val_list; !l.empty()) return "list file " + l;
  return "folder " + (fs::path(cfg.root) / split_name(split)).string();
}

void check_split_classes(const DataConfig& cfg, const std::vector<std::string>& train,
                         const std::vector<std::string>& val) {
  const auto named = [&](Split s) {
    return !cfg.synthetic && (s == Split::train ? cfg.train_list : cfg.val_list).empty();
  };
  const std::string both = str_cat(" (", split_source(cfg, Split::train), ") and validation (",
                                   split_source(cfg, Split::val), ")");
  if (!named(Split::train) || !named(Split::val)) {
    if (val.size() > train.size())
      throw Error(str_cat("data: the validation split has ", val.size(), " classes but the training split only ",
                          train.size(), "; training", both, " must share their labels"));
    return;
  }
  if (val == train) return;
  throw Error(str_cat("data: training", both, " name different classes (", train.size(), " and ", val.size(), "; ",
                      first_class_difference(train, val, "in training", "in validation"),
                      "): the same label would mean another class"));
}

std::string first_class_difference(const std::vector<std::string>& a, const std::vector<std::string>& b,
                                   const std::string& in_a, const std::string& in_b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const auto name = [](const std::vector<std::string>& v, size_t k) {
    return k < v.size() ? "'" + v[k] + "'" : std::string("none");
  };
  return str_cat("label ", i, " is ", name(a, i), " ", in_a, ", ", name(b, i), " ", in_b);
}

}  // namespace rt::data

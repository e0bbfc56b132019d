// Checkpoint files: atomic write (temp file, fsync, rename, fsync folder) and verified read. The
// checkpoint folder (listing, the newest valid file, the best, pruning): checkpoint_files.cc.
#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>

namespace rt::trainer {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'R', 'T', 'C', 'K', 'P', 'T', '0', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;
constexpr size_t kMetaWords = 20;

size_t padded(size_t n) { return (n + 7) & ~size_t(7); }

std::string os_error() { return std::strerror(errno); }

// Appends to an open file descriptor while hashing the payload.
class Writer {
 public:
  Writer(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void raw(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd_, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw CheckpointError(str_cat(path_, ": cannot write the checkpoint (", os_error(), ")"));
      c += w;
      n -= size_t(w);
    }
  }
  void section(const char* tag, const void* data, size_t bytes) {
    char head[16] = {};
    std::strncpy(head, tag, 8);
    uint64_t len = bytes;
    std::memcpy(head + 8, &len, 8);
    put(head, 16);
    // The bulk is hashed in place; only the sub-word tail goes through a small padded copy.
    size_t body = bytes & ~size_t(7);
    put(data, body);
    if (bytes > body) {
      char tail[8] = {};
      std::memcpy(tail, static_cast<const char*>(data) + body, bytes - body);
      put(tail, 8);
    }
    ++sections_;
  }
  uint64_t hash() const { return hash_; }
  uint64_t bytes() const { return bytes_; }
  uint32_t sections() const { return sections_; }

 private:
  void put(const void* p, size_t n) {
    hash_ = checkpoint_hash(p, n, hash_);
    bytes_ += n;
    raw(p, n);
  }
  int fd_;
  std::string path_;
  uint64_t hash_ = 0xcbf29ce484222325ull, bytes_ = 0;
  uint32_t sections_ = 0;
};

// Reads a checkpoint front to back, hashing the payload as it goes: sections land in their own
// buffers (or pass through a small one) instead of the whole file sitting in memory first.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0) {
      const std::string why = os_error();
      if (fd_ >= 0) ::close(fd_);
      throw CheckpointError(str_cat(path_, ": cannot open the checkpoint (", why, ")"));
    }
    size_ = size_t(st.st_size);
  }
  ~Reader() { ::close(fd_); }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  size_t size() const { return size_; }
  size_t offset() const { return offset_; }
  uint64_t hash() const { return hash_; }
  // n bytes (a multiple of 8 where hashed: sections are padded to whole words).
  void read(void* to, size_t n, bool hashed = true) {
    char* c = static_cast<char*>(to);
    for (size_t done = 0; done < n;) {
      const ssize_t got = ::read(fd_, c + done, std::min<size_t>(n - done, size_t(1) << 30));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw CheckpointError(str_cat(path_, ": read failed (", os_error(), ")"));
      if (got == 0) throw CheckpointError(str_cat(path_, ": read failed (the file shrank while it was read)"));
      done += size_t(got);
    }
    if (hashed) hash_ = checkpoint_hash(c, n, hash_);
    offset_ += n;
  }
  void skip(size_t n) {
    if (n > 0 && chunk_.empty()) chunk_.resize(size_t(1) << 20);
    while (n > 0) {
      const size_t k = std::min(n, chunk_.size());
      read(chunk_.data(), k);
      n -= k;
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  size_t size_ = 0, offset_ = 0;
  uint64_t hash_ = 0xcbf29ce484222325ull;
  std::vector<char> chunk_;
};

}  // namespace

void checkpoint_fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw CheckpointError(str_cat(dir, ": cannot open the checkpoint folder (", os_error(), ")"));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw CheckpointError(str_cat(dir, ": cannot sync the checkpoint folder (", os_error(), ")"));
}

namespace {

std::vector<int64_t> meta_words(const CheckpointMeta& m) {
  std::vector<int64_t> w(kMetaWords, 0);
  w[0] = m.step;
  w[1] = m.epoch;
  w[2] = m.position.epoch;
  w[3] = m.position.step;
  w[4] = m.optimizer_steps;
  w[5] = m.world;
  w[6] = m.batch;
  w[7] = int64_t(m.model.param_count);
  w[8] = int64_t(m.model.grad_elems);
  w[9] = int64_t(m.model.layout_hash);
  w[10] = int64_t(m.model.state_elems);
  w[11] = int64_t(m.model.state_hash);
  w[12] = int64_t(m.model.dtype);
  w[13] = int64_t(m.seed);
  std::memcpy(&w[14], &m.loss_scale, 8);
  w[15] = m.loss_scale_good;
  w[16] = m.accumulate;
  std::memcpy(&w[17], &m.best_top1, 8);
  w[18] = m.best_step;
  w[19] = m.eval_pending ? 1 : 0;
  return w;
}

CheckpointMeta meta_from(const int64_t* w) {
  CheckpointMeta m;
  m.step = w[0];
  m.epoch = w[1];
  m.position = {w[2], w[3]};
  m.optimizer_steps = w[4];
  m.world = w[5];
  m.batch = w[6];
  m.model.param_count = uint64_t(w[7]);
  m.model.grad_elems = uint64_t(w[8]);
  m.model.layout_hash = uint64_t(w[9]);
  m.model.state_elems = uint64_t(w[10]);
  m.model.state_hash = uint64_t(w[11]);
  m.model.dtype = DType(w[12]);
  m.seed = uint64_t(w[13]);
  std::memcpy(&m.loss_scale, &w[14], 8);
  m.loss_scale_good = w[15];
  m.accumulate = std::max<int64_t>(1, w[16]);  // 0: written before train.accumulate existed
  std::memcpy(&m.best_top1, &w[17], 8);         // 0, 0: no evaluation yet, or an older file
  m.best_step = w[18];
  m.eval_pending = (w[19] & 1) != 0;
  return m;
}

// "model:\n  name: resnet50" -> "resnet50"; "" when absent (a plain text scan keeps this file free
// of the YAML library).
std::string model_name_in(const std::string& yaml) {
  static const std::regex re(R"(\nmodel:\n\s+name:\s*([A-Za-z0-9_]+))");
  std::smatch m;
  return std::regex_search(yaml, m, re) ? m[1].str() : std::string();
}

}  // namespace

uint64_t checkpoint_hash(const void* data, size_t n, uint64_t h) {
  const char* p = static_cast<const char*>(data);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  return h;
}

void checkpoint_write(const std::string& path, const CheckpointMeta& meta, const std::string& config_yaml,
                      std::span<const float> params, std::span<const float> state,
                      std::span<const float> momentum, std::span<const float> rank_state,
                      std::span<const CheckpointTensor> layout, std::span<const float> ema,
                      std::span<const float> ema_rank_state, std::span<const float> moment2,
                      std::span<const std::string> classes, std::span<const int64_t> tensor_steps) {
  const fs::path final_path(path);
  const std::string dir = final_path.parent_path().empty() ? "." : final_path.parent_path().string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError(str_cat(dir, ": cannot create the checkpoint folder (", ec.message(), ")"));
  const std::string tmp = dir + "/." + final_path.filename().string() + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError(str_cat(tmp, ": cannot create the checkpoint (", os_error(), ")"));
  try {
    Writer w(fd, tmp);
    char header[kHeaderBytes] = {};
    w.raw(header, kHeaderBytes);  // placeholder until the payload's length and hash are known
    auto words = meta_words(meta);
    w.section("meta", words.data(), words.size() * 8);
    w.section("config", config_yaml.data(), config_yaml.size());
    w.section("params", params.data(), params.size_bytes());
    w.section("state", state.data(), state.size_bytes());
    if (!momentum.empty()) w.section("momentum", momentum.data(), momentum.size_bytes());
    if (!moment2.empty()) w.section("moment2", moment2.data(), moment2.size_bytes());
    if (!rank_state.empty()) w.section("bn_ranks", rank_state.data(), rank_state.size_bytes());
    if (!ema.empty()) w.section("ema", ema.data(), ema.size_bytes());
    if (!ema_rank_state.empty()) w.section("ema_bnr", ema_rank_state.data(), ema_rank_state.size_bytes());
    if (!layout.empty()) {
      const std::string text = checkpoint_layout_text(layout);
      w.section("layout", text.data(), text.size());
    }
    if (!tensor_steps.empty()) w.section("tsteps", tensor_steps.data(), tensor_steps.size_bytes());
    if (meta.data_samples > 0) {
      const int64_t data[3] = {meta.data_samples, meta.data_repeats, int64_t(meta.data_order)};
      w.section("data", data, sizeof data);
    }
    if (!classes.empty()) {
      std::string names;
      for (const std::string& c : classes) names += c + '\0';
      w.section("classes", names.data(), names.size());
    }
    std::memcpy(header, kMagic, 8);
    uint32_t sections = w.sections();
    uint64_t bytes = w.bytes(), hash = w.hash();
    std::memcpy(header + 8, &kVersion, 4);
    std::memcpy(header + 12, &sections, 4);
    std::memcpy(header + 16, &bytes, 8);
    std::memcpy(header + 24, &hash, 8);
    if (::lseek(fd, 0, SEEK_SET) != 0) throw CheckpointError(str_cat(tmp, ": seek failed (", os_error(), ")"));
    w.raw(header, kHeaderBytes);
    if (::fsync(fd) != 0) throw CheckpointError(str_cat(tmp, ": fsync failed (", os_error(), ")"));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) throw CheckpointError(str_cat(tmp, ": close failed (", os_error(), ")"));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw CheckpointError(str_cat(path, ": cannot rename the finished checkpoint into place (", os_error(), ")"));
  }
  checkpoint_fsync_dir(dir);
}

Checkpoint checkpoint_read(const std::string& path, const CheckpointParts& keep) {
  auto bad = [&](const std::string& what) { return CheckpointError(str_cat(path, ": ", what)); };
  Reader r(path);
  const size_t size = r.size();
  char header[kHeaderBytes] = {};
  r.read(header, std::min(size, kHeaderBytes), false);
  if (size >= 8 && std::memcmp(header, kMagic, 8) != 0) {
    // torch.save's zip archive, or its older pickle: a state dict to convert first.
    const bool torch_file = std::memcmp(header, "PK\x03\x04", 4) == 0 || static_cast<unsigned char>(header[0]) == 0x80;
    throw bad(torch_file ? "not a ringtrain checkpoint but, by its first bytes, a PyTorch file: convert a state dict "
                           "with tools/torch_weights.py import FILE.pth FILE.rtck"
                         : "not a ringtrain checkpoint (bad magic)");
  }
  if (size < kHeaderBytes) throw bad(str_cat("not a checkpoint: truncated to ", size, " bytes"));
  uint32_t version, nsec;
  uint64_t bytes, hash;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(&nsec, header + 12, 4);
  std::memcpy(&bytes, header + 16, 8);
  std::memcpy(&hash, header + 24, 8);
  if (version != kVersion) throw bad(str_cat("format version ", version, " (this build reads ", kVersion, ")"));
  if (size - kHeaderBytes < bytes)
    throw bad(str_cat("truncated: ", size, " bytes, the header promises ", kHeaderBytes + bytes,
                      " (or the header's length is what was damaged)"));
  if (size - kHeaderBytes > bytes)
    throw bad(str_cat("corrupt: ", size - kHeaderBytes - bytes, " bytes after the payload"));
  const auto checksum_mismatch = [&] {
    return bad("corrupt: checksum mismatch (the file was damaged after it was written)");
  };
  if (bytes % 8 != 0) throw checksum_mismatch();

  Checkpoint ck;
  // The float sections: where each goes when kept, and its length in floats, kept or not (the
  // size checks below hold for skipped ones too).
  struct Floats {
    const char* tag;
    std::vector<float>* to;
    bool kept;
    bool seen = false;
    size_t n = 0;
  };
  Floats params{"params", &ck.params, keep.weights}, state{"state", &ck.state, keep.weights},
      mom{"momentum", &ck.momentum, keep.optimizer}, mom2{"moment2", &ck.moment2, keep.optimizer},
      ranks{"bn_ranks", &ck.rank_state, keep.rank_state}, ema{"ema", &ck.ema, keep.ema},
      ema_ranks{"ema_bnr", &ck.ema_rank_state, keep.ema && keep.rank_state};
  Floats* const float_sections[] = {&params, &state, &mom, &mom2, &ranks, &ema, &ema_ranks};
  bool seen_meta = false, seen_conf = false, seen_layout = false;
  int64_t data_section[3] = {0, 0, 0};  // into the meta once it is read
  std::string layout_text;
  try {
    for (uint32_t s = 0; s < nsec; ++s) {
      if (size - r.offset() < 16) throw bad("corrupt: section table runs past the end");
      char head[16];
      r.read(head, 16);
      char tag[9] = {};
      std::memcpy(tag, head, 8);
      uint64_t len;
      std::memcpy(&len, head + 8, 8);
      const size_t left = size - r.offset();
      if (len > left || padded(len) > left) throw bad(str_cat("corrupt: section '", tag, "' runs past the end"));
      // The section's data into `to` (len bytes) or skipped, then its padding.
      auto take = [&](void* to) {
        if (to) r.read(to, len & ~uint64_t(7));
        else r.skip(len & ~uint64_t(7));
        if (len % 8) {
          char tail[8];
          r.read(tail, 8);
          if (to) std::memcpy(static_cast<char*>(to) + (len & ~uint64_t(7)), tail, len % 8);
        }
      };
      const std::string t(tag);
      Floats* const* f = std::find_if(std::begin(float_sections), std::end(float_sections),
                                      [&](const Floats* x) { return t == x->tag; });
      if (f != std::end(float_sections)) {
        if (len % 4) throw bad(str_cat("corrupt: section '", tag, "' is not whole floats"));
        Floats& sec = **f;
        sec.seen = true;
        sec.n = len / 4;
        if (sec.kept) sec.to->resize(sec.n);
        take(sec.kept && len > 0 ? sec.to->data() : nullptr);  // an empty vector's data() may be null
      } else if (t == "meta") {
        if (len != kMetaWords * 8) throw bad("corrupt: meta section of the wrong size");
        int64_t w[kMetaWords];
        take(w);
        ck.meta = meta_from(w);
        seen_meta = true;
      } else if (t == "config") {
        ck.config_yaml.resize(len);
        take(ck.config_yaml.data());
        seen_conf = true;
      } else if (t == "layout") {
        layout_text.resize(keep.weights ? len : 0);
        take(keep.weights ? layout_text.data() : nullptr);
        seen_layout = true;
      } else if (t == "tsteps") {
        if (len % 8) throw bad("corrupt: section 'tsteps' is not whole 64-bit counts");
        ck.tensor_steps.resize(keep.optimizer ? len / 8 : 0);
        take(keep.optimizer && len > 0 ? ck.tensor_steps.data() : nullptr);
      } else if (t == "data") {
        if (len != 24) throw bad("corrupt: section 'data' of the wrong size");
        int64_t data[3];
        take(data);
        data_section[0] = data[0], data_section[1] = data[1], data_section[2] = data[2];
      } else if (t == "classes") {
        std::string names(len, '\0');
        take(names.data());
        if (!names.empty() && names.back() != '\0') throw bad("corrupt: section 'classes' does not end its last name");
        for (size_t at = 0; at < names.size();) {
          const size_t end = names.find('\0', at);
          ck.classes.push_back(names.substr(at, end - at));
          at = end + 1;
        }
      } else {  // unknown sections are skipped: later versions may add some
        take(nullptr);
      }
    }
    r.skip(kHeaderBytes + bytes - r.offset());
  } catch (const CheckpointError&) {
    // A damaged byte can make any field say anything: the checksum names the damage, when it is that.
    r.skip(kHeaderBytes + bytes - r.offset());
    if (r.hash() != hash) throw checksum_mismatch();
    throw;
  }
  if (r.hash() != hash) throw checksum_mismatch();
  if (!(seen_meta && seen_conf && params.seen && state.seen))
    throw bad("corrupt: a section (meta, config, params, state) is missing");
  ck.meta.data_samples = data_section[0];
  ck.meta.data_repeats = data_section[1];
  ck.meta.data_order = uint64_t(data_section[2]);
  // Without momentum it is a weights file (tools/torch_weights.py import): started from, never resumed.
  ck.weights_only = !mom.seen;
  if (params.n != ck.meta.model.grad_elems || (mom.seen && mom.n != params.n) ||
      (mom2.n && (!mom.seen || mom2.n != params.n)) || state.n != ck.meta.model.state_elems)
    throw bad("corrupt: section sizes disagree with the model fingerprint");
  // Each rank's own statistics: one set per rank that wrote the file.
  for (const Floats* sec : {&ranks, &ema_ranks}) {
    const size_t n = sec->n;
    if (n && (state.n == 0 || ck.meta.world < 1 || n / state.n != uint64_t(ck.meta.world) || n % state.n != 0))
      throw bad(str_cat("corrupt: section '", sec->tag, "' holds ", n, " values, not ", ck.meta.world, " rank(s) x ",
                        state.n));
  }
  if (ema.n && ema.n != params.n + state.n)
    throw bad(str_cat("corrupt: section 'ema' holds ", ema.n, " values, not ", params.n, " + ", state.n,
                      " (parameters and BN statistics)"));
  if (!ema.n && ema_ranks.n) throw bad("corrupt: section 'ema_bnr' without 'ema'");
  if (seen_layout && keep.weights) ck.layout = checkpoint_layout_parse(layout_text, params.n, state.n, path);
  return ck;
}

std::string checkpoint_model_name(const Checkpoint& ck) { return model_name_in("\n" + ck.config_yaml); }

void checkpoint_check_model(const Checkpoint& ck, const std::string& path,
                            const comm::ModelFingerprint& model, const std::string& model_name,
                            const std::string& why) {
  const auto& m = ck.meta.model;
  if (m == model) return;
  std::string theirs = checkpoint_model_name(ck);
  throw CheckpointError(str_cat(path, ": written for another model (", theirs.empty() ? "" : theirs + ", ",
                                m.param_count, " parameters, layout hash ", std::hex, m.layout_hash, std::dec,
                                "); this run builds ", model_name, " (", model.param_count,
                                " parameters, layout hash ", std::hex, model.layout_hash, ")", why));
}

}  // namespace rt::trainer

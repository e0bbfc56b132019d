// Entry functions of the fuzzed input readers (see targets.h): each turns one input's bytes into
// a call of the product's own reader, with files where the reader takes a path.
#include "tools/fuzz/targets.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string_view>

#include "data/dataset.h"
#include "data/image.h"
#include "data/shard.h"
#include "nn/error.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"

namespace rt::fuzz {
namespace {

// A broken invariant is not an rt::Error, so it escapes the entry function: the fuzzer reports
// it as a crash (uncaught exception), the regression test as a failure with this message.
class Broken : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void broken(const std::string& what) { throw Broken("invariant broken: " + what); }

// A private folder for the files a reader needs, made once per process.
const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/rt_fuzz_XXXXXX";
    if (!::mkdtemp(tmpl.data())) broken("cannot create a scratch folder under " + tmpl);
    return tmpl;
  }();
  return dir;
}

std::string write_file(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0)
    broken("cannot write " + path);
  return path;
}

// Open file descriptors of this process: a reader that throws must not leave one open.
int open_fds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (::readdir(d)) ++n;
  ::closedir(d);
  return n;
}

class FdCheck {
 public:
  FdCheck() : before_(open_fds()) {}
  ~FdCheck() noexcept(false) {
    const int after = open_fds();
    if (after != before_) broken(str_cat("file descriptors open: ", before_, " before, ", after, " after"));
  }

 private:
  int before_;
};

template <class F>
bool refused_by_error(F&& f) {
  try {
    f();
    return true;
  } catch (const Error&) {
    return false;
  }
}

void put_u32(std::string& s, size_t at, uint32_t v) { std::memcpy(s.data() + at, &v, 4); }
void put_u64(std::string& s, size_t at, uint64_t v) { std::memcpy(s.data() + at, &v, 8); }

// Makes a shard file's header and index checksums agree with its bytes (when they are there).
void fix_shard_crcs(std::string& s) {
  if (s.size() < 32) return;
  uint64_t index_offset;
  std::memcpy(&index_offset, s.data() + 16, 8);
  if (index_offset <= s.size())
    put_u32(s, 24, data::crc32(s.data() + index_offset, s.size() - index_offset));
  put_u32(s, 28, data::crc32(s.data(), 28));
}

}  // namespace

bool fuzz_config(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string yaml(in.substr(0, nul));
  std::vector<std::string> overrides;
  for (size_t at = nul; at != std::string_view::npos && at < in.size();) {
    const size_t next = in.find('\0', at + 1);
    overrides.emplace_back(in.substr(at + 1, next == std::string_view::npos ? next : next - at - 1));
    at = next;
  }
  trainer::Config cfg;
  if (!refused_by_error([&] { cfg = trainer::config_parse(yaml, "fuzz.yaml", overrides); })) return false;
  if (!refused_by_error([&] { trainer::config_validate(cfg); })) return false;
  // A valid configuration prints, and what it prints reads back to the same configuration (the
  // checkpoint's copy of the config is read this way).
  const std::string printed = trainer::config_to_yaml(cfg);
  trainer::Config again;
  try {
    again = trainer::config_parse(printed, "printed");
    trainer::config_validate(again);
  } catch (const Error& e) {
    broken(str_cat("the printed configuration does not read back: ", e.what(), "\n", printed));
  }
  if (trainer::config_to_yaml(again) != printed)
    broken(str_cat("the printed configuration reads back differently:\n", printed, "---\n",
                   trainer::config_to_yaml(again)));
  trainer::config_schedule(cfg, 3);
  trainer::config_resnet(cfg);
  trainer::config_run_dir(cfg);
  trainer::config_checkpoint_dir(cfg);
  return true;
}

bool fuzz_list(const uint8_t* data, size_t size) {
  const std::string path = write_file("fz.list", {reinterpret_cast<const char*>(data), size});
  FdCheck fds;
  return refused_by_error([&] {
    const int32_t max_label = data::list_max_label(path);
    auto ds = data::open_list(path, 3);
    if (ds->size() <= 0 || ds->num_classes() < max_label + 1 || ds->num_classes() < 3)
      broken(str_cat("list: ", ds->size(), " samples, ", ds->num_classes(), " classes, max label ", max_label));
    for (int64_t i = 0; i < ds->size(); ++i) {
      if (ds->label(i) < 0 || ds->label(i) >= ds->num_classes()) broken(str_cat("label ", ds->label(i)));
      ds->name(i);
    }
  });
}

bool fuzz_shard(const uint8_t* data, size_t size) {
  if (size < 1) return false;
  const bool fix = (data[0] & 1) == 0;
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  static constexpr std::string_view kSep = "\n%%%%\n";
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t next = in.find(kSep, at);
    parts.emplace_back(in.substr(at, next == std::string_view::npos ? next : next - at));
    if (next == std::string_view::npos) break;
    at = next + kSep.size();
  }
  // Stale shards of an earlier input would otherwise be read.
  for (int k = 0; k < 8; ++k) std::remove(str_cat(scratch_dir(), "/fz-0000", k, ".shard").c_str());
  const std::string index = write_file("fz.index", parts[0]);
  for (size_t k = 1; k < parts.size() && k <= 8; ++k) {
    if (fix) fix_shard_crcs(parts[k]);
    write_file(str_cat("fz-0000", k - 1, ".shard"), parts[k]);
  }
  FdCheck fds;
  return refused_by_error([&] {
    auto ds = data::open_shards(index);
    std::vector<uint8_t> buf;
    for (int64_t i = 0; i < ds->size(); ++i) {
      if (ds->label(i) < 0 || ds->label(i) >= ds->num_classes()) broken(str_cat("label ", ds->label(i)));
      ds->name(i);
      ds->read(i, buf);
    }
  });
}

bool fuzz_image(const uint8_t* data, size_t size) {
  if (size < 3) return false;
  const uint8_t flags = data[0];
  const int out = 1 + data[1] % 64;
  static const float kScales[4][2] = {{0.08f, 1.0f}, {1.0f, 1.0f}, {0.5f, 0.5f}, {0.01f, 0.02f}};
  const float* sc = kScales[(flags >> 4) & 3];
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  data::AugmentSpec spec = data::make_augment_spec(out, flags & 1, sc[0], sc[1], flags & 2, mean, std);
  spec.auto_augment.policy = static_cast<data::AutoAugment>(flags >> 6);  // the ops on 1..64-pixel crops
  spec.random_erasing = (flags >> 6) ? 0.5f : 0.0f;
  const uint8_t* img = data + 3;
  const size_t len = size - 3;
  int w = 0, h = 0;
  bool jpeg = false;
  if (data::image_dims(img, len, &w, &h, &jpeg) && (w <= 0 || h <= 0)) broken("image_dims: size <= 0");
  data::jpeg_complete(img, len);
  std::vector<float> chw((flags & 8) ? 0 : 3 * size_t(out) * out);
  std::vector<uint8_t> hwc((flags & 4) ? 3 * size_t(out) * out : 0);
  data::Rng rng(data[2]);
  data::DecodeScratch scratch;
  return data::decode_augment(img, len, spec, rng, scratch, chw.empty() ? nullptr : chw.data(),
                              hwc.empty() ? nullptr : hwc.data());
}

bool fuzz_checkpoint(const uint8_t* data, size_t size) {
  if (size < 1) return false;
  std::string file(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) == 0 && file.size() >= 32 && (file.size() - 32) % 8 == 0) {
    put_u64(file, 16, file.size() - 32);
    put_u64(file, 24, trainer::checkpoint_hash(file.data() + 32, file.size() - 32));
  }
  const std::string path = write_file("fz.rtck", file);
  FdCheck fds;
  return refused_by_error([&] {
    const trainer::Checkpoint ck = trainer::checkpoint_read(path);
    if (ck.params.size() != ck.meta.model.grad_elems ||
        ck.momentum.size() != (ck.weights_only ? 0 : ck.params.size()))
      broken("checkpoint: section sizes disagree with the fingerprint");
    if (!ck.rank_state.empty() && ck.rank_state.size() != ck.state.size() * uint64_t(ck.meta.world))
      broken("checkpoint: bn_ranks does not hold one set of statistics per rank");
    if (!ck.ema.empty() && ck.ema.size() != ck.params.size() + ck.state.size())
      broken("checkpoint: ema does not hold the parameters and the statistics");
    if (!ck.ema_rank_state.empty() &&
        (ck.ema.empty() || ck.ema_rank_state.size() != ck.state.size() * uint64_t(ck.meta.world)))
      broken("checkpoint: ema_bnr does not hold one set of statistics per rank");
    for (const auto& t : ck.layout)
      if (t.offset + t.count > (t.state ? ck.state.size() : ck.params.size()) || t.offset + t.count < t.offset)
        broken("checkpoint: a layout entry lies outside its section");
    comm::ModelFingerprint other = ck.meta.model;
    other.layout_hash ^= 1;
    trainer::checkpoint_check_model(ck, path, ck.meta.model, "same");  // must pass
    try {
      trainer::checkpoint_check_model(ck, path, other, "other");        // must refuse
    } catch (const trainer::CheckpointError&) {
      return;
    }
    broken("checkpoint_check_model accepted another model");
  });
}

FuzzEntry fuzz_entry(const std::string& name) {
  if (name == "config") return fuzz_config;
  if (name == "list") return fuzz_list;
  if (name == "shard") return fuzz_shard;
  if (name == "image") return fuzz_image;
  if (name == "checkpoint") return fuzz_checkpoint;
  return nullptr;
}

std::vector<std::string> fuzz_target_names() { return {"config", "list", "shard", "image", "checkpoint"}; }

}  // namespace rt::fuzz

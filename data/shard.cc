// Shard set writer and reader (format in shard.h).
#include "data/shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nn/error.h"

namespace fs = std::filesystem;

namespace rt::data {
namespace {

constexpr char kMagic[8] = {'R', 'T', 'S', 'H', 'A', 'R', 'D', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 32, kEntry = 24;

// Slicing-by-8 tables: eight bytes per step, a few GB/s, far below decode cost.
struct CrcTables {
  std::array<std::array<uint32_t, 256>, 8> t;
  CrcTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

template <class T>
void put(std::string& out, T v) {  // little-endian on the x86/ARM hosts this runs on
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}
template <class T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

bool pread_all(int fd, void* dst, size_t len, uint64_t off) {
  auto* p = static_cast<uint8_t*>(dst);
  while (len > 0) {
    const ssize_t r = ::pread(fd, p, len, static_cast<off_t>(off));
    if (r <= 0) return false;
    p += r, len -= static_cast<size_t>(r), off += static_cast<uint64_t>(r);
  }
  return true;
}

class ShardDataset final : public Dataset {
 public:
  ShardDataset(const std::string& index_path, const std::string& expect_split) {
    try {
      load(index_path, expect_split);
    } catch (...) {  // a constructor that throws runs no destructor
      close_all();
      throw;
    }
  }
  ~ShardDataset() override { close_all(); }
  int64_t size() const override { return static_cast<int64_t>(recs_.size()); }
  const std::vector<std::string>& class_names() const override { return classes_; }
  int32_t label(int64_t i) const override { return recs_[static_cast<size_t>(i)].label; }

  bool read(int64_t i, std::vector<uint8_t>& buf) const override {
    const Rec& r = recs_[static_cast<size_t>(i)];
    buf.resize(r.size);
    if (r.size == 0) return false;  // packed from an unreadable file
    const Shard& s = shards_[r.shard];
    if (!pread_all(s.fd, buf.data(), r.size, r.offset))
      throw Error(str_cat("data: shard ", s.path, ": cannot read record ", i - s.first));
    if (crc32(buf.data(), buf.size()) != r.crc)
      throw Error(str_cat("data: shard ", s.path, ": checksum mismatch in record ", i - s.first,
                          " (the file is damaged; re-pack it)"));
    return true;
  }

  std::string name(int64_t i) const override {
    const Rec& r = recs_[static_cast<size_t>(i)];
    const Shard& s = shards_[r.shard];
    return str_cat(s.path, " record ", i - s.first, " (", record_name(s, i - s.first), ")");
  }
  uint64_t order_hash() const override { return order_hash_ + (order_hash_ == 0); }

 private:
  struct Rec {
    uint64_t offset;
    uint32_t size;
    int32_t label;
    uint32_t crc;
    uint32_t shard;
  };
  struct Shard {
    std::string path;
    int fd = -1;
    int64_t first = 0;            // global index of its first record
    int64_t count = 0;
    uint64_t index_offset = 0;
    uint64_t file_size = 0;
  };

  // Reads the record's name from the shard's names block (messages only, so not kept in memory).
  std::string record_name(const Shard& s, int64_t k) const {
    uint8_t e[kEntry];
    if (!pread_all(s.fd, e, kEntry, s.index_offset + kEntry * k)) return "?";
    const uint64_t names = s.index_offset + kEntry * s.count;
    char buf[4096] = {};
    const uint64_t at = names + get<uint32_t>(e + 20);
    if (at >= s.file_size) return "?";
    pread_all(s.fd, buf, std::min<uint64_t>(sizeof(buf) - 1, s.file_size - at), at);
    return std::string(buf, strnlen(buf, sizeof(buf) - 1));
  }

  void close_all() {
    for (const Shard& s : shards_) ::close(s.fd);
    shards_.clear();
  }

  [[noreturn]] static void bad(const std::string& where, const std::string& what) {
    throw Error(str_cat("data: shard set ", where, ": ", what));
  }

  void load(const std::string& index_path, const std::string& expect_split);
  void open_shard(const std::string& path, int64_t count, int64_t bytes);

  std::vector<Shard> shards_;
  std::vector<Rec> recs_;
  uint64_t order_hash_ = kOrderHashSeed;  // over the records' names as the index is read
  std::vector<std::string> classes_;
};

void ShardDataset::load(const std::string& index_path, const std::string& expect_split) {
  if (fs::is_directory(index_path))
    bad(index_path, "is a folder, not a shard index (the text file PREFIX.index that pack_dataset writes)");
  std::ifstream in(index_path);
  if (!in) bad(index_path, "cannot open the index file");
  const fs::path base = fs::path(index_path).parent_path();
  std::string line, word;
  int64_t no = 0, samples = -1, nclasses = -1, nshards = -1;
  auto next = [&](const char* key) -> std::istringstream {
    if (!std::getline(in, line)) bad(index_path, str_cat("ends before \"", key, "\""));
    ++no;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // written on Windows
    std::istringstream ls(line);
    if (!(ls >> word) || word != key) {
      // A shard file (or any binary) given as the index: its bytes are no message.
      const bool text = std::all_of(line.begin(), line.end(), [](char ch) { return ch == '\t' || uint8_t(ch) >= 0x20; });
      bad(str_cat(index_path, ":", no),
          text ? str_cat("expected \"", key, "\", got \"", line.substr(0, 200), "\"")
               : str_cat("expected \"", key, "\", got binary data (the index is the text file PREFIX.index, not a "
                         ".shard file)"));
    }
    return ls;
  };
  int version = 0;
  if (!(next("ringtrain-shards") >> version) || version != 1)
    bad(str_cat(index_path, ":1"), "not a ringtrain shard index of version 1");
  std::string split;
  next("split") >> split;
  if (!expect_split.empty() && split != expect_split)
    bad(str_cat(index_path, ":", no), str_cat("packs the ", split, " split, not ", expect_split,
                                             " (are data.train_shards and data.val_shards swapped?)"));
  if (!(next("samples") >> samples) || samples < 0) bad(str_cat(index_path, ":", no), "bad sample count");
  if (!(next("classes") >> nclasses) || nclasses < 1) bad(str_cat(index_path, ":", no), "bad class count");
  for (int64_t c = 0; c < nclasses; ++c) {
    next("class");
    classes_.push_back(line.size() > 6 ? line.substr(6) : "");
  }
  if (!(next("shards") >> nshards) || nshards < 1) bad(str_cat(index_path, ":", no), "bad shard count");
  for (int64_t k = 0; k < nshards; ++k) {
    std::istringstream ls = next("shard");
    int64_t count = -1, bytes = -1;
    std::string file;
    if (!(ls >> count >> bytes) || count < 0 || bytes < 0 || !std::getline(ls >> std::ws, file) || file.empty())
      bad(str_cat(index_path, ":", no), "expected \"shard <records> <bytes> <file>\"");
    const fs::path fp(file);
    open_shard(fp.is_absolute() ? file : (base / fp).string(), count, bytes);
  }
  if (static_cast<int64_t>(recs_.size()) != samples)
    bad(index_path, str_cat("shards hold ", recs_.size(), " records, the index says ", samples));
  if (samples == 0) bad(index_path, "no samples");
}

void ShardDataset::open_shard(const std::string& path, int64_t count, int64_t bytes) {
  Shard s;
  s.path = path;
  s.first = static_cast<int64_t>(recs_.size());
  s.count = count;
  s.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (s.fd < 0) bad(path, "cannot open");
  shards_.push_back(s);  // closed by close_all from here on, even if the checks below throw
  struct stat st;
  if (::fstat(s.fd, &st) != 0) bad(path, "cannot stat");
  s.file_size = static_cast<uint64_t>(st.st_size);
  if (static_cast<int64_t>(s.file_size) != bytes)
    bad(path, str_cat("is ", s.file_size, " bytes, the index says ", bytes, " (truncated or replaced?)"));
  uint8_t h[kHeader];
  if (s.file_size < kHeader || !pread_all(s.fd, h, kHeader, 0) || std::memcmp(h, kMagic, 8) != 0)
    bad(path, "bad magic: not a ringtrain shard");
  if (get<uint32_t>(h + 8) != kVersion) bad(path, str_cat("unsupported version ", get<uint32_t>(h + 8)));
  if (crc32(h, 28) != get<uint32_t>(h + 28)) bad(path, "header checksum mismatch");
  if (get<uint32_t>(h + 12) != count)
    bad(path, str_cat("holds ", get<uint32_t>(h + 12), " records, the index says ", count));
  s.index_offset = get<uint64_t>(h + 16);
  if (s.index_offset < kHeader || s.index_offset > s.file_size ||
      kEntry * static_cast<uint64_t>(count) > s.file_size - s.index_offset)
    bad(path, "index offset out of range");
  std::vector<uint8_t> index(s.file_size - s.index_offset);
  if (!pread_all(s.fd, index.data(), index.size(), s.index_offset)) bad(path, "cannot read the index");
  if (crc32(index.data(), index.size()) != get<uint32_t>(h + 24)) bad(path, "index checksum mismatch");
  shards_.back() = s;
  recs_.reserve(recs_.size() + static_cast<size_t>(count));  // count fits in the file: checked above
  for (int64_t k = 0; k < count; ++k) {
    const uint8_t* e = index.data() + kEntry * k;
    Rec r{get<uint64_t>(e), get<uint32_t>(e + 8), get<int32_t>(e + 12), get<uint32_t>(e + 16),
          static_cast<uint32_t>(shards_.size() - 1)};
    if (r.offset < kHeader || r.offset > s.index_offset || r.size > s.index_offset - r.offset)
      bad(path, str_cat("record ", k, " lies outside the data area"));
    if (r.label < 0 || r.label >= static_cast<int32_t>(classes_.size()))
      bad(path, str_cat("record ", k, " has label ", r.label, " outside the ", classes_.size(), " classes"));
    // The names block holds each record's path: hashed like a folder's files (no name: "").
    const uint64_t names = kEntry * static_cast<uint64_t>(count), at = names + get<uint32_t>(e + 20);
    std::string_view name;
    if (at < index.size())
      name = {reinterpret_cast<const char*>(index.data() + at), strnlen(reinterpret_cast<const char*>(index.data() + at), index.size() - at)};
    order_hash_ = order_hash_add(order_hash_, r.label, name);
    recs_.push_back(r);
  }
}

// Writes one shard at a time under a temporary name (PackStats tracks what was written).
// PREFIX-00000.shard, ...: the k-th shard of a set.
std::string shard_file(const std::string& prefix, size_t k) {
  char num[16];
  std::snprintf(num, sizeof(num), "-%05zu.shard", k);
  return prefix + num;
}

class ShardWriter {
 public:
  ShardWriter(const std::string& prefix, int64_t limit) : prefix_(prefix), limit_(limit) {}

  void add(const std::vector<uint8_t>& bytes, int32_t label, const std::string& name) {
    if (!out_.is_open() || (count_ > 0 && data_end_ + static_cast<int64_t>(bytes.size()) > limit_)) open_next();
    put<uint64_t>(entries_, static_cast<uint64_t>(data_end_));
    put<uint32_t>(entries_, static_cast<uint32_t>(bytes.size()));
    put<int32_t>(entries_, label);
    put<uint32_t>(entries_, crc32(bytes.data(), bytes.size()));
    put<uint32_t>(entries_, static_cast<uint32_t>(names_.size()));
    names_.append(name).push_back('\0');
    out_.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    data_end_ += static_cast<int64_t>(bytes.size());
    ++count_;
  }

  // Closes the last shard; returns (final name, temp name, records, bytes) of every shard.
  struct Done { std::string file, tmp; int64_t count, bytes; };
  std::vector<Done> finish() {
    close_current();
    return done_;
  }

 private:
  void open_next() {
    close_current();
    file_ = shard_file(prefix_, done_.size());
    out_.open(file_ + ".tmp", std::ios::binary | std::ios::trunc);
    if (!out_) throw Error(str_cat("pack: cannot create ", file_, ".tmp"));
    out_.write(std::string(kHeader, '\0').data(), kHeader);  // header written last
    data_end_ = kHeader;
    count_ = 0;
    entries_.clear();
    names_.clear();
  }

  void close_current() {
    if (!out_.is_open()) return;
    const std::string index = entries_ + names_;
    out_.write(index.data(), static_cast<std::streamsize>(index.size()));
    std::string h(kMagic, 8);
    put<uint32_t>(h, kVersion);
    put<uint32_t>(h, static_cast<uint32_t>(count_));
    put<uint64_t>(h, static_cast<uint64_t>(data_end_));
    put<uint32_t>(h, crc32(index.data(), index.size()));
    put<uint32_t>(h, crc32(h.data(), h.size()));
    out_.seekp(0);
    out_.write(h.data(), static_cast<std::streamsize>(h.size()));
    out_.close();
    if (!out_) throw Error(str_cat("pack: error writing ", file_, ".tmp"));
    done_.push_back({file_, file_ + ".tmp", count_, data_end_ + static_cast<int64_t>(index.size())});
  }

  std::string prefix_, file_;
  int64_t limit_;
  std::ofstream out_;
  int64_t data_end_ = 0, count_ = 0;
  std::string entries_, names_;
  std::vector<Done> done_;
};

}  // namespace

std::unique_ptr<Dataset> open_shards(const std::string& index_path, const std::string& expect_split) {
  return std::make_unique<ShardDataset>(index_path, expect_split);
}

namespace {
// The packing itself, into temporary files renamed into place at the end (st: the stats so far).
PackStats pack_into(const Dataset& ds, const std::string& split, const std::string& prefix, int64_t shard_bytes,
                    const std::string& strip, PackStats st);
}  // namespace

PackStats pack_shards(const Dataset& ds, const std::string& split, const std::string& prefix,
                      int64_t shard_bytes, const std::string& strip) {
  PackStats st;
  // The index keeps one class name per line.
  for (const std::string& c : ds.class_names())
    if (c.find_first_of("\n\r") != std::string::npos)
      throw Error(str_cat("pack: class name \"", c, "\" holds a line break, which a shard index cannot keep: ",
                          "rename its folder"));
  const fs::path dir = fs::path(prefix).parent_path();
  std::error_code ec;
  if (!dir.empty()) fs::create_directories(dir, ec);
  // On any failure the temporary files go: no half-written shard is left beside the sources.
  try {
    return pack_into(ds, split, prefix, shard_bytes, strip, st);
  } catch (...) {
    std::error_code e2;
    for (size_t k = 0; fs::remove(shard_file(prefix, k) + ".tmp", e2); ++k) {
    }
    fs::remove(prefix + ".index.tmp", e2);
    throw;
  }
}

namespace {

PackStats pack_into(const Dataset& ds, const std::string& split, const std::string& prefix, int64_t shard_bytes,
                    const std::string& strip, PackStats st) {
  ShardWriter w(prefix, shard_bytes);
  std::vector<uint8_t> bytes;
  for (int64_t i = 0; i < ds.size(); ++i) {
    std::string name = ds.name(i);
    if (!strip.empty() && name.compare(0, strip.size(), strip) == 0) name = name.substr(strip.size());
    while (!name.empty() && name[0] == '/') name.erase(0, 1);
    if (!ds.read(i, bytes)) {
      std::fprintf(stderr, "pack: warning: cannot read %s: packed as an empty record\n", ds.name(i).c_str());
      bytes.clear();
      ++st.unreadable;
    }
    w.add(bytes, ds.label(i), name);
    st.bytes += static_cast<int64_t>(bytes.size());
  }
  const std::vector<ShardWriter::Done> done = w.finish();
  st.samples = ds.size();
  st.shards = static_cast<int64_t>(done.size());
  std::ostringstream idx;
  idx << "ringtrain-shards 1\nsplit " << split << "\nsamples " << ds.size() << "\nclasses "
      << ds.num_classes() << "\n";
  for (const std::string& c : ds.class_names()) idx << "class " << c << "\n";
  idx << "shards " << done.size() << "\n";
  for (const auto& d : done)
    idx << "shard " << d.count << " " << d.bytes << " " << fs::path(d.file).filename().string() << "\n";
  st.index_path = prefix + ".index";
  {
    std::ofstream out(st.index_path + ".tmp", std::ios::trunc);
    out << idx.str();
    out.close();
    if (!out) throw Error(str_cat("pack: error writing ", st.index_path, ".tmp"));
  }
  for (const auto& d : done) fs::rename(d.tmp, d.file);
  fs::rename(st.index_path + ".tmp", st.index_path);  // last: the set is complete only now
  // Shards of an earlier, larger set under the same prefix belong to no index now.
  std::error_code ec;
  for (size_t k = done.size(); fs::remove(shard_file(prefix, k), ec); ++k) {
  }
  return st;
}

}  // namespace

uint32_t crc32(const void* data, size_t len, uint32_t crc) {
  static const CrcTables tabs;
  const auto& t = tabs.t;
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  while (len >= 8) {
    const uint32_t a = get<uint32_t>(p) ^ crc, b = get<uint32_t>(p + 4);
    crc = t[7][a & 0xff] ^ t[6][(a >> 8) & 0xff] ^ t[5][(a >> 16) & 0xff] ^ t[4][a >> 24] ^
          t[3][b & 0xff] ^ t[2][(b >> 8) & 0xff] ^ t[1][(b >> 16) & 0xff] ^ t[0][b >> 24];
    p += 8, len -= 8;
  }
  while (len--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

}  // namespace rt::data

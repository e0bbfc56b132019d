// The algorithm cache file's lines: formatting, reading back, appending (see conv_algo_file.h).
#include "cuda/conv_algo_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nn/error.h"

namespace rt::cuda {
namespace {

std::string clean(std::string s) {
  for (char& c : s)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return s;
}

// Reads "<algo> <math>" for one direction: an algorithm below `count` and a math type we choose
// (never CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, which would let fp32 run in fp16).
template <class Algo>
bool read_pair(std::istringstream& in, int count, Algo* algo, cudnnMathType_t* math) {
  long a = -1, m = -1;
  if (!(in >> a >> m)) return false;
  if (a < 0 || a >= count ||
      (m != CUDNN_DEFAULT_MATH && m != CUDNN_TENSOR_OP_MATH && m != CUDNN_FMA_MATH))
    return false;
  *algo = Algo(a);
  *math = cudnnMathType_t(m);
  return true;
}

bool parse(const std::string& fields, ConvAlgos* a) {
  std::istringstream in(fields);
  if (!read_pair(in, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &a->fwd, &a->fwd_math) ||
      !read_pair(in, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &a->bwd_data, &a->bwd_data_math) ||
      !read_pair(in, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &a->bwd_filter, &a->bwd_filter_math))
    return false;
  std::string rest;
  return !(in >> rest);  // nothing after the six numbers
}

std::string errno_text() { return std::strerror(errno); }

// Writes all of text to fd (one write, short of a signal or a full disk) and closes it.
void write_and_close(int fd, const std::string& path, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      close(fd);
      throw Error(str_cat("algorithm cache ", path, ": write failed: ", why));
    }
    done += size_t(n);
  }
  if (close(fd) != 0) throw Error(str_cat("algorithm cache ", path, ": write failed: ", errno_text()));
}

}  // namespace

std::string algo_file_line(const std::string& identity, const std::string& key, const ConvAlgos& a) {
  return str_cat(clean(identity), '\t', clean(key), '\t', int(a.fwd), ' ', int(a.fwd_math), ' ',
                 int(a.bwd_data), ' ', int(a.bwd_data_math), ' ', int(a.bwd_filter), ' ',
                 int(a.bwd_filter_math), '\n');
}

AlgoFileContents read_algo_file(const std::string& path, const std::string& identity) {
  AlgoFileContents out;
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) return out;
  if (std::filesystem::is_directory(st))
    throw Error(str_cat("algorithm cache ", path, ": is a directory, not a file"));
  std::ifstream f(path);
  if (!f) throw Error(str_cat("algorithm cache ", path, ": cannot read: ", errno_text()));
  const std::string id = clean(identity);
  std::string line;
  for (int64_t no = 1; std::getline(f, line); ++no) {
    if (line.empty() || line[0] == '#') continue;
    const size_t t1 = line.find('\t'), t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
    ConvAlgos a;
    if (t2 == std::string::npos || t1 == 0 || t2 == t1 + 1 || !parse(line.substr(t2 + 1), &a)) {
      if (out.malformed++ == 0) out.first_malformed = no;
      continue;
    }
    ++out.lines;
    if (line.compare(0, t1, id) == 0 && t1 == id.size())
      out.choices[line.substr(t1 + 1, t2 - t1 - 1)] = a;  // a later line of a key wins
  }
  if (f.bad()) throw Error(str_cat("algorithm cache ", path, ": read failed: ", errno_text()));
  return out;
}

void prepare_algo_file(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::is_directory(parent) &&
      !std::filesystem::create_directories(parent, ec) && ec)
    throw Error(str_cat("algorithm cache ", path, ": cannot create its folder: ", ec.message()));
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {  // new: say what it holds (a rank that loses the race finds it existing)
    write_and_close(fd, path, "# ringtrain cuDNN convolution algorithm choices: identity TAB shape TAB "
                              "fwd math bwd-data math bwd-filter math (cuda.algo_cache)\n");
    return;
  }
  if (errno != EEXIST) throw Error(str_cat("algorithm cache ", path, ": cannot create: ", errno_text()));
  const int existing = open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (existing < 0) throw Error(str_cat("algorithm cache ", path, ": cannot append: ", errno_text()));
  // A run killed mid-append leaves a last line without its end: the next line appended would be
  // glued to it, and the choice it holds read as another's. A blank line is harmless.
  char last = '\n';
  struct stat st;
  if (fstat(existing, &st) == 0 && st.st_size > 0 && pread(existing, &last, 1, st.st_size - 1) != 1) last = '\n';
  if (last != '\n') {
    write_and_close(existing, path, "\n");
    return;
  }
  close(existing);
}

void append_algo_file(const std::string& path, const std::string& line) {
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(str_cat("algorithm cache ", path, ": cannot append: ", errno_text()));
  write_and_close(fd, path, line);
}

}  // namespace rt::cuda

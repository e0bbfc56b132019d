// ConvAlgoCache: this run's choices, and the file that keeps them across runs.
#include "cuda/conv_algo_cache.h"

#include <algorithm>

#include "cuda/conv_algo_file.h"
#include "nn/error.h"

namespace rt::cuda {

void ConvAlgoCache::use_file(const std::string& path, const std::string& identity) {
  prepare_algo_file(path);
  AlgoFileContents c = read_algo_file(path, identity);
  stored_ = std::move(c.choices);
  malformed_ = c.malformed;
  first_malformed_ = c.first_malformed;
  file_ = path;
  identity_ = identity;
}

const ConvAlgos* ConvAlgoCache::find(const std::string& key) {
  const auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  ++reused_;
  return &it->second;
}

const ConvAlgos* ConvAlgoCache::stored(const std::string& key) const {
  const auto it = stored_.find(key);
  return it == stored_.end() ? nullptr : &it->second;
}

ConvCandidate direction(const ConvAlgos& a, int dir) {
  switch (dir) {
    case 0: return {int(a.fwd), a.fwd_math, a.workspace};
    case 1: return {int(a.bwd_data), a.bwd_data_math, a.workspace};
    default: return {int(a.bwd_filter), a.bwd_filter_math, a.workspace};
  }
}

void set_direction(ConvAlgos& a, int dir, const ConvCandidate& c) {
  switch (dir) {
    case 0: a.fwd = cudnnConvolutionFwdAlgo_t(c.algo), a.fwd_math = c.math; break;
    case 1: a.bwd_data = cudnnConvolutionBwdDataAlgo_t(c.algo), a.bwd_data_math = c.math; break;
    default: a.bwd_filter = cudnnConvolutionBwdFilterAlgo_t(c.algo), a.bwd_filter_math = c.math;
  }
}

void ConvAlgoCache::add(const std::string& key, const ConvAlgos& a, bool from_file) {
  map_.emplace(key, a);
  if (from_file)
    ++loaded_;
  else
    append(key, a);
}

const ConvAlgos* ConvAlgoCache::current(const std::string& key) const {
  const auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

bool ConvAlgoCache::revise(const std::string& key, const ConvAlgos& a, int dir) {
  ConvAlgos& held = map_[key];
  const ConvCandidate was = direction(held, dir), now = direction(a, dir);
  if (was.algo == now.algo && was.math == now.math) return false;
  set_direction(held, dir, now);
  held.next[dir] = a.next[dir];
  held.workspace = std::max(held.workspace, a.workspace);
  ++revised_;
  append(key, held);  // the file's last line of a key wins
  return true;
}

void ConvAlgoCache::append(const std::string& key, const ConvAlgos& a) {
  if (file_.empty() || !append_error_.empty()) return;
  // The run itself does not need the file: a full disk costs later runs the timing, not this one.
  try {
    append_algo_file(file_, algo_file_line(identity_, key, a));
  } catch (const Error& e) {
    append_error_ = e.what();
  }
}

std::string ConvAlgoCache::summary() const {
  std::string s = str_cat(shapes(), " convolution shape", shapes() == 1 ? "" : "s", " for ",
                          shapes() + reused_, " layer", shapes() + reused_ == 1 ? "" : "s");
  if (file_.empty()) return s;
  s += str_cat("; ", loaded_, " choice", loaded_ == 1 ? "" : "s", " read from ", file_);
  if (malformed_ > 0)
    s += str_cat(" (", malformed_, " malformed line", malformed_ == 1 ? "" : "s",
                 " ignored, the first at line ", first_malformed_, ")");
  s += str_cat(", ", shapes() - loaded_);
  return s + (append_error_.empty() ? " added to it" : str_cat(" new, not kept: ", append_error_));
}

}  // namespace rt::cuda

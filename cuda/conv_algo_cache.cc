// ConvAlgoCache: this run's choices, and the file that keeps them across runs.
#include "cuda/conv_algo_cache.h"

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

void ConvAlgoCache::add(const std::string& key, const ConvAlgos& a, bool from_file) {
  map_.emplace(key, a);
  if (from_file) {
    ++loaded_;
  } else if (!file_.empty() && append_error_.empty()) {
    // The run itself does not need the file: a full disk costs later runs the timing, not this one.
    try {
      append_algo_file(file_, algo_file_line(identity_, key, a));
    } catch (const Error& e) {
      append_error_ = e.what();
    }
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

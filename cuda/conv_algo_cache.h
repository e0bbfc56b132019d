// What a convolution's algorithm choice is remembered by: cuDNN's choice depends only on the
// descriptors (shape, format, type, math) and the context's configuration, so a model's layers of
// one shape share it. ResNet-50 has 53 convolutions of 23 distinct shapes; with timed choice
// (cudnnFind*, every candidate run on the layer's full batch) the set-up time is that of the
// distinct shapes, as PyTorch's cudnn.benchmark cache; with a file (cuda.algo_cache,
// conv_algo_file.h) that of the shapes no earlier run on this GPU and software chose for.
#pragma once
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rt::cuda {

// One direction's candidate: its algorithm (that direction's enum as an int), the math type the
// direction's descriptor is set to for it, and the workspace cuDNN's size query confirmed.
struct ConvCandidate {
  int algo = 0;
  cudnnMathType_t math{};
  size_t workspace = 0;
};

struct ConvAlgos {
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  // The math type each direction's descriptor is set to for its algorithm.
  cudnnMathType_t fwd_math{}, bwd_data_math{}, bwd_filter_math{};
  size_t workspace = 0;  // bytes: the largest of the three
  // Per direction (forward, backward-data, backward-filter), the candidates ranked after the
  // chosen one whose workspace cuDNN confirmed within the limit, in rank order: where a first run
  // that cuDNN refuses moves on to (conv_run.h). For a choice read from the file, the heuristic
  // ranking's candidates other than it.
  std::vector<ConvCandidate> next[3];
};

// Direction dir (0 forward, 1 backward-data, 2 backward-filter) of a as a candidate, with a's
// workspace (the most any of its directions needs); and a with direction dir set to c's
// algorithm and math type (its workspace left to the caller).
ConvCandidate direction(const ConvAlgos& a, int dir);
void set_direction(ConvAlgos& a, int dir, const ConvCandidate& c);

// One context's choices (its device and ContextConfig are fixed), keyed by conv_algo_key, and
// optionally a file that keeps them across runs (conv_algo_file.h). Used at set-up on the thread
// that builds the model, as the context's other set-up calls, then by revise() on the thread
// that runs the layers (the context's stream has one), never by two at once.
class ConvAlgoCache {
 public:
  // Reads the choices `identity` (what they depend on besides the shape) made in earlier runs
  // from path, creating it if need be; add() then appends each new choice. Throws rt::Error
  // naming path when it cannot be read or appended to.
  void use_file(const std::string& path, const std::string& identity);

  // The choice made (or taken from the file) earlier in this run for key, counted in reused(),
  // or nullptr.
  const ConvAlgos* find(const std::string& key);
  // The file's choice for key, not yet checked against this run's descriptors, or nullptr.
  const ConvAlgos* stored(const std::string& key) const;
  // Remembers a for key; appends it to the file unless it came from there (from_file, counted
  // in loaded()). A failed append stops the appending and shows in summary(), nothing more.
  void add(const std::string& key, const ConvAlgos& a, bool from_file = false);
  // The choice in use for key, as revise() left it, or nullptr; not counted in reused().
  const ConvAlgos* current(const std::string& key) const;
  // Takes direction dir (0 forward, 1 backward-data, 2 backward-filter) of a, which a layer's
  // first run moved to another candidate (conv_run.h), into key's choice, the other directions
  // kept, and appends the result to the file; false (nothing done) when key's choice already
  // runs that algorithm there.
  bool revise(const std::string& key, const ConvAlgos& a, int dir);

  int64_t shapes() const { return int64_t(map_.size()); }  // choices in use
  int64_t reused() const { return reused_; }                // layers that took one made earlier
  int64_t loaded() const { return loaded_; }                // choices taken from the file
  int64_t revised() const { return revised_; }              // directions revise() moved
  // One line for the log: how many shapes, where their choices came from, and any lines of the
  // file that were ignored.
  std::string summary() const;

 private:
  std::map<std::string, ConvAlgos> map_;
  std::map<std::string, ConvAlgos> stored_;
  void append(const std::string& key, const ConvAlgos& a);
  int64_t reused_ = 0, loaded_ = 0, revised_ = 0;
  std::string file_, identity_, append_error_;
  int64_t malformed_ = 0, first_malformed_ = 0;
};

}  // namespace rt::cuda

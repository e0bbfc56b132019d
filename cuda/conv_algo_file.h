// Convolution algorithm choices kept in a file across runs (`cuda.algo_cache`), so that a job
// pays for timing cuDNN's candidates (cudnnFind*, seconds for ResNet-50 at batch 256) once per
// machine and configuration, not every start. One choice per line, tab-separated:
//   <identity> TAB <shape key> TAB <fwd> <fwd math> <bwd-data> <bwd-data math> <bwd-filter> <bwd-filter math>
// The identity names what a choice depends on besides the shape (device model, cuDNN and CUDA
// versions, the context's settings), so lines of other GPUs or settings share a file and are
// left alone. Lines are only appended, each in one write: ranks sharing a file append whole
// lines (O_APPEND on a local file system; not on NFS), and the last line of a key wins when read.
// A choice read back is checked against cuDNN before use (conv_choose_algos), but whether an
// algorithm is deterministic cuDNN says only when ranking: under a deterministic identity the
// file is trusted on that.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "cuda/conv_algo_cache.h"

namespace rt::cuda {

// The line for one choice, newline included. Tabs and newlines in identity or key (a device name
// could hold anything) become spaces, so that the line reads back.
std::string algo_file_line(const std::string& identity, const std::string& key, const ConvAlgos& a);

struct AlgoFileContents {
  std::map<std::string, ConvAlgos> choices;  // this identity's, by key; workspace left 0
  int64_t lines = 0;           // choice lines read, of every identity
  int64_t malformed = 0;       // lines that are not a choice (a torn write, an edit): ignored
  int64_t first_malformed = 0; // the first one's line number (1-based), when malformed > 0
};

// Reads path's choices for `identity`. A missing file reads as empty; comment lines start with
// '#'. An unreadable file throws rt::Error naming it.
AlgoFileContents read_algo_file(const std::string& path, const std::string& identity);

// Creates path (with a comment line saying what it holds, and its missing parent folders, as a
// cache under ~/.cache would want) when it does not exist and checks that it can be appended to;
// throws rt::Error naming it otherwise.
void prepare_algo_file(const std::string& path);

// Appends one line in one write; throws rt::Error naming path when it cannot.
void append_algo_file(const std::string& path, const std::string& line);

}  // namespace rt::cuda

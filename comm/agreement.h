// Start-up agreement between ranks: every rank must have built the same model (parameter count
// and a hash of the layout) and chosen the same comm settings; and rank 0's initial parameters
// and BN buffers are broadcast so that all replicas start identical.
#pragma once
#include <cstdint>
#include <string>

#include "comm/allreduce.h"
#include "comm/communicator.h"
#include "nn/arena.h"

namespace rt::comm {

// FNV-1a 64 over bytes: the fingerprints' hash (and that of anything else the ranks compare).
class Fnv {
 public:
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 1099511628211ull;
  }
  void add_u64(uint64_t v) { add(&v, sizeof v); }
  void add_str(const std::string& s) {
    add_u64(s.size());
    add(s.data(), s.size());
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 1469598103934665603ull;
};

// What identifies a model's flat buffers. Two ranks with equal fingerprints lay out gradients
// identically, so their buckets pair up element for element.
struct ModelFingerprint {
  uint64_t param_count = 0;  // trained scalars
  uint64_t grad_elems = 0;   // gradient buffer length, alignment padding included
  uint64_t layout_hash = 0;  // FNV-1a over every parameter's name, dims, kind, offset, count
  uint64_t state_elems = 0;  // BN running statistics
  uint64_t state_hash = 0;   // over their names, offsets, counts
  DType dtype = DType::f32;  // gradient element type
  bool operator==(const ModelFingerprint&) const = default;
};

ModelFingerprint model_fingerprint(const Arena<float>& arena);
// For a bare buffer without a model (benchmarks, tests): count and type only.
ModelFingerprint buffer_fingerprint(size_t count, DType t);

// Collective. Compares every rank's model fingerprint and settings (and the communicator's
// per-call limit) with rank 0's. On any difference every rank throws the same rt::CommError
// naming each differing rank, the field and both values, e.g.
//   "ranks disagree at start-up: rank 3 has bucket_bytes 1048576 (rank 0: 26214400)".
// One fixed-size allgather: it cannot hang or mis-sum whatever the ranks hold.
void comm_check_agreement(Communicator& comm, const ModelFingerprint& model, const CommConfig& cfg);

// Collective. Copies root's parameters and state (BN running statistics) to every rank.
void broadcast_model(Communicator& comm, Arena<float>& arena, int root = 0);

}  // namespace rt::comm

// Start-up agreement between ranks: every rank must have built the same model (parameter count
// and a hash of the layout) and chosen the same comm settings; and rank 0's initial parameters
// and BN buffers are broadcast so that all replicas start identical.
#pragma once
#include <cstdint>

#include "comm/allreduce.h"
#include "comm/communicator.h"
#include "nn/arena.h"

namespace rt::comm {

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

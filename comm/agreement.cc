// Start-up agreement: model fingerprints and settings compared across ranks; model broadcast.
#include "comm/agreement.h"

#include <cstring>
#include <string>
#include <vector>

#include "comm/mpi_check.h"

namespace rt::comm {

namespace {

// The record every rank contributes; fixed size so one MPI_Allgather carries it.
enum Field : int {
  kParamCount, kGradElems, kLayoutHash, kStateElems, kStateHash, kDType, kAlgorithm,
  kBucketBytes, kOverlap, kSegmentBytes, kCheckCounts, kMaxElemsPerCall, kStallCheck, kNetworkSegmentBytes,
  kDevicePath, kCompression, kRanksPerNode, kRingOrder, kNumFields
};
constexpr const char* kFieldNames[kNumFields] = {
    "parameter count", "gradient buffer length", "model layout hash", "state length",
    "state layout hash", "gradient type", "comm.algorithm", "comm.bucket_bytes", "comm.overlap",
    "comm.segment_bytes", "check_counts", "MPI elements per call", "the stall check (comm.stall_*)",
    "comm.network_segment_bytes", "comm.device_path", "comm.compression", "comm.ranks_per_node", "comm.ring_order"};

struct Record {
  uint64_t field[kNumFields];
  char algorithm[24];  // for the message; the hash in field[kAlgorithm] decides
  char device_path[24];  // the same for field[kDevicePath]
  char compression[8];   // and field[kCompression]
};

std::string field_value(const Record& r, int f) {
  if (f == kAlgorithm) return str_cat("'", r.algorithm, "'");
  if (f == kDevicePath) return str_cat("'", r.device_path, "'");
  if (f == kCompression) return str_cat("'", r.compression, "'");
  if (f == kDType) return dtype_name(static_cast<DType>(r.field[f]));
  if (f == kOverlap || f == kCheckCounts || f == kStallCheck) return r.field[f] ? "true" : "false";
  if (f == kRingOrder) return r.field[f] ? "rank" : "node";
  if (f == kLayoutHash || f == kStateHash) return str_cat("0x", std::hex, r.field[f]);
  return std::to_string(r.field[f]);
}

}  // namespace

ModelFingerprint model_fingerprint(const Arena<float>& arena) {
  if (!arena.finalized()) throw CommError("model_fingerprint: the arena is not finalized");
  ModelFingerprint fp;
  fp.param_count = arena.param_count();
  fp.grad_elems = arena.size();
  Fnv layout;
  for (const ParamInfo& p : arena.layout()) {
    layout.add_str(p.name);
    layout.add_u64(p.dims.size());
    for (int64_t d : p.dims) layout.add_u64(static_cast<uint64_t>(d));
    layout.add_u64(static_cast<uint64_t>(p.kind));
    layout.add_u64(p.offset);
    layout.add_u64(p.count);
  }
  fp.layout_hash = layout.value();
  Fnv state;
  for (const StateInfo& s : arena.state_layout()) {
    state.add_str(s.name);
    state.add_u64(s.offset);
    state.add_u64(s.count);
    fp.state_elems += s.count;
  }
  fp.state_hash = state.value();
  fp.dtype = DType::f32;
  return fp;
}

ModelFingerprint buffer_fingerprint(size_t count, DType t) {
  ModelFingerprint fp;
  fp.param_count = fp.grad_elems = count;
  fp.dtype = t;
  return fp;
}

void comm_check_agreement(Communicator& comm, const ModelFingerprint& model, const CommConfig& cfg) {
  Record mine{};
  Fnv algo, path, compression;
  algo.add_str(cfg.algorithm);
  path.add_str(cfg.device_path);
  compression.add_str(cfg.compression);
  mine.field[kParamCount] = model.param_count;
  mine.field[kGradElems] = model.grad_elems;
  mine.field[kLayoutHash] = model.layout_hash;
  mine.field[kStateElems] = model.state_elems;
  mine.field[kStateHash] = model.state_hash;
  mine.field[kDType] = static_cast<uint64_t>(model.dtype);
  mine.field[kAlgorithm] = algo.value();
  mine.field[kBucketBytes] = cfg.bucket_bytes;
  mine.field[kOverlap] = cfg.overlap;
  mine.field[kSegmentBytes] = cfg.segment_bytes;
  mine.field[kCheckCounts] = cfg.check_counts;
  mine.field[kMaxElemsPerCall] = comm.max_elems_per_call();
  // On or off must agree (a rank without it would never announce its steps); the times may differ.
  mine.field[kNetworkSegmentBytes] = cfg.network_segment_bytes;
  mine.field[kStallCheck] = cfg.stall_warning_s > 0 || cfg.stall_abort_s > 0;
  // The setting, not the path it resolves to: ranks on nodes with different MPI builds may take
  // different paths (each reduces its own memory), but not be configured differently.
  mine.field[kDevicePath] = path.value();
  mine.field[kCompression] = compression.value();
  mine.field[kRanksPerNode] = static_cast<uint64_t>(cfg.ranks_per_node);
  mine.field[kRingOrder] = cfg.ring_order == "rank";
  std::strncpy(mine.algorithm, cfg.algorithm.c_str(), sizeof mine.algorithm - 1);
  std::strncpy(mine.device_path, cfg.device_path.c_str(), sizeof mine.device_path - 1);
  std::strncpy(mine.compression, cfg.compression.c_str(), sizeof mine.compression - 1);

  std::vector<Record> all(static_cast<size_t>(comm.size()));
  comm.allgather_bytes(&mine, sizeof mine, all.data());
  std::string diffs;
  int ndiff = 0;
  for (int r = 1; r < comm.size(); ++r)
    for (int f = 0; f < kNumFields; ++f)
      if (all[r].field[f] != all[0].field[f] && ++ndiff <= 16)
        diffs += str_cat(diffs.empty() ? "" : "; ", "rank ", r, " has ", kFieldNames[f], " ",
                         field_value(all[r], f), " (rank 0: ", field_value(all[0], f), ")");
  if (ndiff > 16) diffs += str_cat("; and ", ndiff - 16, " more differences");
  if (!diffs.empty())
    throw CommError(str_cat("ranks disagree at start-up (", comm.size(), " ranks): ", diffs));
}

void broadcast_model(Communicator& comm, Arena<float>& arena, int root) {
  // MPI works on host memory here: a device arena goes through host copies (set-up only).
  auto bcast = [&](HostView<float> v) {
    comm.broadcast(v.data(), v.size(), DType::f32, root);
    if (comm.rank() != root) v.commit();
  };
  bcast(arena.host_params());
  bcast(arena.host_state());
}

}  // namespace rt::comm

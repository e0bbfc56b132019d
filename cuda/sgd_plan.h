// The device SGD's work list: the flat arena's layout cut into per-tensor segments with each
// tensor's weight decay, and the tensors LARS scales. Plain host C++ (no CUDA), so the host tests
// check it without a GPU.
#pragma once
#include <algorithm>
#include <vector>

#include "cuda/lars.h"
#include "cuda/sgd_segment.h"
#include "nn/error.h"
#include "nn/optimizer.h"

namespace rt::cuda {

// A tensor's weight decay as Sgd<float> applies it: 0 for BN and bias when decay_bn_and_bias is
// false.
inline float sgd_weight_decay(const ParamInfo& p, const SgdConfig& cfg) {
  return float(optimizer_weight_decay(p, cfg));
}

// Segments of at most max_elems elements covering exactly [offset, offset + count) of every
// tensor not frozen (cfg.freeze), in layout order, with its weight decay and (AdamW, LAMB) its
// group of update counts (group_of[tensor], layout order; none: 0): Sgd<float>'s chunks, one
// thread block each.
// Throws rt::Error for a layout that is not sorted and disjoint (as Sgd does).
inline std::vector<SgdSegment> sgd_segments(const std::vector<ParamInfo>& layout,
                                            const SgdConfig& cfg,
                                            uint32_t max_elems = kSgdSegmentElems,
                                            const std::vector<uint8_t>& group_of = {}) {
  sgd_validate(cfg);
  if (max_elems == 0) throw Error("cuda sgd: segment size must be > 0");
  std::vector<SgdSegment> segs;
  size_t end = 0;
  for (size_t t = 0; t < layout.size(); ++t) {
    const ParamInfo& p = layout[t];
    if (p.offset < end)
      throw Error(str_cat("cuda sgd: parameter ", p.name, " at offset ", p.offset,
                          " overlaps the previous one (ends at ", end,
                          "); the layout must be sorted by offset"));
    end = p.offset + p.count;
    if (sgd_frozen(cfg, p.name)) continue;  // no segment: never read or written
    const float wd = sgd_weight_decay(p, cfg);
    const double mult = optimizer_lr_mult(cfg, p.name);
    const uint32_t group = t < group_of.size() ? group_of[t] : 0;
    for (size_t b = p.offset; b < end; b += max_elems)
      segs.push_back({uint64_t(b), uint32_t(std::min<size_t>(max_elems, end - b)), wd, mult, group});
  }
  return segs;
}

// The tensors LARS (or LAMB) scales by a trust ratio (none for plain SGD and AdamW; BN and bias
// only when not excluded), each with its run of sgd_segments(layout, cfg, max_elems).
inline std::vector<LarsTensor> lars_tensors(const std::vector<ParamInfo>& layout,
                                            const SgdConfig& cfg,
                                            uint32_t max_elems = kSgdSegmentElems) {
  std::vector<LarsTensor> out;
  if (!(cfg.lars || cfg.kind == OptimizerKind::lamb) || max_elems == 0) return out;
  uint32_t seg = 0;
  for (const ParamInfo& p : layout) {
    if (sgd_frozen(cfg, p.name)) continue;  // as sgd_segments: no segments of its own
    const auto n = uint32_t((p.count + max_elems - 1) / max_elems);
    if (!(param_is_bn_or_bias(p.kind) && cfg.lars_exclude_bn_and_bias))
      out.push_back({seg, n, sgd_weight_decay(p, cfg)});
    seg += n;
  }
  return out;
}

// Elements of the momentum buffer: the arena's size, each tensor rounded up to 64 bytes as
// Sgd<float> and Arena<float> size theirs.
inline size_t sgd_buffer_elems(const std::vector<ParamInfo>& layout) {
  size_t end = 0;
  for (const ParamInfo& p : layout) end = std::max(end, p.offset + p.count);
  constexpr size_t align = 64 / sizeof(float);
  return (end + align - 1) / align * align;
}

}  // namespace rt::cuda

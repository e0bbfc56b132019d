// Choosing a cuDNN algorithm from its ranked candidates (cudnnFind* or cudnnGet*_v7 results),
// in plain C++ so the host tests check the policy without a GPU.
#pragma once
#include <cstddef>
#include <vector>

namespace rt::cuda {

struct AlgoCandidate {
  int algo = 0;
  bool ok = true;             // status == CUDNN_STATUS_SUCCESS
  size_t workspace = 0;       // bytes
  bool deterministic = true;  // same result bits on every run
};

// Index of the first candidate (cuDNN ranks them fastest first) that succeeded, fits the
// workspace limit and, if asked, is deterministic; -1 when none does.
inline int algo_pick(const std::vector<AlgoCandidate>& ranked, size_t workspace_limit,
                     bool require_deterministic) {
  for (size_t i = 0; i < ranked.size(); ++i) {
    const AlgoCandidate& c = ranked[i];
    if (c.ok && c.workspace <= workspace_limit && (c.deterministic || !require_deterministic))
      return int(i);
  }
  return -1;
}

}  // namespace rt::cuda

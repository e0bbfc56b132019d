// Choosing a cuDNN algorithm from its ranked candidates (cudnnFind* or cudnnGet*_v7 results),
// in plain C++ so the host tests check the policy without a GPU.
#pragma once
#include <cstddef>
#include <vector>

namespace rt::cuda {

struct AlgoCandidate {
  int algo = 0;
  bool ok = true;             // status == CUDNN_STATUS_SUCCESS
  size_t workspace = 0;       // bytes, as the ranking reported it
  bool deterministic = true;  // same result bits on every run
  // Ranked under a math type it will not run with: a timed ranking of an fp32 convolution
  // without TF32 also times CUDNN_DEFAULT_MATH, which permits TF32 on Ampere and later, and that
  // rank says nothing of the algorithm's speed in FMA math.
  bool other_math = false;
};

// Indices of the candidates (cuDNN ranks them fastest first) that succeeded, fit the workspace
// limit and, if asked, are deterministic, in rank order: first those ranked under the math type
// they will run with, then the others (still candidates where the first are refused). The caller takes the first whose
// workspace cuDNN then confirms for the math type it will run with: a ranking's reported size
// can differ from the workspace query's, and the query can refuse an algorithm the ranking
// offered.
inline std::vector<int> algo_order(const std::vector<AlgoCandidate>& ranked, size_t workspace_limit,
                                   bool require_deterministic) {
  std::vector<int> order;
  for (const bool other : {false, true})
    for (size_t i = 0; i < ranked.size(); ++i) {
      const AlgoCandidate& c = ranked[i];
      if (c.other_math == other && c.ok && c.workspace <= workspace_limit &&
          (c.deterministic || !require_deterministic))
        order.push_back(int(i));
    }
  return order;
}

}  // namespace rt::cuda

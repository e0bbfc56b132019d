// conv_choose_algos: cuDNN's ranked candidates per direction, the algo_pick policy, math types
// and workspace sizes (see conv_algos.h).
#include "cuda/conv_algos.h"

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/algo_pick.h"
#include "cuda/check.h"

namespace rt::cuda {
namespace {

// One direction's candidates: those of cuDNN's ranked results that the algo_pick policy allows
// (a result that converts fp32 to fp16 is no candidate) and whose workspace the size query
// confirms, under the math type each would run with, within the limit, in rank order. The query
// may refuse an algorithm the ranking offered, or ask for more than the ranking said (under FMA
// math in particular); such a candidate is passed over. The first is the choice, the others
// where a first run cuDNN refuses moves on to (conv_run.h); those ranked under another math type
// than they will run with come last (algo_order). Leaves the descriptor `c` set to
// the first's math type. Each (algorithm, math type) is a candidate once. The three cudnn*AlgoPerf_t structs share these fields; size(algo,
// &bytes) is the direction's workspace query. Throws rt::Error naming the layer when none fits.
template <class Perf, class Math, class Size>
std::vector<ConvCandidate> choose(const std::vector<Perf>& perf, int returned,
                                  cudnnConvolutionDescriptor_t c, Math math, Size size,
                                  const ContextConfig& cfg, const ConvDesc& d, const char* kind,
                                  const char* direction) {
  std::vector<AlgoCandidate> cands;
  for (int i = 0; i < returned; ++i)
    cands.push_back({int(perf[i].algo),
                     perf[i].status == CUDNN_STATUS_SUCCESS &&
                         perf[i].mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
                     perf[i].memory, perf[i].determinism == CUDNN_DETERMINISTIC,
                     math(perf[i].mathType) != perf[i].mathType});
  const std::vector<int> order = algo_order(cands, cfg.workspace_limit, cfg.deterministic);
  std::vector<ConvCandidate> fit;
  std::string passed;  // why the policy's candidates were passed over
  for (const int k : order) {
    const Perf& p = perf[size_t(k)];
    const cudnnMathType_t m = math(p.mathType);
    // A ranking may list an algorithm under two math types; forced to one (no TF32) they are one
    // candidate, kept where it ranks first: a refusal must not move on to the same call again.
    if (std::any_of(fit.begin(), fit.end(),
                    [&](const ConvCandidate& f) { return f.algo == int(p.algo) && f.math == m; }))
      continue;
    CUDNN_CHECK(cudnnSetConvolutionMathType(c, m));
    size_t bytes = 0;
    const cudnnStatus_t s = size(p.algo, &bytes);
    if (s == CUDNN_STATUS_SUCCESS && bytes <= cfg.workspace_limit)
      fit.push_back({int(p.algo), m, bytes});
    else
      passed += str_cat("; algorithm ", int(p.algo),
                        s == CUDNN_STATUS_SUCCESS
                            ? str_cat(" needs ", bytes, " bytes")
                            : str_cat(": workspace query: ", cudnnGetErrorString(s)));
  }
  if (fit.empty())
    throw Error(str_cat("layer ", d.name, ": no cuDNN ", kind, direction, " algorithm for input ",
                        d.in.str(), " fits a workspace of ", cfg.workspace_limit, " bytes",
                        cfg.deterministic ? " and is deterministic" : "", " (", returned,
                        " candidates, ", order.size(), " allowed", passed, ")"));
  CUDNN_CHECK(cudnnSetConvolutionMathType(c, fit[0].math));
  return fit;
}

// The math types of the three descriptors, kept and put back.
struct MathTypes {
  cudnnConvolutionDescriptor_t c[3];
  cudnnMathType_t m[3]{};
  MathTypes(cudnnConvolutionDescriptor_t fwd, cudnnConvolutionDescriptor_t data,
            cudnnConvolutionDescriptor_t filter)
      : c{fwd, data, filter} {
    for (int i = 0; i < 3; ++i) CUDNN_CHECK(cudnnGetConvolutionMathType(c[i], &m[i]));
  }
  void restore() const {
    for (int i = 0; i < 3; ++i) CUDNN_CHECK(cudnnSetConvolutionMathType(c[i], m[i]));
  }
};

// A convolution's handle and descriptors, and the three workspace-size queries on them (under
// each direction's current math type).
struct ConvQueries {
  cudnnHandle_t h;
  cudnnTensorDescriptor_t x;
  cudnnFilterDescriptor_t w;
  cudnnTensorDescriptor_t y;
  cudnnConvolutionDescriptor_t fwd, data, filter;
  cudnnStatus_t fwd_ws(cudnnConvolutionFwdAlgo_t a, size_t* bytes) const {
    return cudnnGetConvolutionForwardWorkspaceSize(h, x, w, fwd, y, a, bytes);
  }
  cudnnStatus_t data_ws(cudnnConvolutionBwdDataAlgo_t a, size_t* bytes) const {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, w, y, data, x, a, bytes);
  }
  cudnnStatus_t filter_ws(cudnnConvolutionBwdFilterAlgo_t a, size_t* bytes) const {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x, y, filter, w, a, bytes);
  }
};

// Whether a choice read from the algorithm cache file still holds here: cuDNN accepts each
// algorithm for these descriptors under its math type (it reports NOT_SUPPORTED otherwise, as
// for a file edited by hand), the workspace fits the limit, and without tensor_ops no direction
// may use tensor cores. Sets a.workspace and the descriptors' math types; when it does not hold,
// the math types are left as they were, for the search that follows.
bool stored_choice_fits(const ConvQueries& q, const ContextConfig& cfg, bool tensor_ops,
                        bool input_grad, ConvAlgos& a) {
  if (!tensor_ops && (a.fwd_math != CUDNN_FMA_MATH || a.bwd_data_math != CUDNN_FMA_MATH ||
                      a.bwd_filter_math != CUDNN_FMA_MATH))
    return false;
  const MathTypes before(q.fwd, q.data, q.filter);
  CUDNN_CHECK(cudnnSetConvolutionMathType(q.fwd, a.fwd_math));
  CUDNN_CHECK(cudnnSetConvolutionMathType(q.data, a.bwd_data_math));
  CUDNN_CHECK(cudnnSetConvolutionMathType(q.filter, a.bwd_filter_math));
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
  if (q.fwd_ws(a.fwd, &fwd_ws) != CUDNN_STATUS_SUCCESS ||
      (input_grad && q.data_ws(a.bwd_data, &data_ws) != CUDNN_STATUS_SUCCESS) ||
      q.filter_ws(a.bwd_filter, &filter_ws) != CUDNN_STATUS_SUCCESS ||
      std::max({fwd_ws, data_ws, filter_ws}) > cfg.workspace_limit) {
    before.restore();
    return false;
  }
  a.workspace = std::max({fwd_ws, data_ws, filter_ws});
  return true;
}

}  // namespace

void conv_set_tensor(cudnnTensorDescriptor_t t, const Shape& s, const ConvDesc& d,
                     cudnnTensorFormat_t format, cudnnDataType_t type) {
  check_cudnn_numel(s, d);
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(t, format, type, lib_int(s.n, d), lib_int(s.c, d),
                                         lib_int(s.h, d), lib_int(s.w, d)));
}

std::string conv_algo_key(const ConvDesc& d, bool tensor_ops, const char* kind) {
  return str_cat(kind, tensor_ops ? "tensor-op " : "fma ", d.in.str(), " out_c ", d.out_c,
                 " kernel ", d.kernel_h, "x", d.kernel_w, " stride ", d.stride_h, "x", d.stride_w,
                 " pad ", d.pad_h, "x", d.pad_w,
                 d.groups > 1 ? str_cat(" groups ", d.groups) : std::string(),
                 d.input_grad ? "" : " no-dx");
}

namespace {

// conv_choose_algos's choice for the convolution of cache key `key`.
ConvAlgos choose_algos(CudaContext& ctx, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                       cudnnTensorDescriptor_t y, cudnnConvolutionDescriptor_t fwd,
                       cudnnConvolutionDescriptor_t bwd_data,
                       cudnnConvolutionDescriptor_t bwd_filter, const ConvDesc& d, bool tensor_ops,
                       const char* kind, const std::string& key) {
  if (const ConvAlgos* known = ctx.conv_algos().find(key)) {
    CUDNN_CHECK(cudnnSetConvolutionMathType(fwd, known->fwd_math));
    CUDNN_CHECK(cudnnSetConvolutionMathType(bwd_data, known->bwd_data_math));
    CUDNN_CHECK(cudnnSetConvolutionMathType(bwd_filter, known->bwd_filter_math));
    return *known;
  }
  cudnnHandle_t h = ctx.cudnn();
  const ContextConfig& cfg = ctx.config();
  const ConvQueries q{h, x, w, y, fwd, bwd_data, bwd_filter};
  auto math = [&](cudnnMathType_t reported) { return tensor_ops ? reported : CUDNN_FMA_MATH; };
  // Direction dir's candidates (choose()), ranked by timing or by cuDNN's heuristics.
  auto ranked = [&](int dir, bool timed) -> std::vector<ConvCandidate> {
    int max = 0, got = 0;
    if (dir == 0) {
      CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(max));
      if (timed)
        CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, x, w, fwd, y, max, &got, perf.data()));
      else
        CUDNN_CHECK(
            cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, fwd, y, max, &got, perf.data()));
      auto size = [&](auto algo, size_t* bytes) { return q.fwd_ws(algo, bytes); };
      return choose(perf, got, fwd, math, size, cfg, d, kind, "forward");
    }
    if (dir == 1) {
      CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(max));
      if (timed)
        CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, w, y, bwd_data, x, max, &got,
                                                              perf.data()));
      else
        CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, y, bwd_data, x, max, &got,
                                                                perf.data()));
      auto size = [&](auto algo, size_t* bytes) { return q.data_ws(algo, bytes); };
      return choose(perf, got, bwd_data, math, size, cfg, d, kind, "backward-data");
    }
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<size_t>(max));
    if (timed)
      CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(h, x, y, bwd_filter, w, max, &got,
                                                              perf.data()));
    else
      CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, y, bwd_filter, w, max, &got,
                                                                perf.data()));
    auto size = [&](auto algo, size_t* bytes) { return q.filter_ws(algo, bytes); };
    return choose(perf, got, bwd_filter, math, size, cfg, d, kind, "backward-filter");
  };
  // No backward-data algorithm for a layer never asked for dx: none is timed on the network's
  // largest input, and a layout cuDNN has no dgrad kernel for (3 channels, NHWC, 16 bits) cannot
  // fail the set-up. Its field stays algorithm 0, never run.
  auto directions = [&] { return d.input_grad ? std::vector{0, 1, 2} : std::vector{0, 2}; };

  if (const ConvAlgos* s = ctx.conv_algos().stored(key)) {
    ConvAlgos a = *s;
    const MathTypes initial(fwd, bwd_data, bwd_filter);  // what a ranking is asked under
    if (stored_choice_fits(q, cfg, tensor_ops, d.input_grad, a)) {
      // The file's choice ran on this GPU model and software before. Should cuDNN refuse it at
      // its first run all the same, its heuristic ranking (no device time) follows it.
      const MathTypes chosen(fwd, bwd_data, bwd_filter);
      initial.restore();
      for (const int dir : directions()) {
        try {
          for (const ConvCandidate& c : ranked(dir, false))
            if (c.algo != direction(a, dir).algo) a.next[dir].push_back(c);
        } catch (const Error&) {  // none fits: the stored choice has no follower
        }
      }
      chosen.restore();
      ctx.conv_algos().add(key, a, /*from_file=*/true);
      return a;
    }
  }
  ConvAlgos a;
  a.bwd_data_math = math(CUDNN_DEFAULT_MATH);
  for (const int dir : directions()) {
    // The first candidate is the choice; the others are kept for its first run.
    std::vector<ConvCandidate> fit = ranked(dir, cfg.benchmark_algos);
    set_direction(a, dir, fit[0]);
    a.workspace = std::max(a.workspace, fit[0].workspace);
    a.next[dir].assign(fit.begin() + 1, fit.end());
  }
  // Timing may leave a candidate's failed allocation as the runtime's last error (reported in its
  // perf status already): cleared, so that the next launch check does not blame a kernel of ours.
  if (cfg.benchmark_algos) (void)cudaGetLastError();
  ctx.conv_algos().add(key, a);
  return a;
}

}  // namespace

ConvRunner conv_choose_algos(CudaContext& ctx, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                             cudnnTensorDescriptor_t y, cudnnConvolutionDescriptor_t fwd,
                             cudnnConvolutionDescriptor_t bwd_data,
                             cudnnConvolutionDescriptor_t bwd_filter, const ConvDesc& d,
                             bool tensor_ops, const char* kind) {
  const std::string key = conv_algo_key(d, tensor_ops, kind);
  const ConvAlgos a =
      choose_algos(ctx, x, w, y, fwd, bwd_data, bwd_filter, d, tensor_ops, kind, key);
  return ConvRunner(ctx, a, fwd, bwd_data, bwd_filter, key, d.name, kind);
}

}  // namespace rt::cuda

// The part of cuDNN's legacy API the backend calls, emulated on the host by direct loops in double:
// 4-D tensor and filter descriptors (NCHW or NHWC, float / half / bfloat16), 2-D
// cross-correlation (grouped too) forward and both gradients, the bias add and its gradient (batch norm:
// cudnn_bn.cc). Semantics as cuDNN documents them: results are alpha * op + beta * old, and the
// old value is not read when beta is 0 (new device memory is NaN here, so reading it would show);
// the algorithm queries offer one algorithm (number 0) that needs kWorkspace bytes of workspace,
// a call given less, or none, fails with CUDNN_STATUS_BAD_PARAM, and the workspace queries and
// the calls answer CUDNN_STATUS_NOT_SUPPORTED for any other algorithm. With decoys on
// (rt_emu::offer_decoy_algorithms), two more are ranked first, as real rankings can offer them:
// algorithm 1, which the workspace query refuses, and algorithm 2, whose query asks for far more
// than its ranking said. With an unrunnable one on (rt_emu::offer_unrunnable_algorithm),
// algorithm 3 is ranked before them: its query accepts it with less workspace than algorithm 0,
// and the calls refuse it, as cuDNN can refuse at run time what its queries accepted. A failing call leaves its reason for cudnnGetLastErrorString. A call
// checks its arguments and reads its descriptors, alpha and beta at once, as cuDNN does, and
// queues the work on the handle's stream (tests/cuda_emu/streams.h). What it does not reproduce:
// cuDNN's own summation order and fp32 accumulation (it is more exact), and its speed.
#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/cuda_emu/cudnn_emu.h"
#include "tests/cuda_emu/runtime.h"
#include "tests/cuda_emu/streams.h"

namespace {

using rt_emu::blend;
using rt_emu::load;
using rt_emu::scalar;
using rt_emu::set_tensor;
using rt_emu::store;

constexpr size_t kWorkspace = 4096;
constexpr size_t kDecoyWorkspace = size_t(1) << 40;  // algorithm 2's answer with decoys on

constexpr int kUnrunnable = 3;
std::atomic<bool> g_decoys{false}, g_unrunnable{false}, g_unaligned_refused{false},
    g_unaligned_at_run_only{false}, g_listed_twice{false};
std::atomic<cudnnStatus_t> g_refusal{CUDNN_STATUS_NOT_SUPPORTED};  // algorithm 3's
std::atomic<cudaError_t> g_fault{cudaSuccess};  // the device fault its run leaves, if any
thread_local std::string g_last_error;  // cudnnGetLastErrorString's, per thread as cuDNN's

// A failed call: its status, and its reason kept for cudnnGetLastErrorString.
cudnnStatus_t fail(cudnnStatus_t s, const char* why) {
  g_last_error = why;
  return s;
}

// Output size and the geometry checks cuDNN makes; false when the descriptors disagree.
bool geometry(const cudnnConvolutionStruct* cv, const cudnnTensorStruct* x,
              const cudnnFilterStruct* w, const cudnnTensorStruct* y) {
  if (!cv || !x || !w || !y || x->c != w->c * cv->groups || x->n != y->n || y->c != w->n ||
      y->c % cv->groups != 0)
    return false;
  const int oh = (x->h + 2 * cv->pad_h - cv->dil_h * (w->h - 1) - 1) / cv->u + 1;
  const int ow = (x->w + 2 * cv->pad_w - cv->dil_w * (w->w - 1) - 1) / cv->v + 1;
  return oh == y->h && ow == y->w && cv->mode == CUDNN_CROSS_CORRELATION;
}

// Calls f(yi, xi, wi) for every product of the convolution that touches the input (padding
// contributes zeros), with the NCHW indices of its output, input and filter elements: output
// channel k reads filter channel ch, which is input channel c of k's group. All three directions
// sum in this order.
template <class F>
void each_product(const cudnnConvolutionStruct* cv, const cudnnTensorStruct* x,
                  const cudnnFilterStruct* w, const cudnnTensorStruct* y, F&& f) {
  const int per_group = y->c / cv->groups;
  const size_t x_plane = size_t(x->h) * size_t(x->w), w_plane = size_t(w->h) * size_t(w->w);
  size_t yi = 0;  // (b, k, oy, ox) in loop order is the output's NCHW order
  for (int b = 0; b < y->n; ++b)
    for (int k = 0; k < y->c; ++k) {
      const int c0 = k / per_group * w->c;
      for (int oy = 0; oy < y->h; ++oy)
        for (int ox = 0; ox < y->w; ++ox, ++yi)
          for (int ch = 0; ch < w->c; ++ch) {
            const size_t x_at = (size_t(b) * size_t(x->c) + size_t(c0 + ch)) * x_plane;
            const size_t w_at = (size_t(k) * size_t(w->c) + size_t(ch)) * w_plane;
            for (int r = 0; r < w->h; ++r) {
              const int iy = oy * cv->u - cv->pad_h + r * cv->dil_h;
              if (iy < 0 || iy >= x->h) continue;
              for (int s = 0; s < w->w; ++s) {
                const int ix = ox * cv->v - cv->pad_w + s * cv->dil_w;
                if (ix >= 0 && ix < x->w)
                  f(yi, x_at + size_t(iy) * size_t(x->w) + size_t(ix),
                    w_at + size_t(r) * size_t(w->w) + size_t(s));
              }
            }
          }
    }
}

// A tensor's elements as doubles in NCHW order: each read once, so that the loops over the
// products index plain arrays instead of converting an element of its type and layout each time.
std::vector<double> dense(const cudnnTensorStruct& t, const void* p) {
  std::vector<double> v(size_t(t.count()));
  size_t i = 0;
  for (int b = 0; b < t.n; ++b)
    for (int c = 0; c < t.c; ++c)
      for (int y = 0; y < t.h; ++y)
        for (int x = 0; x < t.w; ++x) v[i++] = load(t.type, p, t.at(b, c, y, x));
  return v;
}

// One direction of the convolution: add(acc, yi, xi, wi) adds a product to its element of `out`
// (NCHW-ordered sums in double, starting at 0), which are then blended into out.
template <class Add>
void convolve(const cudnnConvolutionStruct* cv, const cudnnTensorStruct* x,
              const cudnnFilterStruct* w, const cudnnTensorStruct* y,
              const cudnnTensorStruct* out_d, void* out, const void* alpha, const void* beta,
              Add&& add) {
  std::vector<double> acc(size_t(out_d->count()), 0.0);
  double* a = acc.data();  // read once, not per product
  each_product(cv, x, w, y, [&](size_t yi, size_t xi, size_t wi) { add(a, yi, xi, wi); });
  size_t i = 0;
  for (int b = 0; b < out_d->n; ++b)
    for (int c = 0; c < out_d->c; ++c)
      for (int yy = 0; yy < out_d->h; ++yy)
        for (int xx = 0; xx < out_d->w; ++xx)
          blend(out_d->type, out, out_d->at(b, c, yy, xx), acc[i++], scalar(alpha), scalar(beta));
}

// The ranking, best first.
std::vector<int> ranking() {
  std::vector<int> r;
  if (g_unrunnable.load()) r.push_back(kUnrunnable);
  if (g_decoys.load()) r.insert(r.end(), {1, 2});
  r.push_back(0);
  if (g_listed_twice.load()) r.push_back(0);  // again, under the other math type (offer)
  return r;
}

// With rt_emu::refuse_unaligned_channels on: a 16-bit NHWC input whose channels are not a
// multiple of 8, which no algorithm takes (as a cuDNN without such kernels would answer); `call`:
// a convolution call's check, else a ranking's.
cudnnStatus_t layout_ok(const cudnnTensorStruct* x, bool call) {
  if (g_unaligned_refused.load() && (call || !g_unaligned_at_run_only.load()) && x && x->nhwc &&
      x->type != CUDNN_DATA_FLOAT && x->c % 8 != 0)
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                "no algorithm for 16-bit NHWC data whose channels are not a multiple of 8 (emulated)");
  return CUDNN_STATUS_SUCCESS;
}

// The checks every convolution call makes before queuing its work.
cudnnStatus_t call_ok(cudnnHandle_t h, bool geometry_ok, const cudnnTensorStruct* x, int algo,
                      const void* ws, size_t bytes) {
  if (!h || !geometry_ok) return fail(CUDNN_STATUS_BAD_PARAM, "descriptors disagree");
  if (const cudnnStatus_t s = layout_ok(x, true); s != CUDNN_STATUS_SUCCESS) return s;
  if (algo == kUnrunnable && g_unrunnable.load()) {
    if (g_fault.load() != cudaSuccess) rt_emu::set_device_fault(g_fault.load());
    return fail(g_refusal.load(), "algorithm 3 cannot run this convolution (emulated)");
  }
  if (algo != 0) return fail(CUDNN_STATUS_NOT_SUPPORTED, "algorithm not supported (emulated)");
  if (!ws || bytes < kWorkspace) return fail(CUDNN_STATUS_BAD_PARAM, "workspace too small");
  return CUDNN_STATUS_SUCCESS;
}

// The workspace queries' answer for `algo`.
cudnnStatus_t workspace_of(int algo, size_t* bytes) {
  if (algo == 2 && g_decoys.load()) {
    *bytes = kDecoyWorkspace;
    return CUDNN_STATUS_SUCCESS;
  }
  if (algo == kUnrunnable && g_unrunnable.load()) {
    *bytes = kWorkspace / 2;
    return CUDNN_STATUS_SUCCESS;
  }
  if (algo != 0) return fail(CUDNN_STATUS_NOT_SUPPORTED, "algorithm not supported (emulated)");
  *bytes = kWorkspace;
  return CUDNN_STATUS_SUCCESS;
}

// The ranking's results; a timed one (cudnnFind*) ran each candidate, so it reports algorithm 3's
// refusal in its status.
template <class Perf, class Algo>
cudnnStatus_t offer(const cudnnTensorStruct* x, const cudnnConvolutionStruct* cv, int requested,
                    int* returned, Perf* perf, bool timed = false) {
  if (!cv || requested < 1 || !returned || !perf) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = layout_ok(x, false); s != CUDNN_STATUS_SUCCESS) return s;
  const std::vector<int> r = ranking();
  *returned = std::min(requested, int(r.size()));
  for (int i = 0; i < *returned; ++i) {
    perf[i] = Perf{};
    perf[i].algo = Algo(r[size_t(i)]);
    perf[i].status =
        timed && r[size_t(i)] == kUnrunnable ? CUDNN_STATUS_NOT_SUPPORTED : CUDNN_STATUS_SUCCESS;
    perf[i].time = 1.0f + float(i);
    perf[i].memory = r[size_t(i)] == kUnrunnable ? kWorkspace / 2 : kWorkspace;
    perf[i].determinism = CUDNN_DETERMINISTIC;
    // An algorithm listed a second time is its version under the other math type.
    const bool again = std::find(r.begin(), r.begin() + i, r[size_t(i)]) != r.begin() + i;
    perf[i].mathType = !again ? cv->math
                       : cv->math == CUDNN_TENSOR_OP_MATH ? CUDNN_DEFAULT_MATH
                                                          : CUDNN_TENSOR_OP_MATH;
  }
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

namespace rt_emu {
std::atomic<int64_t> g_bwd_data_algo_queries{0};
int64_t bwd_data_algo_queries() { return g_bwd_data_algo_queries.load(); }
void offer_decoy_algorithms(bool on) { g_decoys.store(on); }
void list_algorithms_twice(bool on) { g_listed_twice.store(on); }
void refuse_unaligned_channels(bool on, bool at_run_only) {
  g_unaligned_at_run_only.store(at_run_only);
  g_unaligned_refused.store(on);
}
void offer_unrunnable_algorithm(bool on, cudnnStatus_t refusal, cudaError_t fault) {
  g_unrunnable.store(on);
  g_refusal.store(refusal);
  g_fault.store(fault);
  if (!on) set_device_fault(cudaSuccess);
}
}  // namespace rt_emu

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }  // the headers it was built with
size_t cudnnGetCudartVersion(void) { return CUDART_VERSION; }

cudnnStatus_t cudnnCreate(cudnnHandle_t* h) {
  *h = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
  delete h;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
  if (!h) return CUDNN_STATUS_BAD_PARAM;
  h->stream = s;
  return CUDNN_STATUS_SUCCESS;
}
void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (!message || max_size == 0) return;
  std::snprintf(message, max_size, "%s", g_last_error.c_str());
  g_last_error.clear();
}
const char* cudnnGetErrorString(cudnnStatus_t s) {
  switch (s) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM (emulated cuDNN)";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED (emulated cuDNN)";
    default: return "cuDNN error (emulated cuDNN)";
  }
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* t) {
  *t = new cudnnTensorStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t t) {
  delete t;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* f) {
  *f = new cudnnFilterStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t f) {
  delete f;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* c) {
  *c = new cudnnConvolutionStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t c) {
  delete c;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t t, cudnnTensorFormat_t f,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  return set_tensor(t, f, type, n, c, h, w);
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type,
                                         cudnnTensorFormat_t f, int k, int c, int h, int w) {
  return set_tensor(d, f, type, k, c, h, w);
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t c, int pad_h,
                                              int pad_w, int u, int v, int dil_h, int dil_w,
                                              cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
  if (!c || pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dil_h <= 0 || dil_w <= 0)
    return CUDNN_STATUS_BAD_PARAM;
  if (compute != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
  c->pad_h = pad_h, c->pad_w = pad_w, c->u = u, c->v = v, c->dil_h = dil_h, c->dil_w = dil_w;
  c->mode = mode;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t c, int groups) {
  if (!c || groups <= 0) return CUDNN_STATUS_BAD_PARAM;
  c->groups = groups;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t c, cudnnMathType_t m) {
  if (!c) return CUDNN_STATUS_BAD_PARAM;
  c->math = m;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t c, cudnnMathType_t* m) {
  if (!c || !m) return CUDNN_STATUS_BAD_PARAM;
  *m = c->math;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t cv,
                                                    const cudnnTensorDescriptor_t x,
                                                    const cudnnFilterDescriptor_t w, int* n, int* c,
                                                    int* h, int* wo) {
  if (!cv || !x || !w || x->c != w->c * cv->groups || w->n % cv->groups != 0)
    return CUDNN_STATUS_BAD_PARAM;
  *n = x->n;
  *c = w->n;
  *h = (x->h + 2 * cv->pad_h - cv->dil_h * (w->h - 1) - 1) / cv->u + 1;
  *wo = (x->w + 2 * cv->pad_w - cv->dil_w * (w->w - 1) - 1) / cv->v + 1;
  return *h > 0 && *wo > 0 ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t, int* n) {
  *n = int(ranking().size());
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t, int* n) {
  *n = int(ranking().size());
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t, int* n) {
  *n = int(ranking().size());
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t cv, const cudnnTensorDescriptor_t y, const int req, int* got,
    cudnnConvolutionFwdAlgoPerf_t* p) {
  if (!geometry(cv, x, w, y)) return CUDNN_STATUS_BAD_PARAM;
  return offer<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(x, cv, req, got, p);
}
cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t cv, const cudnnTensorDescriptor_t y, const int req, int* got,
    cudnnConvolutionFwdAlgoPerf_t* p) {
  if (!h || !geometry(cv, x, w, y)) return CUDNN_STATUS_BAD_PARAM;
  return offer<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(x, cv, req, got, p, true);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t cv, const cudnnTensorDescriptor_t dx, const int req,
    int* got, cudnnConvolutionBwdDataAlgoPerf_t* p) {
  rt_emu::g_bwd_data_algo_queries.fetch_add(1);
  if (!geometry(cv, dx, w, dy)) return CUDNN_STATUS_BAD_PARAM;
  return offer<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(dx, cv, req, got, p);
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(
    cudnnHandle_t h, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t cv, const cudnnTensorDescriptor_t dx, const int req,
    int* got, cudnnConvolutionBwdDataAlgoPerf_t* p) {
  rt_emu::g_bwd_data_algo_queries.fetch_add(1);
  if (!h || !geometry(cv, dx, w, dy)) return CUDNN_STATUS_BAD_PARAM;
  return offer<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(dx, cv, req, got, p,
                                                                                 true);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t cv, const cudnnFilterDescriptor_t dw, const int req,
    int* got, cudnnConvolutionBwdFilterAlgoPerf_t* p) {
  if (!geometry(cv, x, dw, dy)) return CUDNN_STATUS_BAD_PARAM;
  return offer<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(x, cv, req, got,
                                                                                     p);
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t cv, const cudnnFilterDescriptor_t dw, const int req,
    int* got, cudnnConvolutionBwdFilterAlgoPerf_t* p) {
  if (!h || !geometry(cv, x, dw, dy)) return CUDNN_STATUS_BAD_PARAM;
  return offer<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(x, cv, req, got,
                                                                                     p, true);
}
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t,
                                                      const cudnnFilterDescriptor_t,
                                                      const cudnnConvolutionDescriptor_t,
                                                      const cudnnTensorDescriptor_t,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
  return workspace_of(int(algo), bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t, const cudnnFilterDescriptor_t, const cudnnTensorDescriptor_t,
    const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
  return workspace_of(int(algo), bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
    const cudnnConvolutionDescriptor_t, const cudnnFilterDescriptor_t,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
  return workspace_of(int(algo), bytes);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void* alpha,
                                      const cudnnTensorDescriptor_t xd, const void* x,
                                      const cudnnFilterDescriptor_t wd, const void* w,
                                      const cudnnConvolutionDescriptor_t cv,
                                      cudnnConvolutionFwdAlgo_t algo, void* ws, size_t ws_bytes,
                                      const void* beta, const cudnnTensorDescriptor_t yd, void* y) {
  if (const cudnnStatus_t s = call_ok(h, geometry(cv, xd, wd, yd), xd, int(algo), ws, ws_bytes);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  if (xd->type != yd->type || wd->type != xd->type)
    return fail(CUDNN_STATUS_BAD_PARAM, "tensor and filter types differ");
  rt_emu::enqueue(h->stream, [=, cv = *cv, xd = *xd, wd = *wd, yd = *yd, al = scalar(alpha),
                              be = scalar(beta)] {
    const std::vector<double> X = dense(xd, x), W = dense(wd, w);
    convolve(&cv, &xd, &wd, &yd, &yd, y, &al, &be,
             [&](double* acc, size_t yi, size_t xi, size_t wi) { acc[yi] += X[xi] * W[wi]; });
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void* alpha,
                                           const cudnnFilterDescriptor_t wd, const void* w,
                                           const cudnnTensorDescriptor_t dyd, const void* dy,
                                           const cudnnConvolutionDescriptor_t cv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* ws,
                                           size_t ws_bytes, const void* beta,
                                           const cudnnTensorDescriptor_t dxd, void* dx) {
  if (const cudnnStatus_t s = call_ok(h, geometry(cv, dxd, wd, dyd), dxd, int(algo), ws, ws_bytes);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  rt_emu::enqueue(h->stream, [=, cv = *cv, wd = *wd, dyd = *dyd, dxd = *dxd, al = scalar(alpha),
                              be = scalar(beta)] {
    const std::vector<double> DY = dense(dyd, dy), W = dense(wd, w);
    convolve(&cv, &dxd, &wd, &dyd, &dxd, dx, &al, &be,
             [&](double* acc, size_t yi, size_t xi, size_t wi) { acc[xi] += DY[yi] * W[wi]; });
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void* alpha,
                                             const cudnnTensorDescriptor_t xd, const void* x,
                                             const cudnnTensorDescriptor_t dyd, const void* dy,
                                             const cudnnConvolutionDescriptor_t cv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* ws,
                                             size_t ws_bytes, const void* beta,
                                             const cudnnFilterDescriptor_t dwd, void* dw) {
  if (const cudnnStatus_t s = call_ok(h, geometry(cv, xd, dwd, dyd), xd, int(algo), ws, ws_bytes);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  rt_emu::enqueue(h->stream, [=, cv = *cv, xd = *xd, dyd = *dyd, dwd = *dwd, al = scalar(alpha),
                              be = scalar(beta)] {
    const std::vector<double> X = dense(xd, x), DY = dense(dyd, dy);
    convolve(&cv, &xd, &dwd, &dyd, &dwd, dw, &al, &be,
             [&](double* acc, size_t yi, size_t xi, size_t wi) { acc[wi] += X[xi] * DY[yi]; });
  });
  return CUDNN_STATUS_SUCCESS;
}

// C = alpha * A + beta * C, A broadcast over the dimensions where it has size 1.
cudnnStatus_t cudnnAddTensor(cudnnHandle_t h, const void* alpha, const cudnnTensorDescriptor_t ad,
                             const void* a, const void* beta, const cudnnTensorDescriptor_t cd,
                             void* c) {
  if (!h || !ad || !cd) return CUDNN_STATUS_BAD_PARAM;
  auto fits = [](int da, int dc) { return da == dc || da == 1; };
  if (!fits(ad->n, cd->n) || !fits(ad->c, cd->c) || !fits(ad->h, cd->h) || !fits(ad->w, cd->w))
    return CUDNN_STATUS_BAD_PARAM;
  rt_emu::enqueue(h->stream, [=, ad = *ad, cd = *cd, al = scalar(alpha), be = scalar(beta)] {
    for (int b = 0; b < cd.n; ++b)
      for (int ch = 0; ch < cd.c; ++ch)
        for (int i = 0; i < cd.h; ++i)
          for (int j = 0; j < cd.w; ++j) {
            const double v = load(ad.type, a, ad.at(ad.n == 1 ? 0 : b, ad.c == 1 ? 0 : ch,
                                                    ad.h == 1 ? 0 : i, ad.w == 1 ? 0 : j));
            blend(cd.type, c, cd.at(b, ch, i, j), v, al, be);
          }
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t h, const void* alpha,
                                           const cudnnTensorDescriptor_t dyd, const void* dy,
                                           const void* beta, const cudnnTensorDescriptor_t dbd,
                                           void* db) {
  if (!h || !dyd || !dbd || dbd->c != dyd->c || dbd->count() != dbd->c)
    return CUDNN_STATUS_BAD_PARAM;
  rt_emu::enqueue(h->stream, [=, dyd = *dyd, dbd = *dbd, al = scalar(alpha), be = scalar(beta)] {
    for (int ch = 0; ch < dyd.c; ++ch) {
      double s = 0;
      for (int b = 0; b < dyd.n; ++b)
        for (int i = 0; i < dyd.h; ++i)
          for (int j = 0; j < dyd.w; ++j) s += load(dyd.type, dy, dyd.at(b, ch, i, j));
      blend(dbd.type, db, ch, s, al, be);
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"

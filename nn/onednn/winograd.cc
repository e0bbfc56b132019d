// Winograd F(2x2, 3x3) convolution: each 2x2 output tile is A^T [U . V] A with U = G g G^T the
// transformed filter and V = B^T d B the transformed 4x4 input patch, so a 3x3 layer costs 16
// multiplies per 4 outputs instead of 36. Summed over channels, the 16 points of the 4x4 tile
// are 16 independent GEMMs: M[p] (tiles x K) = V[p] (tiles x C) . U[p] (C x K).
//
// The batch's tiles are cut into blocks, shared out among the threads; per block a thread
// transforms the input into V, runs the 16 GEMMs (oneDNN sgemm, single-threaded inside the
// parallel region) and transforms M into the output. Backward data is the same computation on dy
// with the filter rotated by 180 degrees and C, K swapped. Backward weights transposes it:
// dU[p] = sum over tiles of V[p]^T (A dy A^T)[p], then dg = G^T dU G.
#include "nn/onednn/winograd.h"

#include <omp.h>

#include <algorithm>

#include "nn/onednn/winograd_kernels.h"

namespace rt::dnn {
namespace {

constexpr int64_t kPoints = 16;

// u[p][row][col] for p = 4i + j from the 3x3 filter g: (G g G^T)[i][j], G = [1 0 0; .5 .5 .5;
// .5 -.5 .5; 0 0 1]. rot180 transforms the filter rotated by 180 degrees (backward data).
void filter_transform(const float* g, bool rot180, float* u, int64_t pstride) {
  float f[3][3], t[4][3];
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) f[a][b] = rot180 ? g[(2 - a) * 3 + 2 - b] : g[a * 3 + b];
  for (int b = 0; b < 3; ++b) {
    t[0][b] = f[0][b];
    t[1][b] = 0.5f * (f[0][b] + f[1][b] + f[2][b]);
    t[2][b] = 0.5f * (f[0][b] - f[1][b] + f[2][b]);
    t[3][b] = f[2][b];
  }
  for (int a = 0; a < 4; ++a) {
    u[(4 * a + 0) * pstride] = t[a][0];
    u[(4 * a + 1) * pstride] = 0.5f * (t[a][0] + t[a][1] + t[a][2]);
    u[(4 * a + 2) * pstride] = 0.5f * (t[a][0] - t[a][1] + t[a][2]);
    u[(4 * a + 3) * pstride] = t[a][2];
  }
}

// The 3x3 filter gradient G^T du G from du[p] (p = 4i + j, stride pstride).
void filter_grad(const float* du, int64_t pstride, float* dg) {
  float s[3][4];
  for (int b = 0; b < 4; ++b) {
    const float d0 = du[b * pstride], d1 = du[(4 + b) * pstride], d2 = du[(8 + b) * pstride],
                d3 = du[(12 + b) * pstride];
    s[0][b] = d0 + 0.5f * (d1 + d2);
    s[1][b] = 0.5f * (d1 - d2);
    s[2][b] = 0.5f * (d1 + d2) + d3;
  }
  for (int a = 0; a < 3; ++a) {
    dg[a * 3 + 0] = s[a][0] + 0.5f * (s[a][1] + s[a][2]);
    dg[a * 3 + 1] = 0.5f * (s[a][1] - s[a][2]);
    dg[a * 3 + 2] = 0.5f * (s[a][1] + s[a][2]) + s[a][3];
  }
}

class WinogradConv final : public ConvOp<float> {
 public:
  WinogradConv(const ContextPtr& ctx, const ConvDesc& d)
      : ctx_(ctx), name_(d.name), c_(d.in.c), k_(d.out_c),
        g_{d.in.n, d.in.h, d.in.w, (d.in.h + 1) / 2, (d.in.w + 1) / 2},
        nthr_(std::max(1, omp_get_max_threads())) {
    // Block of 128 tiles: measured best or near it at every ResNet width (32 starves the GEMMs
    // of rows, while larger blocks spill V and M out of L2); smaller when that leaves fewer than
    // 4 blocks per thread.
    block_ = std::min<int64_t>(128, std::max<int64_t>(8, (g_.tiles() / (4 * nthr_) + 7) / 8 * 8));
    blocks_ = (g_.tiles() + block_ - 1) / block_;
    const int64_t cmax = std::max(c_, k_);
    u_size_ = round64(kPoints * c_ * k_);
    tile_size_ = round64(kPoints * block_ * cmax);
    per_thread_ = 2 * tile_size_ + u_size_;  // V, M (or dM), the dU accumulator
    ctx_->reserve_scratch(sizeof(float) * size_t(u_size_ + nthr_ * per_thread_));
  }

  void forward(const float* x, const float* w, const float* b, float* y) override {
    (void)b;
    float* u = ctx_->scratch.data();
    transform_filters(w, false, u);
    run_tiles(x, c_, u, k_, y);
  }

  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db) override {
    (void)db;
    float* u = ctx_->scratch.data();
    if (dx) {
      transform_filters(w, true, u);
      run_tiles(dy, k_, u, c_, dx);
    }
    weight_grad(x, dy, dw);
  }

 private:
  static int64_t round64(int64_t n) { return (n + 15) / 16 * 16; }
  float* thread_scratch(int t) { return ctx_->scratch.data() + u_size_ + t * per_thread_; }

  // Forward: u[p][c][k] from w[k][c]; backward data (rot180): u[p][k][c] from rot180(w[k][c]).
  // The innermost loop runs along u's rows so that the 16 output streams are written in order.
  void transform_filters(const float* w, bool rot180, float* u) {
    const int64_t ps = c_ * k_, c = c_, k = k_;
    if (rot180) {
#pragma omp parallel for num_threads(nthr_) schedule(static)
      for (int64_t ki = 0; ki < k; ++ki)
        for (int64_t ci = 0; ci < c; ++ci) filter_transform(w + (ki * c + ci) * 9, true, u + ki * c + ci, ps);
      return;
    }
#pragma omp parallel for num_threads(nthr_) schedule(static)
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t ki = 0; ki < k; ++ki) filter_transform(w + (ki * c + ci) * 9, false, u + ci * k + ki, ps);
  }

  // out (cout channels) = the Winograd convolution of in (cin channels) with u[p][cin][cout].
  void run_tiles(const float* in, int64_t cin, const float* u, int64_t cout, float* out) {
    const int64_t tiles = g_.tiles(), blk = block_;
    int failed = 0;
#pragma omp parallel num_threads(nthr_) reduction(| : failed)
    {
      float* v = thread_scratch(omp_get_thread_num());
      float* m = v + tile_size_;
#pragma omp for schedule(static)
      for (int64_t bi = 0; bi < blocks_; ++bi) {
        const int64_t t0 = bi * blk, nt = std::min(blk, tiles - t0);
        wino_input_tiles(in, cin, g_, t0, nt, v, cin, blk * cin);
        for (int64_t p = 0; p < kPoints; ++p)
          failed |= dnnl_sgemm('N', 'N', nt, cout, cin, 1.f, v + p * blk * cin, cin, u + p * cin * cout,
                               cout, 0.f, m + p * blk * cout, cout) != dnnl_success;
        wino_output_tiles(m, cout, blk * cout, cout, g_, t0, nt, out);
      }
    }
    if (failed) throw Error(str_cat("layer ", name_, ": Winograd sgemm failed"));
  }

  // dw[k][c] = G^T (sum over threads' dU[p][c][k]) G; each thread accumulates its blocks.
  void weight_grad(const float* x, const float* dy, float* dw) {
    const int64_t tiles = g_.tiles(), blk = block_, c = c_, k = k_, ps = c_ * k_;
    int failed = 0;
    int used = 1;
#pragma omp parallel num_threads(nthr_) reduction(| : failed)
    {
      const int t = omp_get_thread_num();
#pragma omp single
      used = omp_get_num_threads();
      float* v = thread_scratch(t);
      float* dm = v + tile_size_;
      float* acc = dm + tile_size_;
      float beta = 0.f;  // the first block overwrites the accumulator
#pragma omp for schedule(static)
      for (int64_t bi = 0; bi < blocks_; ++bi) {
        const int64_t t0 = bi * blk, nt = std::min(blk, tiles - t0);
        wino_input_tiles(x, c, g_, t0, nt, v, c, blk * c);
        wino_grad_tiles(dy, k, g_, t0, nt, dm, k, blk * k);
        for (int64_t p = 0; p < kPoints; ++p)
          failed |= dnnl_sgemm('T', 'N', c, k, nt, 1.f, v + p * blk * c, c, dm + p * blk * k, k, beta,
                               acc + p * ps, k) != dnnl_success;
        beta = 1.f;
      }
      if (beta == 0.f) std::fill(acc, acc + kPoints * ps, 0.f);  // a thread with no block
    }
    if (failed) throw Error(str_cat("layer ", name_, ": Winograd sgemm failed"));
    // Threads' sums are added in thread order, so the result depends only on the thread count.
#pragma omp parallel for num_threads(nthr_) schedule(static)
    for (int64_t ci = 0; ci < c; ++ci) {
      float du[kPoints];
      for (int64_t ki = 0; ki < k; ++ki) {
        for (int64_t p = 0; p < kPoints; ++p) {
          float s = 0.f;
          for (int t = 0; t < used; ++t) s += thread_scratch(t)[2 * tile_size_ + p * ps + ci * k + ki];
          du[p] = s;
        }
        filter_grad(du, 1, dw + (ki * c + ci) * 9);
      }
    }
  }

  ContextPtr ctx_;
  std::string name_;
  int64_t c_, k_;
  WinoGeom g_;
  int nthr_;
  int64_t block_ = 0, blocks_ = 0, u_size_ = 0, tile_size_ = 0, per_thread_ = 0;
};

}  // namespace

bool winograd_applies(const ConvDesc& d) {
  return d.kernel_h == 3 && d.kernel_w == 3 && d.stride_h == 1 && d.stride_w == 1 && d.pad_h == 1 &&
         d.pad_w == 1 && !d.bias && d.groups == 1 && d.in.c % 8 == 0 && d.out_c % 8 == 0 &&
         d.in.h * d.in.w > 1 && winograd_cpu_ok();
}

bool winograd_pays(const ConvDesc& d) { return winograd_applies(d) && d.in.c >= 64 && d.out_c >= 64; }

std::unique_ptr<ConvOp<float>> make_winograd_conv_op(const ContextPtr& ctx, const ConvDesc& d) {
  return std::make_unique<WinogradConv>(ctx, d);
}

}  // namespace rt::dnn

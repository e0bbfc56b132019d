// The Winograd F(2x2, 3x3) tile transforms, one __m256 per 8-channel block. This file alone is
// compiled with -mavx2 -mfma, so it includes no standard library templates: an inline function
// instantiated here could be picked by the linker for baseline-x86 callers elsewhere.
//
// With B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], A^T = [1 1 1 0; 0 1 -1 -1]:
//   y = A^T [(G g G^T) . (B^T d B)] A  per 2x2 output tile, d its 4x4 input patch (pad 1).
#include "nn/onednn/winograd_kernels.h"

#include <immintrin.h>

namespace rt::dnn {

bool winograd_cpu_ok() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

namespace {

struct TilePos {
  int64_t n, y0, x0;  // batch index, top-left output pixel
};
inline TilePos tile_pos(const WinoGeom& g, int64_t t) {
  const int64_t per = g.tiles_h * g.tiles_w, r = t % per;
  return {t / per, 2 * (r / g.tiles_w), 2 * (r % g.tiles_w)};
}

// The 4-point transform B^T applied to a, b, c, d (rows or columns of a patch).
inline void bt4(__m256& a, __m256& b, __m256& c, __m256& d) {
  const __m256 t0 = _mm256_sub_ps(a, c), t1 = _mm256_add_ps(b, c), t2 = _mm256_sub_ps(c, b),
               t3 = _mm256_sub_ps(b, d);
  a = t0, b = t1, c = t2, d = t3;
}

// A applied to a 2-vector: (a, a + b, a - b, -b).
inline void a2(__m256 a, __m256 b, __m256* o) {
  o[0] = a;
  o[1] = _mm256_add_ps(a, b);
  o[2] = _mm256_sub_ps(a, b);
  o[3] = _mm256_sub_ps(_mm256_setzero_ps(), b);
}

}  // namespace

void wino_input_tiles(const float* x, int64_t c, const WinoGeom& g, int64_t t0, int64_t nt, float* v,
                      int64_t ld, int64_t pstride) {
  const int64_t cb_n = c / 8, plane = g.h * g.w * 8;
  for (int64_t i = 0; i < nt; ++i) {
    const TilePos tp = tile_pos(g, t0 + i);
    // Patch rows y0-1 .. y0+2, columns x0-1 .. x0+2; out-of-image points read as zero.
    int64_t off[4][4];
    bool ok[4][4];
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 4; ++b) {
        const int64_t yy = tp.y0 - 1 + a, xx = tp.x0 - 1 + b;
        ok[a][b] = yy >= 0 && yy < g.h && xx >= 0 && xx < g.w;
        off[a][b] = ok[a][b] ? (yy * g.w + xx) * 8 : 0;
      }
    const float* xn = x + tp.n * cb_n * plane;
    float* vi = v + i * ld;
    for (int64_t cb = 0; cb < cb_n; ++cb) {
      const float* src = xn + cb * plane;
      __m256 d[4][4];
      for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b)
          d[a][b] = ok[a][b] ? _mm256_loadu_ps(src + off[a][b]) : _mm256_setzero_ps();
      for (int b = 0; b < 4; ++b) bt4(d[0][b], d[1][b], d[2][b], d[3][b]);
      for (int a = 0; a < 4; ++a) bt4(d[a][0], d[a][1], d[a][2], d[a][3]);
      for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b) _mm256_storeu_ps(vi + (4 * a + b) * pstride + cb * 8, d[a][b]);
    }
  }
}

void wino_output_tiles(const float* m, int64_t ld, int64_t pstride, int64_t k, const WinoGeom& g,
                       int64_t t0, int64_t nt, float* y) {
  const int64_t kb_n = k / 8, plane = g.h * g.w * 8;
  for (int64_t i = 0; i < nt; ++i) {
    const TilePos tp = tile_pos(g, t0 + i);
    const bool full_h = tp.y0 + 1 < g.h, full_w = tp.x0 + 1 < g.w;
    const float* mi = m + i * ld;
    float* yn = y + tp.n * kb_n * plane + (tp.y0 * g.w + tp.x0) * 8;
    for (int64_t kb = 0; kb < kb_n; ++kb) {
      __m256 s[2][4];
      for (int b = 0; b < 4; ++b) {
        const __m256 m0 = _mm256_loadu_ps(mi + b * pstride + kb * 8),
                     m1 = _mm256_loadu_ps(mi + (4 + b) * pstride + kb * 8),
                     m2 = _mm256_loadu_ps(mi + (8 + b) * pstride + kb * 8),
                     m3 = _mm256_loadu_ps(mi + (12 + b) * pstride + kb * 8);
        s[0][b] = _mm256_add_ps(_mm256_add_ps(m0, m1), m2);
        s[1][b] = _mm256_sub_ps(_mm256_sub_ps(m1, m2), m3);
      }
      float* dst = yn + kb * plane;
      for (int a = 0; a < 2; ++a) {
        if (a == 1 && !full_h) break;
        const __m256 o0 = _mm256_add_ps(_mm256_add_ps(s[a][0], s[a][1]), s[a][2]);
        _mm256_storeu_ps(dst + a * g.w * 8, o0);
        if (full_w) {
          const __m256 o1 = _mm256_sub_ps(_mm256_sub_ps(s[a][1], s[a][2]), s[a][3]);
          _mm256_storeu_ps(dst + (a * g.w + 1) * 8, o1);
        }
      }
    }
  }
}

void wino_grad_tiles(const float* dy, int64_t k, const WinoGeom& g, int64_t t0, int64_t nt, float* dm,
                     int64_t ld, int64_t pstride) {
  const int64_t kb_n = k / 8, plane = g.h * g.w * 8;
  for (int64_t i = 0; i < nt; ++i) {
    const TilePos tp = tile_pos(g, t0 + i);
    const bool full_h = tp.y0 + 1 < g.h, full_w = tp.x0 + 1 < g.w;
    const float* src_n = dy + tp.n * kb_n * plane + (tp.y0 * g.w + tp.x0) * 8;
    float* di = dm + i * ld;
    for (int64_t kb = 0; kb < kb_n; ++kb) {
      const float* src = src_n + kb * plane;
      const __m256 z = _mm256_setzero_ps();
      const __m256 e00 = _mm256_loadu_ps(src), e01 = full_w ? _mm256_loadu_ps(src + 8) : z,
                   e10 = full_h ? _mm256_loadu_ps(src + g.w * 8) : z,
                   e11 = full_h && full_w ? _mm256_loadu_ps(src + g.w * 8 + 8) : z;
      __m256 c0[4], c1[4];  // A applied down the two columns
      a2(e00, e10, c0);
      a2(e01, e11, c1);
      for (int a = 0; a < 4; ++a) {
        __m256 r[4];
        a2(c0[a], c1[a], r);
        for (int b = 0; b < 4; ++b) _mm256_storeu_ps(di + (4 * a + b) * pstride + kb * 8, r[b]);
      }
    }
  }
}

}  // namespace rt::dnn

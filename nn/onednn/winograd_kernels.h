// Tile transforms of Winograd F(2x2, 3x3) on nChw8c activations (C a multiple of 8), AVX2+FMA.
// Call only when winograd_cpu_ok(). Tiles are numbered t = (n * tiles_h + ty) * tiles_w + tx, a
// tile covering output rows 2ty, 2ty+1 and columns 2tx, 2tx+1; a run of tiles [t0, t0 + nt)
// maps to rows 0..nt-1 of 16 matrices (one per point p = 4i + j of the 4x4 transformed tile),
// matrix p starting at p * pstride, row i at i * ld.
#pragma once
#include <cstdint>

namespace rt::dnn {

struct WinoGeom {
  int64_t n, h, w;         // batch and spatial size (input = output, stride 1, pad 1)
  int64_t tiles_h, tiles_w;
  int64_t tiles() const { return n * tiles_h * tiles_w; }
};

// True when this CPU runs the AVX2+FMA kernels below.
bool winograd_cpu_ok();

// V = B^T d B of the 4x4 input patches (zero outside the image) of x (c channels).
void wino_input_tiles(const float* x, int64_t c, const WinoGeom& g, int64_t t0, int64_t nt, float* v,
                      int64_t ld, int64_t pstride);

// y = A^T m A: the 2x2 output tiles of m (k channels) written into y, clipped to the image.
void wino_output_tiles(const float* m, int64_t ld, int64_t pstride, int64_t k, const WinoGeom& g,
                       int64_t t0, int64_t nt, float* y);

// dM = A dy A^T of the 2x2 tiles of dy (k channels, zero outside the image): the gradient
// with respect to the transformed product, for the weight gradient.
void wino_grad_tiles(const float* dy, int64_t k, const WinoGeom& g, int64_t t0, int64_t nt, float* dm,
                     int64_t ld, int64_t pstride);

}  // namespace rt::dnn

// The ring schedule without MPI: chunks partition the buffer, sends match receives, a simulated
// ring ends with the exact sum on every rank, traffic is 2(N-1)/N of the buffer, 64-bit counts
// split safely; and the CPU reduce kernels against plain loops.
#include "comm/ring_schedule.h"

#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "comm/reduce.h"

namespace rt::comm {
namespace {

const std::vector<size_t> kCounts = {0, 1, 2, 3, 5, 7, 8, 13, 64, 97, 1000, 1009};

TEST(RingSchedule, ChunksPartitionTheBufferEvenly) {
  for (int n = 1; n <= 9; ++n) {
    for (size_t count : kCounts) {
      size_t next = 0;
      for (int i = 0; i < n; ++i) {
        const Range c = ring_chunk(count, n, i);
        EXPECT_EQ(c.offset, next) << "n " << n << " count " << count << " chunk " << i;
        EXPECT_TRUE(c.len == count / n || c.len == count / n + 1);
        next += c.len;
      }
      EXPECT_EQ(next, count);
    }
  }
}

TEST(RingSchedule, ChunksOfCountsAboveIntMaxUse64BitOffsets) {
  const size_t count = (size_t(1) << 33) + 7;  // 8 Gi + 7 elements
  const Range last = ring_chunk(count, 3, 2);
  EXPECT_EQ(last.offset + last.len, count);
  EXPECT_GT(last.offset, size_t(INT_MAX));
  // Segments of such a chunk never exceed MPI's int limit.
  const size_t seg = segment_elems(size_t(1) << 40, 4, size_t(INT_MAX));
  EXPECT_EQ(seg, size_t(INT_MAX));
  size_t covered = 0;
  for (size_t k = 0; k < segment_count(last, seg); ++k) {
    const Range s = segment_at(last, seg, k);
    EXPECT_LE(s.len, size_t(INT_MAX));
    EXPECT_EQ(s.offset, last.offset + covered);
    covered += s.len;
  }
  EXPECT_EQ(covered, last.len);
}

TEST(RingSchedule, SegmentElemsRespectsBytesAndPerCallLimit) {
  EXPECT_EQ(segment_elems(1 << 20, 4, INT_MAX), size_t(1) << 18);
  EXPECT_EQ(segment_elems(1 << 20, 4, 1000), 1000u);
  EXPECT_EQ(segment_elems(1, 4, 1000), 1u);  // never zero
  EXPECT_EQ(segment_count(Range{5, 0}, 16), 0u);
  EXPECT_EQ(segment_count(Range{5, 33}, 16), 3u);
  EXPECT_EQ(segment_at(Range{5, 33}, 16, 2), (Range{37, 1}));
}

TEST(RingSchedule, EachSendMatchesTheNextRanksReceive) {
  for (int n = 2; n <= 9; ++n)
    for (size_t count : kCounts)
      for (int s = 0; s < ring_num_steps(n); ++s)
        for (int r = 0; r < n; ++r) {
          const RingStep me = ring_step(r, n, count, s);
          const RingStep right = ring_step((r + 1) % n, n, count, s);
          EXPECT_EQ(me.send_chunk, right.recv_chunk);
          EXPECT_EQ(me.send, right.recv);
          EXPECT_EQ(me.reduce, right.reduce);
          EXPECT_EQ(me.reduce, s < n - 1);
        }
}

TEST(RingSchedule, AllgatherStartsFromTheOwnedChunk) {
  for (int n = 2; n <= 9; ++n)
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ring_step(r, n, 100, n - 2).recv_chunk, ring_owned_chunk(r, n));
      EXPECT_EQ(ring_step(r, n, 100, n - 1).send_chunk, ring_owned_chunk(r, n));
    }
}

// Runs the schedule on n simulated ranks (every step's sends read the state before the step,
// as they would across processes) and checks the exact sum everywhere, with segmenting.
TEST(RingSchedule, SimulatedRingEndsWithTheSumOnEveryRank) {
  for (int n = 1; n <= 9; ++n) {
    for (size_t count : kCounts) {
      std::vector<std::vector<int64_t>> buf(n, std::vector<int64_t>(count));
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) buf[r][i] = (r + 1) * int64_t(1 + i % 11);
      for (int s = 0; s < ring_num_steps(n); ++s) {
        auto before = buf;
        for (int r = 0; r < n; ++r) {
          const RingStep st = ring_step(r, n, count, s);
          const int prev = (r + n - 1) % n;
          for (size_t k = 0; k < segment_count(st.recv, 3); ++k) {
            const Range sg = segment_at(st.recv, 3, k);
            for (size_t i = sg.offset; i < sg.offset + sg.len; ++i)
              buf[r][i] = st.reduce ? buf[r][i] + before[prev][i] : before[prev][i];
          }
        }
      }
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(buf[r][i], int64_t(n * (n + 1) / 2) * int64_t(1 + i % 11))
              << "n " << n << " count " << count << " rank " << r << " i " << i;
    }
  }
}

TEST(RingSchedule, EachRankSendsTwoNMinusOneOverNOfTheBuffer) {
  for (int n = 2; n <= 9; ++n) {
    const size_t count = 1000 * n;
    for (int r = 0; r < n; ++r) {
      size_t sent = 0;
      for (int s = 0; s < ring_num_steps(n); ++s) sent += ring_step(r, n, count, s).send.len;
      EXPECT_EQ(sent, 2 * (n - 1) * count / n);
    }
  }
}

TEST(ReduceKernels, F32AddMatchesPlainLoopAtEveryLengthAndAlignment) {
  const ReduceKernels& k = cpu_reduce_kernels();
  for (size_t n : {0, 1, 7, 8, 31, 32, 33, 100, 1027}) {
    for (size_t misalign : {0, 1, 3}) {
      std::vector<float> a(n + misalign), b(n + misalign), ref;
      for (size_t i = 0; i < a.size(); ++i) {
        a[i] = 0.25f * float(i) - 3.0f;
        b[i] = 1.5f * float(i % 13) + 0.1f;
      }
      ref = a;
      reduce_add_f32_scalar(ref.data() + misalign, b.data() + misalign, n);
      k.reduce_add(DType::f32, a.data() + misalign, b.data() + misalign, n);
      EXPECT_EQ(a, ref) << "n " << n << " misalign " << misalign;
    }
  }
}

TEST(ReduceKernels, ScaleAndBf16) {
  const ReduceKernels& k = cpu_reduce_kernels();
  std::vector<float> v(37);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  k.scale(DType::f32, v.data(), v.size(), 0.25f);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], float(i) * 0.25f);

  // bf16 adds in fp32 and rounds once: 256 + 1 is not representable (8 significant bits) and
  // rounds to even (256); 1 + 2 = 3 is exact.
  bf16_t d[2] = {to_bf16(256.0f), to_bf16(1.0f)};
  const bf16_t s[2] = {to_bf16(1.0f), to_bf16(2.0f)};
  k.reduce_add(DType::bf16, d, s, 2);
  EXPECT_EQ(from_bf16(d[0]), 256.0f);
  EXPECT_EQ(from_bf16(d[1]), 3.0f);
  EXPECT_TRUE(k.supports(DType::bf16));
  EXPECT_TRUE(k.supports(DType::f16));

  // fp16 the same way (11 significant bits: 2048 + 1 rounds to even, 2048 + 3 to 2052), and
  // 65504 + 16 = 65520 rounds to inf.
  f16_t h[3] = {to_f16(2048.0f), to_f16(2048.0f), to_f16(65504.0f)};
  const f16_t hs[3] = {to_f16(1.0f), to_f16(3.0f), to_f16(16.0f)};
  k.reduce_add(DType::f16, h, hs, 3);
  EXPECT_EQ(from_f16(h[0]), 2048.0f);
  EXPECT_EQ(from_f16(h[1]), 2052.0f);
  EXPECT_TRUE(std::isinf(from_f16(h[2])));
  k.scale(DType::f16, h, 2, 0.5f);
  EXPECT_EQ(from_f16(h[0]), 1024.0f);
  EXPECT_EQ(from_f16(h[1]), 1026.0f);
}

// Equal as values and as bits, or both NaN of the same sign (the vector fp16 conversion keeps a
// NaN's payload where to_f16 makes it 0x7e00).
template <class T>
bool is_nan16(T v) {
  return (v.bits & 0x7fff) > (std::is_same_v<T, bf16_t> ? 0x7f80 : 0x7c00);
}
template <class T>
bool same16(T a, T b) {
  if (is_nan16(a) || is_nan16(b))
    return is_nan16(a) && is_nan16(b) && (a.bits & 0x8000) == (b.bits & 0x8000);
  return a.bits == b.bits;
}

// Gradient compression's conversions and the 16-bit add and scale (vector paths with scalar
// tails) against the host roundings of nn/tensor.h, element by element: fp32 bit patterns from every exponent (normal,
// subnormal, inf, NaN, the fp16 overflow threshold), at every tail length and misalignment, with
// a scale applied before the one rounding.
TEST(ReduceKernels, SixteenBitPathsRoundOnceAsTheHostRoundings) {
  const ReduceKernels& k = cpu_reduce_kernels();
  std::vector<float> x;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 458759u) {
    const uint32_t u = uint32_t(b);
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 0x1p-24f, 0x1p-25f,
                  0x1.8p-25f, 1.0f + 0x1p-8f, 1.0f + 0x1p-11f, INFINITY, -INFINITY, NAN})
    x.push_back(f);
  for (float s : {1.0f, 0.25f, 1.0f / 3.0f}) {
    for (size_t misalign : {0, 1, 3}) {
      const size_t n = x.size() - misalign;
      std::vector<bf16_t> b(x.size());
      std::vector<f16_t> h(x.size());
      k.convert(DType::bf16, b.data() + misalign, DType::f32, x.data() + misalign, n, s);
      k.convert(DType::f16, h.data() + misalign, DType::f32, x.data() + misalign, n, s);
      size_t bad_b = 0, bad_h = 0;
      for (size_t i = misalign; i < x.size(); ++i) {
        bad_b += !same16(b[i], to_bf16(x[i] * s));
        bad_h += !same16(h[i], to_f16(x[i] * s));
      }
      EXPECT_EQ(bad_b, 0u) << "f32 -> bf16, scale " << s << " misalign " << misalign;
      EXPECT_EQ(bad_h, 0u) << "f32 -> f16, scale " << s << " misalign " << misalign;
      std::vector<float> back_b(x.size()), back_h(x.size());
      k.convert(DType::f32, back_b.data() + misalign, DType::bf16, b.data() + misalign, n, s);
      k.convert(DType::f32, back_h.data() + misalign, DType::f16, h.data() + misalign, n, s);
      for (size_t i = misalign; i < x.size(); ++i) {
        const float eb = from_bf16(b[i]) * s, eh = from_f16(h[i]) * s;
        bad_b += !(std::memcmp(&back_b[i], &eb, 4) == 0 || (std::isnan(back_b[i]) && std::isnan(eb)));
        bad_h += !(std::memcmp(&back_h[i], &eh, 4) == 0 || (std::isnan(back_h[i]) && std::isnan(eh)));
      }
      EXPECT_EQ(bad_b, 0u) << "bf16 -> f32, scale " << s << " misalign " << misalign;
      EXPECT_EQ(bad_h, 0u) << "f16 -> f32, scale " << s << " misalign " << misalign;
    }
  }
  // The 16-bit add and scale (vectors of eight, then the tail) against the host roundings, on
  // the converted patterns above: fp16 sums past 65504 become inf, NaNs stay NaN.
  for (size_t misalign : {0, 1, 3}) {
    const size_t n = x.size() - 1 - misalign;
    std::vector<bf16_t> b(x.size());
    std::vector<f16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) b[i] = to_bf16(x[i]), h[i] = to_f16(x[i]);
    auto b2 = b;
    auto h2 = h;
    // dst[i] += src[i + 1]: neighbours, so that most sums mix magnitudes.
    k.reduce_add(DType::bf16, b2.data() + misalign, b.data() + misalign + 1, n);
    k.reduce_add(DType::f16, h2.data() + misalign, h.data() + misalign + 1, n);
    size_t bad_b = 0, bad_h = 0;
    for (size_t i = misalign; i < misalign + n; ++i) {
      bad_b += !same16(b2[i], to_bf16(from_bf16(b[i]) + from_bf16(b[i + 1])));
      bad_h += !same16(h2[i], to_f16(from_f16(h[i]) + from_f16(h[i + 1])));
    }
    EXPECT_EQ(bad_b, 0u) << "bf16 add, misalign " << misalign;
    EXPECT_EQ(bad_h, 0u) << "f16 add, misalign " << misalign;
    b2 = b;
    h2 = h;
    k.scale(DType::bf16, b2.data() + misalign, n, 1.0f / 3);
    k.scale(DType::f16, h2.data() + misalign, n, 3.0f);
    for (size_t i = misalign; i < misalign + n; ++i) {
      bad_b += !same16(b2[i], to_bf16(from_bf16(b[i]) * (1.0f / 3)));
      bad_h += !same16(h2[i], to_f16(from_f16(h[i]) * 3.0f));
    }
    EXPECT_EQ(bad_b, 0u) << "bf16 scale, misalign " << misalign;
    EXPECT_EQ(bad_h, 0u) << "f16 scale, misalign " << misalign;
  }
  // The boundaries themselves: 65520 is fp16's first inf, 0x1p-25 rounds to zero (even).
  f16_t h[2];
  const float edge[2] = {65520.0f, 0x1p-25f};
  k.convert(DType::f16, h, DType::f32, edge, 2, 1.0f);
  EXPECT_EQ(h[0].bits, 0x7c00);
  EXPECT_EQ(h[1].bits, 0x0000);
}

}  // namespace
}  // namespace rt::comm

// The ring schedule without MPI: chunks partition the buffer, sends match receives, a simulated
// ring ends with the exact sum on every rank, traffic is 2(N-1)/N of the buffer, 64-bit counts
// split safely; and the CPU reduce kernels against plain loops.
#include "comm/ring_schedule.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
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
  EXPECT_FALSE(k.supports(DType::f16));
}

}  // namespace
}  // namespace rt::comm

// Host-side arithmetic of the CUDA backend's memory: device arena placement and the chunk
// schedule of pinned staging (no GPU, no CUDA headers).
#include <gtest/gtest.h>

#include "cuda/arena_layout.h"
#include "cuda/staging_schedule.h"

namespace rt::cuda {
namespace {

TEST(CudaArenaLayout, RegionsAreAlignedDisjointAndInOrder) {
  ArenaLayout l;
  EXPECT_EQ(l.total(), 0u);
  EXPECT_EQ(l.add("params", 1000), 0u);
  EXPECT_EQ(l.add("grads", 1000), 1u);
  EXPECT_EQ(l.add("flag", 4, 4), 2u);
  EXPECT_EQ(l.add("empty", 0), 3u);
  EXPECT_EQ(l.add("workspace", 1), 4u);
  const auto& s = l.slots();
  EXPECT_EQ(s[0].offset, 0u);
  EXPECT_EQ(s[1].offset, 1024u);  // 1000 rounded up to 256
  EXPECT_EQ(s[2].offset, 2024u);  // 4-byte alignment suffices
  EXPECT_EQ(s[3].offset, 2048u);
  EXPECT_EQ(s[4].offset, 2048u);  // an empty region takes no space
  EXPECT_EQ(l.total(), 2049u);
  for (size_t i = 1; i < s.size(); ++i) EXPECT_GE(s[i].offset, s[i - 1].offset + s[i - 1].bytes);
  EXPECT_EQ(s[1].name, "grads");
}

TEST(CudaArenaLayout, RefusesBadAlignmentAndOverflow) {
  ArenaLayout l;
  EXPECT_THROW(l.add("a", 8, 0), Error);
  EXPECT_THROW(l.add("a", 8, 24), Error);   // not a power of two
  EXPECT_THROW(l.add("a", 8, 512), Error);  // more than the base guarantees
  l.add("big", SIZE_MAX - 100);
  EXPECT_THROW(l.add("more", 200), Error);
}

TEST(CudaStagingSchedule, ChunksCoverTheBufferRoundRobin) {
  const auto c = staging_schedule(10, 4, 2);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].offset, 0u);
  EXPECT_EQ(c[2].offset, 8u);
  EXPECT_EQ(c[2].bytes, 2u);
  EXPECT_EQ(c[0].slot, 0);
  EXPECT_EQ(c[1].slot, 1);
  EXPECT_EQ(c[2].slot, 0);
  EXPECT_EQ(c[0].reuses, -1);
  EXPECT_EQ(c[1].reuses, -1);
  EXPECT_EQ(c[2].reuses, 0);  // chunk 2 waits until chunk 0 has left slot 0
  EXPECT_TRUE(staging_schedule(0, 4, 2).empty());
}

TEST(CudaStagingSchedule, ManySizesAndSlots) {
  for (size_t bytes : {size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{1} << 33})
    for (size_t chunk : {size_t{1} << 12, size_t{1} << 22})
      for (int slots : {1, 2, 3}) {
        if (bytes / chunk > 10000) continue;
        const auto c = staging_schedule(bytes, chunk, slots);
        size_t next = 0;
        for (size_t k = 0; k < c.size(); ++k) {
          EXPECT_EQ(c[k].offset, next);
          EXPECT_GE(c[k].bytes, 1u);
          EXPECT_LE(c[k].bytes, chunk);
          EXPECT_EQ(c[k].slot, int(k % size_t(slots)));
          EXPECT_EQ(c[k].reuses, k >= size_t(slots) ? int64_t(k) - slots : -1);
          next += c[k].bytes;
        }
        EXPECT_EQ(next, bytes);
      }
}

TEST(CudaStagingSchedule, RefusesEmptyChunksAndNoSlots) {
  EXPECT_THROW(staging_schedule(10, 0, 2), Error);
  EXPECT_THROW(staging_schedule(10, 4, 0), Error);
}

}  // namespace
}  // namespace rt::cuda

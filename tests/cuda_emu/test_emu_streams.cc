// The emulator's streams: queued work runs only when something waits for it, in each stream's
// order and behind the events it waits for, with CUDA's rules for the legacy default stream and
// for copies to and from pageable memory. Device memory is host memory here, so the tests look at
// it directly to see what has run.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "tests/cuda_emu/runtime.h"
#include "tests/cuda_emu/streams.h"

namespace {

constexpr size_t kBytes = 64;

// A device buffer and its bytes as the host sees them now.
struct Buf {
  Buf() { EXPECT_EQ(cudaMalloc(&p, kBytes), cudaSuccess); }
  ~Buf() { cudaFree(p); }
  unsigned char at(size_t i) const { return static_cast<const unsigned char*>(p)[i]; }
  bool all(unsigned char v) const {
    for (size_t i = 0; i < kBytes; ++i)
      if (at(i) != v) return false;
    return true;
  }
  void* p = nullptr;
};

struct Stream {
  explicit Stream(unsigned flags = cudaStreamNonBlocking) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
  }
  ~Stream() { cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};

TEST(emu_streams, QueuedWorkRunsWhenWaitedFor) {
  Buf a;
  Stream s;
  ASSERT_EQ(cudaMemsetAsync(a.p, 1, kBytes, s.s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a.p, 2, kBytes, s.s), cudaSuccess);
  EXPECT_TRUE(a.all(rt_emu::kPoison)) << "ran before anything waited for it";
  // A query lets one item run: the first fill, then the second.
  EXPECT_EQ(cudaStreamQuery(s.s), cudaErrorNotReady);
  EXPECT_TRUE(a.all(1));
  EXPECT_EQ(cudaStreamQuery(s.s), cudaSuccess);
  EXPECT_TRUE(a.all(2));
  ASSERT_EQ(cudaMemsetAsync(a.p, 3, kBytes, s.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_TRUE(a.all(3));
}

TEST(emu_streams, AStreamSeesAnotherStreamsWorkOnlyBehindItsEvent) {
  Buf a, b;
  Stream producer, consumer;
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a.p, 7, kBytes, producer.s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, producer.s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer.s, e, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b.p, a.p, kBytes, cudaMemcpyDeviceToDevice, consumer.s), cudaSuccess);
  // Work queued on the producer after the record is not waited for.
  ASSERT_EQ(cudaMemsetAsync(a.p, 8, kBytes, producer.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer.s), cudaSuccess);
  EXPECT_TRUE(b.all(7));
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  EXPECT_TRUE(a.all(7)) << "the fill after the event ran too";
  // No wait: the copy runs before the producer's fill.
  ASSERT_EQ(cudaMemsetAsync(a.p, 9, kBytes, producer.s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b.p, a.p, kBytes, cudaMemcpyDeviceToDevice, consumer.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer.s), cudaSuccess);
  EXPECT_TRUE(b.all(7));
  ASSERT_EQ(cudaStreamSynchronize(producer.s), cudaSuccess);
  EXPECT_TRUE(a.all(9));
  // A later record of the same event does not move a wait already queued.
  ASSERT_EQ(cudaEventRecord(e, producer.s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer.s, e, 0), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a.p, 10, kBytes, producer.s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, producer.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer.s), cudaSuccess);
  EXPECT_TRUE(a.all(9));
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  EXPECT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_TRUE(a.all(10));
  cudaEventDestroy(e);
}

TEST(emu_streams, LegacyDefaultStreamWaitsForBlockingStreamsOnly) {
  Buf a, b;
  Stream blocking(cudaStreamDefault), nonblocking;
  std::vector<unsigned char> host(kBytes);
  ASSERT_EQ(cudaMemsetAsync(a.p, 1, kBytes, blocking.s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), a.p, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, std::vector<unsigned char>(kBytes, 1));
  ASSERT_EQ(cudaMemsetAsync(b.p, 2, kBytes, nonblocking.s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), b.p, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, std::vector<unsigned char>(kBytes, rt_emu::kPoison));
  ASSERT_EQ(cudaStreamSynchronize(nonblocking.s), cudaSuccess);
  // And a blocking stream waits for the default stream's work queued before.
  ASSERT_EQ(cudaMemset(a.p, 3, kBytes), cudaSuccess);  // queued: device memory
  EXPECT_TRUE(a.all(1));
  ASSERT_EQ(cudaMemcpyAsync(b.p, a.p, kBytes, cudaMemcpyDeviceToDevice, blocking.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(blocking.s), cudaSuccess);
  EXPECT_TRUE(b.all(3));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(emu_streams, PageableMemoryIsReadAtTheCallAndWrittenBeforeItReturns) {
  Buf a;
  Stream s;
  std::vector<unsigned char> src(kBytes, 4), dst(kBytes, 0);
  ASSERT_EQ(cudaMemcpyAsync(a.p, src.data(), kBytes, cudaMemcpyHostToDevice, s.s), cudaSuccess);
  std::fill(src.begin(), src.end(), 5);  // reusable at once, as CUDA stages it
  ASSERT_EQ(cudaMemcpyAsync(dst.data(), a.p, kBytes, cudaMemcpyDeviceToHost, s.s), cudaSuccess);
  EXPECT_EQ(dst, std::vector<unsigned char>(kBytes, 4));  // done on return, and after the fill
  // Pinned memory: the copy is queued like any other.
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, kBytes), cudaSuccess);
  std::memset(pinned, 0, kBytes);
  ASSERT_EQ(cudaMemcpyAsync(pinned, a.p, kBytes, cudaMemcpyDeviceToHost, s.s), cudaSuccess);
  EXPECT_EQ(static_cast<unsigned char*>(pinned)[0], 0);
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_EQ(static_cast<unsigned char*>(pinned)[kBytes - 1], 4);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

TEST(emu_streams, EventsTimeOnlyWhatHasRun) {
  Stream s;
  Buf a;
  cudaEvent_t start, end, untimed;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorInvalidResourceHandle);  // unrecorded
  EXPECT_EQ(cudaEventSynchronize(start), cudaSuccess);  // never recorded: nothing to wait for
  ASSERT_EQ(cudaEventRecord(start, s.s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a.p, 0, kBytes, s.s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end, s.s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, s.s), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorNotReady);
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  ASSERT_EQ(cudaEventSynchronize(untimed), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
  for (cudaEvent_t e : {start, end, untimed}) cudaEventDestroy(e);
}

TEST(emu_streams, FreeWaitsForWorkThatMayStillUseTheMemory) {
  Stream s;
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, kBytes), cudaSuccess);
  const uint64_t before = rt_emu::items_run();
  ASSERT_EQ(cudaMemsetAsync(p, 0, kBytes, s.s), cudaSuccess);
  EXPECT_EQ(rt_emu::items_run(), before);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(rt_emu::items_run(), before + 1);
}

// cudaMemcpy from pageable memory returns once the bytes are staged ("the DMA to final destination
// may not have completed"): a non-blocking stream's work may run before the copy lands; a
// synchronize of the legacy stream ends it. From page-locked memory it is done on return.
TEST(emu_streams, UploadFromPageableMemoryEndsOnlyWithTheLegacyStream) {
  Buf a, b;
  Stream nonblocking;
  std::vector<unsigned char> host(kBytes, 7);
  ASSERT_EQ(cudaMemcpy(a.p, host.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  host.assign(kBytes, 8);  // staged at the call: the caller may reuse its buffer
  ASSERT_EQ(cudaMemcpyAsync(b.p, a.p, kBytes, cudaMemcpyDeviceToDevice, nonblocking.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nonblocking.s), cudaSuccess);
  EXPECT_TRUE(b.all(rt_emu::kPoison));
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_TRUE(a.all(7));

  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, kBytes), cudaSuccess);
  std::memset(pinned, 9, kBytes);
  ASSERT_EQ(cudaMemcpy(a.p, pinned, kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_TRUE(a.all(9));
  cudaFreeHost(pinned);
}

TEST(emu_streams, LibraryCallsQueueOnTheirHandlesStream) {
  Stream s;
  float* d = nullptr;  // a, b, c: 1 x 1 matrices
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 3 * sizeof(float)), cudaSuccess);
  const float ab[2] = {2, 3};
  ASSERT_EQ(cudaMemcpy(d, ab, sizeof ab, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);  // s does not wait for stream 0
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(h, s.s), CUBLAS_STATUS_SUCCESS);
  float alpha = 1, beta = 0;
  ASSERT_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &alpha, d, 1, d + 1, 1, &beta, d + 2, 1),
            CUBLAS_STATUS_SUCCESS);
  alpha = 100;  // read at the call, as cuBLAS reads host scalars
  EXPECT_TRUE(std::isnan(d[2]));
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_EQ(d[2], 6.0f);
  cublasDestroy(h);
  cudaFree(d);
}

}  // namespace

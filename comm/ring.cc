// The ring allreduce: reduce-scatter then allgather around a ring of MPI point-to-point messages.
#include <vector>

#include "comm/allreduce.h"
#include "comm/mpi_check.h"
#include "comm/ring_schedule.h"

namespace rt::comm {

// ---------------------------------------------------------------------------------------------
// Ring allreduce
//
// N ranks sit on a ring. Each rank only ever sends to its right neighbour and receives from its
// left one, so every link carries the same load and no rank is a hot spot:
//
//          +------> [1] ------+
//          |                  |
//         [0]                [2]        rank r sends to (r+1) mod N,
//          ^                  |         receives from (r-1) mod N
//          +------- [3] <-----+
//
// The buffer (S bytes) is cut into N chunks of S/N bytes (ring_chunk). The algorithm runs in two
// phases of N-1 steps each (ring_step in ring_schedule.h gives the exact ranges):
//
// 1. Reduce-scatter. At step s rank r sends chunk (r-s) mod N and receives chunk (r-s-1) mod N,
//    which it adds into its own copy. A chunk travels around the ring collecting one
//    contribution per hop, so after N-1 steps rank r holds the complete sum of chunk (r+1) mod N.
//    With N = 3 and rank buffers a, b, c:
//
//                  rank 0             rank 1             rank 2
//      start       a0 a1 a2           b0 b1 b2           c0 c1 c2
//      step 0      send a0            send b1            send c2
//                  chunk2 = a2+c2     chunk0 = b0+a0     chunk1 = c1+b1
//      step 1      send a2+c2         send a0+b0         send b1+c1
//                  chunk1 = a1+b1+c1  chunk2 = a2+b2+c2  chunk0 = a0+b0+c0
//                  (owns chunk 1)     (owns chunk 2)     (owns chunk 0)
//
// 2. Allgather. At step s rank r sends the complete chunk it received last (its own one first)
//    and receives the next complete chunk, overwriting its copy. After N-1 steps every rank has
//    every complete chunk.
//
// Each final value is computed by exactly one rank and copied verbatim to the others, so all
// ranks end bitwise identical whatever the summation order. Averaging keeps that: the owner
// scales its chunk by 1/N once, before the allgather distributes it.
//
// Cost. Every rank sends (and receives) 2(N-1) messages of S/N bytes, i.e. 2(N-1)/N · S bytes,
// which is almost independent of N (it tends to 2S). With a per-message latency α and a link
// bandwidth B, and all links busy at once:
//
//      T_ring ≈ 2(N-1)·α + 2(N-1)/N · S/B        (+ (N-1)/N · S/γ to add, at γ bytes/s)
//
// whereas a single reducer receives and sends (N-1)·S bytes through one rank's link:
//
//      T_reducer ≈ 2(N-1)·α + 2(N-1) · S/B
//
// so the ring is N times faster on large buffers. nccl-tests' "bus bandwidth" busbw = S/T ·
// 2(N-1)/N is the per-link rate the ring achieves, comparable across N.
//
// Segments. Each chunk moves in segments of segment_bytes (never more than the communicator's
// per-call element limit, which keeps MPI's int counts safe for any 64-bit count). During the
// reduce-scatter the receive of segment k+1 is already posted into the second scratch buffer
// while segment k is added from the first (double buffering), so the transfer of one segment can
// overlap the arithmetic on the previous one. Sends go straight from the caller's buffer and
// allgather receives straight into it, so no data is copied beyond MPI's own transfers; the only
// extra memory is two segments of scratch, kept between calls.
// ---------------------------------------------------------------------------------------------

namespace {

constexpr int kRingTag = 0x5249;

class RingAllreducer final : public Allreducer {
 public:
  RingAllreducer(Communicator& comm, const ReduceKernels& k, const CommConfig& cfg)
      : Allreducer(comm, k, cfg) {}
  const char* name() const override { return "ring"; }

 protected:
  void run(void* buf, size_t count, DType t, ReduceOp op) override {
    const int n = comm_.size(), r = comm_.rank();
    if (n == 1 || count == 0) return;  // the average over one rank is the buffer itself
    const size_t esz = dtype_size(t), seg = segment_for(t);
    char* base = static_cast<char*>(buf);
    const int next = ring_mod(r + 1, n), prev = ring_mod(r - 1, n);
    // Reduce-scatter. Receives are posted before sends so that a neighbour's message finds its
    // receive waiting. The next step may overwrite what this one sent (N = 2: the allgather
    // receives into the chunk sent here), so each step's sends complete before the next.
    for (int s = 0; s < n - 1; ++s) {
      const RingStep st = ring_step(r, n, count, s);
      recv_reduce_post(st.recv, seg, t, prev, kRingTag);
      send_segments(base, st.send, seg, t, next, kRingTag, sends_);
      recv_reduce_finish(base, st.recv, seg, t, prev, kRingTag);
      comm_.wait_all(sends_, cfg_.idle_sleep_us);
    }
    const Range owned = ring_chunk(count, n, ring_owned_chunk(r, n));
    if (op == ReduceOp::average)  // once, by the owner, so every rank copies the same bits
      kernels_.scale(t, base + owned.offset * esz, owned.len, 1.0f / static_cast<float>(n));

    // Allgather. Every step receives a different chunk straight into the buffer, and nothing sent
    // in this phase is overwritten later, so all receives are posted up front (MPI matches them
    // in order) and the sends complete at the end. Step g forwards what step g-1 received.
    posted_.resize(n - 1);
    for (int g = 0; g < n - 1; ++g)
      posted_[g] = post_recv_segments(base, ring_step(r, n, count, n - 1 + g).recv, seg, t, prev,
                                      kRingTag);
    for (int g = 0; g < n - 1; ++g) {
      send_segments(base, ring_step(r, n, count, n - 1 + g).send, seg, t, next, kRingTag, sends_);
      wait_recvs(posted_[g], t);
    }
    comm_.wait_all(sends_, cfg_.idle_sleep_us);
  }

 private:
  std::vector<size_t> posted_;  // allgather receives per step
};

}  // namespace

std::unique_ptr<Allreducer> make_ring_allreducer(Communicator& comm, const ReduceKernels& k,
                                                 const CommConfig& cfg) {
  return std::make_unique<RingAllreducer>(comm, k, cfg);
}

}  // namespace rt::comm

// The ring allreduce: reduce-scatter then allgather around a ring of MPI point-to-point messages.
#include <algorithm>
#include <vector>

#include "comm/ring.h"

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
// (r is a rank's position on the ring. Positions follow the nodes, each node's ranks in a row
// (ring_order in ring.h), so the ring crosses the network once per node wherever MPI placed the
// ranks; with the usual placement, position and rank coincide.)
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
// reduce-scatter the receives of the next recv_depth − 1 segments are already posted into
// scratch buffers while segment k is added from its own, so transfers overlap the arithmetic on
// earlier segments. Sends go straight from the caller's buffer and allgather receives straight
// into it, so no data is copied beyond MPI's own transfers; the only extra memory is recv_depth
// segments of scratch (comm.recv_depth, default 4), kept between calls.
//
// "ring_pipelined" is the same ring pipelined by segment instead of run step by step: segment k of
// the chunk received at step s is sent on as segment k of step s+1 as soon as it has been added in
// (in the last reduce-scatter step it is final: the owner scales it and starts the allgather with
// it), no step waits for its sends, and recv_depth reduce-scatter receives stay in flight, around
// the same ring (comm.ring_order) as "ring". Each phase's
// messages travel under one tag in (step, segment) order, the order both ends post them, so MPI's
// in-order matching pairs them; an allgather segment lands where this rank's reduce-scatter sent
// from, so that send is completed before the receive is posted. In theory it removes the per-step
// coupling to the right neighbour; measured side by side on the 2-core machine it was no faster
// at N = 2 and 15-40% slower at N = 4 (four ranks on two cores, shared memory and TCP), so "ring"
// stays step by step and the pipelined one is kept for measurements on other machines.
// ---------------------------------------------------------------------------------------------

namespace {

constexpr int kReduceTag = 0x5249, kGatherTag = 0x524A;  // reduce-scatter, allgather messages

// A rank's place on a ring given in order (the rank at each position): its position, and the
// ranks after and before it.
struct RingPlace {
  int pos, next, prev;
};
RingPlace ring_place(const std::vector<int>& order, int rank) {
  const int n = int(order.size());
  const int pos = int(std::find(order.begin(), order.end(), rank) - order.begin());
  return {pos, order[size_t(ring_mod(pos + 1, n))], order[size_t(ring_mod(pos - 1, n))]};
}

class PipelinedRingAllreducer final : public Allreducer {
 public:
  PipelinedRingAllreducer(Communicator& comm, const ReduceKernels& k, const CommConfig& cfg,
                          const MemorySpace* scratch)
      : Allreducer(comm, k, cfg, scratch), place_(ring_place(ring_order(comm, cfg.ring_order), comm.rank())) {}
  const char* name() const override { return "ring_pipelined"; }
  void reserve(DType t) override {
    Allreducer::reserve(t);
    if (scratch_space_) size_window(segment_for(t) * dtype_size(t));
  }

 protected:
  // The ring pipelined by segments (see the essay above): the messages of one phase go out in
  // (step, segment) order under one tag, so a segment is forwarded as soon as it is final here
  // rather than when its whole chunk is.
  void run(void* buf, size_t count, DType t, ReduceOp op) override {
    const int n = comm_.size(), r = place_.pos, next = place_.next, prev = place_.prev;  // chunks by position
    if (n == 1 || count == 0) return;
    const size_t esz = dtype_size(t), seg = segment_for(t), window = size_t(cfg_.recv_depth);
    char* base = static_cast<char*>(buf);
    auto at = [&](Range g) { return base + g.offset * esz; };

    // The reduce-scatter receive sequence: step s = 0 .. n-2, segment k of the chunk received.
    rs_.clear();
    for (int s = 0; s < n - 1; ++s) {
      const Range rr = ring_step(r, n, count, s).recv;
      for (size_t k = 0, nk = segment_count(rr, seg); k < nk; ++k) rs_.push_back(segment_at(rr, seg, k));
    }
    size_window(std::min(seg, ring_chunk(count, n, 0).len) * esz);
    // Step 0 sends the rank's own chunk, segment by segment; its requests are kept: an allgather
    // receive must not land in a range whose reduce-scatter send is still pending.
    sends_.clear();
    gather_sends_.clear();
    const Range first = ring_step(r, n, count, 0).send;
    for (size_t k = 0, nk = segment_count(first, seg); k < nk; ++k) {
      const Range g = segment_at(first, seg, k);
      sends_.push_back(comm_.isend(at(g), g.len, t, next, kReduceTag));
    }
    // Receives go into scratch slot q % window; when a segment is added in, the slot takes the
    // receive window further on and the segment goes on to the next rank: in the last step it is
    // final (this rank owns it), so it is scaled and starts the allgather.
    const size_t nq = rs_.size();
    std::vector<MPI_Request>& rq = rs_req_;
    rq.assign(window, MPI_REQUEST_NULL);
    auto post_rs = [&](size_t q) {
      if (q < nq) rq[q % window] = comm_.irecv(window_[q % window].data(), rs_[q].len, t, prev, kReduceTag);
    };
    for (size_t q = 0; q < std::min(window, nq); ++q) post_rs(q);
    const Range owned = ring_chunk(count, n, ring_owned_chunk(r, n));
    const size_t owned_from = nq - segment_count(owned, seg);  // last step's segments
    for (size_t q = 0; q < nq; ++q) {
      const Range g = rs_[q];
      comm_.wait_recv(rq[q % window], g.len, t, prev, cfg_.idle_sleep_us);
      kernels_.reduce_add(t, at(g), window_[q % window].data(), g.len);
      post_rs(q + window);
      if (q >= owned_from) {
        if (op == ReduceOp::average)  // once, by the owner: every rank copies the same bits
          kernels_.scale(t, at(g), g.len, 1.0f / static_cast<float>(n));
        gather_sends_.push_back(comm_.isend(at(g), g.len, t, next, kGatherTag));
      } else {
        sends_.push_back(comm_.isend(at(g), g.len, t, next, kReduceTag));
      }
    }

    // Allgather: step g receives chunk (r-g) straight into the buffer and forwards it (except in
    // the last step). The range was this rank's reduce-scatter send of step g, i.e. sends_[q] for
    // the same segment index q: it must have completed before the receive is posted (the message
    // that lands there causally follows it, but MPI forbids the overlap, so wait for it).
    ag_.clear();
    for (int gs = 0; gs < n - 1; ++gs) {
      const Range rr = ring_step(r, n, count, n - 1 + gs).recv;
      for (size_t k = 0, nk = segment_count(rr, seg); k < nk; ++k) ag_.push_back(segment_at(rr, seg, k));
    }
    const size_t na = ag_.size();  // == sends_.size(): the same ranges in the same order
    ag_req_.assign(na, MPI_REQUEST_NULL);
    size_t posted = 0;
    auto post_ag = [&](size_t upto) {
      for (; posted < std::min(upto, na); ++posted) {
        comm_.wait_one(sends_[posted], cfg_.idle_sleep_us, next);
        ag_req_[posted] = comm_.irecv(at(ag_[posted]), ag_[posted].len, t, prev, kGatherTag);
      }
    };
    const size_t last_from = na - segment_count(ring_step(r, n, count, 2 * n - 3).recv, seg);
    post_ag(window);
    for (size_t q = 0; q < na; ++q) {
      post_ag(q + 1 + window);
      const Range g = ag_[q];
      comm_.wait_recv(ag_req_[q], g.len, t, prev, cfg_.idle_sleep_us);
      if (q < last_from) gather_sends_.push_back(comm_.isend(at(g), g.len, t, next, kGatherTag));
    }
    comm_.wait_all(gather_sends_, cfg_.idle_sleep_us, next);
  }

 private:
  // recv_depth scratch segments of at least `bytes`, in the scratch space; they only ever grow.
  void size_window(size_t bytes) {
    while (window_.size() < size_t(cfg_.recv_depth)) window_.emplace_back(scratch_space_);
    for (Buffer<char>& w : window_)
      if (w.size() < bytes) w.resize(bytes);
  }

  RingPlace place_;                       // this rank's ring position; its neighbours' ranks
  std::vector<Range> rs_, ag_;            // reduce-scatter / allgather segments in order
  std::vector<Buffer<char>> window_;      // reduce-scatter scratch, kept between calls
  std::vector<MPI_Request> rs_req_, ag_req_, gather_sends_;
};

}  // namespace

std::vector<int> ring_order(const Communicator& comm, const std::string& order) {
  std::vector<int> ranks(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) ranks[static_cast<size_t>(r)] = r;
  if (order == "rank") return ranks;
  if (order != "node")
    throw CommError(str_cat("comm: unknown ring_order '", order, "' (node or rank)"));
  std::stable_sort(ranks.begin(), ranks.end(),
                   [&](int a, int b) { return comm.node_of(a) < comm.node_of(b); });
  return ranks;
}

RingAllreducer::RingAllreducer(Communicator& comm, const ReduceKernels& k, const CommConfig& cfg,
                               const MemorySpace* scratch, std::vector<int> order)
    : Allreducer(comm, k, cfg, scratch) {
  const int n = comm.size();
  if (order.empty()) order = ring_order(comm, cfg.ring_order);
  std::vector<int> seen(static_cast<size_t>(n), 0);
  for (int r : order)
    if (r < 0 || r >= n || seen[static_cast<size_t>(r)]++)
      throw CommError("RingAllreducer: the ring order is not a permutation of the ranks");
  if (order.size() != static_cast<size_t>(n))
    throw CommError("RingAllreducer: the ring order is not a permutation of the ranks");
  const RingPlace p = ring_place(order, comm.rank());
  pos_ = p.pos, next_ = p.next, prev_ = p.prev;
}

Range RingAllreducer::reduce_scatter(char* base, size_t count, DType t) {
  const int n = comm_.size(), r = pos_;
  const Range owned = ring_chunk(count, n, ring_owned_chunk(r, n));
  if (n == 1 || count == 0) return owned;
  const size_t seg = segment_for(t);
  const int next = next_, prev = prev_;
  // Receives are posted before sends so that a neighbour's message finds its receive waiting.
  // The next step may overwrite what this one sent (N = 2: the allgather receives into the chunk
  // sent here), so each step's sends complete before the next.
  for (int s = 0; s < n - 1; ++s) {
    const RingStep st = ring_step(r, n, count, s);
    recv_reduce_post(st.recv, seg, t, prev, kReduceTag);
    send_segments(base, st.send, seg, t, next, kReduceTag, sends_);
    recv_reduce_finish(base, st.recv, seg, t, prev, kReduceTag);
    comm_.wait_all(sends_, cfg_.idle_sleep_us, next);
  }
  return owned;
}

void RingAllreducer::allgather(char* base, size_t count, DType t) {
  const int n = comm_.size(), r = pos_;
  if (n == 1 || count == 0) return;
  const size_t seg = segment_for(t);
  const int next = next_, prev = prev_;
  // Every step receives a different chunk straight into the buffer, and nothing sent in this
  // phase is overwritten later, so all receives are posted up front (MPI matches them in order)
  // and the sends complete at the end. Step g forwards what step g-1 received.
  posted_.resize(n - 1);
  for (int g = 0; g < n - 1; ++g)
    posted_[g] = post_recv_segments(base, ring_step(r, n, count, n - 1 + g).recv, seg, t, prev,
                                    kReduceTag);
  for (int g = 0; g < n - 1; ++g) {
    send_segments(base, ring_step(r, n, count, n - 1 + g).send, seg, t, next, kReduceTag, sends_);
    wait_recvs(posted_[g], t);
  }
  comm_.wait_all(sends_, cfg_.idle_sleep_us, next);
}

void RingAllreducer::run(void* buf, size_t count, DType t, ReduceOp op) {
  const int n = comm_.size();
  if (n == 1 || count == 0) return;  // the average over one rank is the buffer itself
  char* base = static_cast<char*>(buf);
  const Range owned = reduce_scatter(base, count, t);
  if (op == ReduceOp::average)  // once, by the owner, so every rank copies the same bits
    kernels_.scale(t, base + owned.offset * dtype_size(t), owned.len, 1.0f / static_cast<float>(n));
  allgather(base, count, t);
}

std::unique_ptr<Allreducer> make_ring_allreducer(Communicator& comm, const ReduceKernels& k,
                                                 const CommConfig& cfg, const MemorySpace* scratch) {
  if (cfg.algorithm == "ring_pipelined")
    return std::make_unique<PipelinedRingAllreducer>(comm, k, cfg, scratch);
  return std::make_unique<RingAllreducer>(comm, k, cfg, scratch);
}

}  // namespace rt::comm

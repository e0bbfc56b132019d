// The ring allreduce schedule as pure arithmetic: (rank, size, count) -> per step, the element
// range to send to the next rank and the one to receive from the previous rank (no MPI here).
//
// The buffer of `count` elements is cut into `size` chunks of nearly equal length (the first
// count % size chunks get one extra element; with count < size some chunks are empty). Steps
// 0 .. size-2 are the reduce-scatter (the received range is added into the buffer), steps
// size-1 .. 2·size-3 the allgather (the received range overwrites the buffer). See ring.cc for the
// algorithm and its cost. Every range is further cut into segments of at most `seg` elements,
// identically on sender and receiver, so that message i of a step matches receive i.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace rt::comm {

// A half-open element range [offset, offset + len).
struct Range {
  size_t offset = 0;
  size_t len = 0;
  bool operator==(const Range&) const = default;
};

// One step of one rank: send `send` (chunk send_chunk) to rank+1, receive `recv` (chunk
// recv_chunk) from rank-1, and add it in (reduce) or copy it over (allgather).
struct RingStep {
  int send_chunk = 0;
  int recv_chunk = 0;
  Range send;
  Range recv;
  bool reduce = true;
};

constexpr int ring_mod(int64_t a, int n) { return static_cast<int>(((a % n) + n) % n); }

// Chunk i of a count-element buffer split among `size` ranks.
constexpr Range ring_chunk(size_t count, int size, int i) {
  const size_t base = count / static_cast<size_t>(size);
  const size_t rem = count % static_cast<size_t>(size);
  const size_t ui = static_cast<size_t>(i);
  return {ui * base + std::min(ui, rem), base + (ui < rem ? 1 : 0)};
}

// Number of steps of a ring allreduce: size-1 reduce-scatter plus size-1 allgather.
constexpr int ring_num_steps(int size) { return size > 1 ? 2 * (size - 1) : 0; }

// The chunk that `rank` holds fully reduced after the reduce-scatter (and distributes after).
constexpr int ring_owned_chunk(int rank, int size) { return ring_mod(rank + 1, size); }

constexpr RingStep ring_step(int rank, int size, size_t count, int step) {
  RingStep s;
  if (step < size - 1) {  // reduce-scatter: pass on what was reduced in the previous step
    s.send_chunk = ring_mod(rank - step, size);
    s.recv_chunk = ring_mod(rank - step - 1, size);
    s.reduce = true;
  } else {                // allgather: pass on the reduced chunk received in the previous step
    const int g = step - (size - 1);
    s.send_chunk = ring_mod(rank + 1 - g, size);
    s.recv_chunk = ring_mod(rank - g, size);
    s.reduce = false;
  }
  s.send = ring_chunk(count, size, s.send_chunk);
  s.recv = ring_chunk(count, size, s.recv_chunk);
  return s;
}

// Segments of a range: at most seg elements each (seg >= 1), the last one possibly shorter.
constexpr size_t segment_count(Range r, size_t seg) { return (r.len + seg - 1) / seg; }
constexpr Range segment_at(Range r, size_t seg, size_t k) {
  const size_t off = k * seg;
  return {r.offset + off, std::min(seg, r.len - off)};
}

// Segment length in elements from a byte size and MPI's per-call element limit (at least 1).
constexpr size_t segment_elems(size_t segment_bytes, size_t elem_size, size_t max_elems_per_call) {
  const size_t by_bytes = std::max<size_t>(1, segment_bytes / elem_size);
  return std::max<size_t>(1, std::min(by_bytes, max_elems_per_call));
}

}  // namespace rt::comm

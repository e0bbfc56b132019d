// Allreduce under mpirun: every algorithm, counts 0 .. primes .. large, sum and average, tiny
// segments and a tiny MPI per-call limit (the int-count splitting), spinning and sleeping waits,
// exact sums, bitwise-identical ranks, bf16, broadcast, the per-call count check, the hierarchical
// allreduce over every even grouping of the ranks into nodes, the ring in other orders than the
// ranks', and clear errors for unusable algorithms.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "comm/allreduce.h"
#include "comm/communicator.h"
#include "comm/mpi_check.h"
#include "comm/ring.h"
#include "tests/mpi/mpi_test_util.h"

namespace rt::comm {
namespace {

using test::MpiTest;

std::vector<size_t> test_counts(int n) {
  return {0, 1, 2, size_t(n > 1 ? n - 1 : 1), size_t(n), size_t(n + 1), 7, 13, 97, 1009, 10007,
          65537, (1u << 20) + 3};
}

void check_exact(MpiTest& t, Allreducer& ar, size_t count, ReduceOp op, const std::string& what) {
  std::vector<float> buf(count);
  for (size_t i = 0; i < count; ++i) buf[i] = test::init_value(t.rank(), i);
  ar.allreduce(buf, op);
  const float inv = 1.0f / static_cast<float>(t.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < count; ++i) {
    float want = test::expected_sum(t.size(), i);
    if (op == ReduceOp::average && t.size() > 1) want *= inv;
    if (buf[i] != want && bad++ == 0) first = i;
  }
  MPI_EXPECT(t, bad == 0, what, ": ", bad, " wrong elements, first at ", first, " = ",
             count ? buf[first] : 0.0f);
  const bool same = test::same_on_all_ranks(test::hash_bytes(buf.data(), count * 4));
  MPI_EXPECT(t, same, what, ": ranks differ");
}

// Random non-integer data: the sum depends on the order of additions, yet the ranks must agree
// bitwise (by construction for ring and reducer).
void check_identical(MpiTest& t, Allreducer& ar, size_t count, const std::string& what) {
  std::mt19937 gen(1234 + t.rank());
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> buf(count);
  for (float& v : buf) v = dist(gen);
  for (int rep = 0; rep < 2; ++rep) {  // a second call reuses the scratch buffers
    ar.allreduce(buf, ReduceOp::average);
    MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(buf.data(), count * 4)), what,
               ": ranks not bitwise identical (call ", rep, ")");
  }
}

void check_bf16(MpiTest& t, Allreducer& ar, size_t count, const std::string& what) {
  std::vector<bf16_t> buf(count);  // small integers: exact in bf16 for up to 8 ranks
  for (size_t i = 0; i < count; ++i) buf[i] = to_bf16(float((t.rank() + 1) * (1 + i % 7)));
  ar.allreduce(buf.data(), count, DType::bf16, ReduceOp::sum);
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i)
    bad += from_bf16(buf[i]) != float(t.size() * (t.size() + 1) / 2 * (1 + i % 7));
  MPI_EXPECT(t, bad == 0, what, ": bf16 ", bad, " wrong");
  MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(buf.data(), count * 2)), what, ": bf16 differ");
}

void check_broadcast(MpiTest& t, Communicator& comm) {
  const size_t count = 12345;
  std::vector<float> buf(count, -1.0f);
  if (t.rank() == 0)
    for (size_t i = 0; i < count; ++i) buf[i] = float(i);
  comm.broadcast(buf.data(), count, DType::f32, 0);
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) bad += buf[i] != float(i);
  MPI_EXPECT(t, bad == 0, "broadcast: ", bad, " wrong");
}

// check_counts: one rank passes a different count; every rank must throw naming that rank.
void check_count_mismatch(MpiTest& t, Communicator& comm) {
  if (t.size() < 2) return;
  CommConfig cfg;
  cfg.check_counts = true;
  auto ar = make_allreducer(cfg, comm);
  const int odd = t.size() - 1;
  std::vector<float> buf(t.rank() == odd ? 99 : 100, 1.0f);
  try {
    ar->allreduce(buf, ReduceOp::sum);
    t.fail("count mismatch not detected");
  } catch (const CommError& e) {
    const std::string msg = e.what();
    MPI_EXPECT(t, msg.find(str_cat("rank ", odd, " count 99")) != std::string::npos, msg);
  }
}

// The hierarchical allreduce with nodes of one rank (its cross-node ring is the whole ring) and
// with one node (its node's ring is) gives bitwise the flat ring's result; a grouping that does
// not divide the ranks is refused on every rank, naming the setting.
void check_hierarchical_is_the_ring(MpiTest& t, Communicator& comm) {
  const int n = t.size();
  for (int k : {1, n}) {
    CommConfig cfg;
    cfg.algorithm = "hierarchical";
    cfg.ranks_per_node = k;
    cfg.segment_bytes = 4096;
    CommConfig flat = cfg;
    flat.algorithm = "ring";
    auto ar = make_allreducer(cfg, comm), ring = make_allreducer(flat, comm);
    std::mt19937 gen(99 + t.rank());
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> a(30011);
    for (float& v : a) v = dist(gen);
    std::vector<float> b = a;
    ar->allreduce(a, ReduceOp::average);
    ring->allreduce(b, ReduceOp::average);
    MPI_EXPECT(t, std::memcmp(a.data(), b.data(), a.size() * 4) == 0, "hierarchical, ", k,
               " ranks per node: not bitwise the flat ring's result");
  }
  if (n > 1 && n % 2 == 1) {
    CommConfig cfg;
    cfg.algorithm = "hierarchical";
    cfg.ranks_per_node = 2;
    try {
      make_allreducer(cfg, comm);
      t.fail("ranks_per_node 2 accepted with an odd number of ranks");
    } catch (const CommError& e) {
      MPI_EXPECT(t, std::string(e.what()).find("comm.ranks_per_node 2 does not divide") != std::string::npos,
                 e.what());
    }
  }
}

// The ring in another order than the ranks' (as ring_order "node" gives with ranks placed
// round-robin over nodes): reversed and shuffled orders sum exactly, leave the ranks identical,
// and the reduce-scatter leaves each rank the chunk of its position. On one machine the node
// order is the ranks' own; a malformed order or name is refused.
void check_ring_order(MpiTest& t) {
  const int n = t.size();
  Communicator comm;
  MPI_EXPECT(t, ring_order(comm, "node") == ring_order(comm, "rank"), "one node: node order differs");
  std::vector<int> reversed(static_cast<size_t>(n)), shuffled;
  for (int p = 0; p < n; ++p) reversed[static_cast<size_t>(p)] = n - 1 - p;
  shuffled = reversed;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));  // the same on every rank
  for (const auto& order : {reversed, shuffled}) {
    CommConfig cfg;
    cfg.segment_bytes = 4096;
    RingAllreducer ar(comm, cpu_reduce_kernels(), cfg, nullptr, order);
    const int pos = static_cast<int>(std::find(order.begin(), order.end(), t.rank()) - order.begin());
    MPI_EXPECT(t, ar.position() == pos, "ring position ", ar.position(), " not ", pos);
    const std::string what = str_cat("ring order ", order == reversed ? "reversed" : "shuffled");
    for (size_t count : test_counts(n))
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::average})
        check_exact(t, ar, count, op, str_cat(what, " count ", count));
    check_identical(t, ar, 100003, what);
    // After the reduce-scatter alone, this rank's chunk is complete: the position's chunk.
    const size_t count = 1009;
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = test::init_value(t.rank(), i);
    const Range own = ar.reduce_scatter(reinterpret_cast<char*>(buf.data()), count, DType::f32);
    MPI_EXPECT(t, own == ring_chunk(count, n, ring_owned_chunk(pos, n)), what, ": owned chunk");
    size_t bad = 0;
    for (size_t i = own.offset; i < own.offset + own.len; ++i) bad += buf[i] != test::expected_sum(n, i);
    MPI_EXPECT(t, bad == 0, what, ": reduce-scatter left ", bad, " wrong in the owned chunk");
  }
  for (const std::vector<int>& bad : {std::vector<int>(static_cast<size_t>(n), 0), std::vector<int>{n}}) {
    if (n == 1 && bad.size() == 1 && bad[0] == 0) continue;  // {0} is the one-rank ring itself
    try {
      RingAllreducer ar(comm, cpu_reduce_kernels(), CommConfig{}, nullptr, bad);
      t.fail("a ring order that is not a permutation was accepted");
    } catch (const CommError& e) {
      MPI_EXPECT(t, std::string(e.what()).find("not a permutation") != std::string::npos, e.what());
    }
  }
  try {
    ring_order(comm, "zigzag");
    t.fail("ring_order zigzag accepted");
  } catch (const CommError& e) {
    MPI_EXPECT(t, std::string(e.what()).find("unknown ring_order 'zigzag'") != std::string::npos, e.what());
  }
}

void check_bad_algorithms(MpiTest& t, Communicator& comm) {
  for (const char* name : {"nccl", "tree"}) {
    CommConfig cfg;
    cfg.algorithm = name;
    try {
      make_allreducer(cfg, comm);
      t.fail(str_cat("algorithm ", name, " accepted"));
    } catch (const CommError& e) {
      const std::string msg = e.what();
      MPI_EXPECT(t, msg.find(name == std::string("nccl") ? "GPU only" : "unknown") != std::string::npos,
                 msg);
    }
  }
}

int run() {
  MpiTest t;
  // Every algorithm; the hierarchical one over every even grouping of the ranks into nodes of k
  // (comm.ranks_per_node; 0: the shared-memory nodes, one here).
  struct Algo {
    std::string name;
    int per_node = 0;
  };
  std::vector<Algo> algos = {{"ring"}, {"ring_pipelined"}, {"reducer"}, {"mpi"}};
  for (int k : std::set<int>{0, 1, 2, 3, 4, t.size()})
    if (k <= t.size() && (k == 0 || t.size() % k == 0)) algos.push_back({"hierarchical", k});
  // Per-call limit: MPI's int limit, and a tiny one that forces many splits of every transfer.
  for (size_t limit : {kMpiMaxCount, size_t(1000)}) {
    Communicator comm(MPI_COMM_WORLD, limit);
    for (size_t seg_bytes : {size_t(1) << 20, size_t(64)}) {
      // Segments are cut to the limit: 64-byte ones never reach 1000 elements, and the two
      // limits would run the same messages.
      if (seg_bytes < limit * sizeof(float) && limit != kMpiMaxCount) continue;
      for (const Algo& a : algos) {
        const std::string algo = a.name == "hierarchical" ? str_cat(a.name, "/", a.per_node) : a.name;
        CommConfig cfg;
        cfg.algorithm = a.name;
        cfg.ranks_per_node = a.per_node;
        cfg.segment_bytes = seg_bytes;
        cfg.idle_sleep_us = seg_bytes == 64 ? 10 : 0;  // polling waits that sleep, and MPI_Wait
        cfg.recv_depth = seg_bytes == 64 ? 7 : 2;       // a deep receive pipeline, and double buffering
        auto ar = make_allreducer(cfg, comm);
        for (size_t count : test_counts(t.size())) {
          if (seg_bytes == 64 && count > 70000) continue;  // thousands of tiny messages: slow, no news
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::average})
            check_exact(t, *ar, count, op,
                        str_cat(algo, " count ", count, op == ReduceOp::sum ? " sum" : " avg",
                                " seg ", seg_bytes, " depth ", cfg.recv_depth, " limit ", limit));
        }
        if (algo != "mpi") {
          check_identical(t, *ar, 100003, str_cat(algo, " random seg ", seg_bytes));
          check_bf16(t, *ar, 4099, str_cat(algo, " seg ", seg_bytes));
        }
      }
    }
    check_broadcast(t, comm);
  }
  check_ring_order(t);
  Communicator comm;
  check_hierarchical_is_the_ring(t, comm);
  check_count_mismatch(t, comm);
  check_bad_algorithms(t, comm);
  return t.finish("test_mpi_allreduce");
}

}  // namespace
}  // namespace rt::comm

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rc = rt::comm::comm_run_or_abort([] { return rt::comm::run(); });
  MPI_Finalize();
  return rc;
}

// model.bn_group's sums under mpirun: for every grouping of the ranks, each rank ends with exactly
// its group's sum, every rank of a group with the same bits (integer values: exact; random ones:
// the same bits however they round), groups independent of one another; a count that differs
// within a group, and a group setting that differs between ranks, are errors.
#include <mpi.h>

#include <cstring>
#include <random>
#include <vector>

#include "comm/bn_sync.h"
#include "comm/mpi_check.h"
#include "tests/mpi/mpi_test_util.h"

namespace rt::comm {
namespace {

using test::MpiTest;

// The hashes of every rank's buffer, gathered on every rank.
std::vector<uint64_t> all_hashes(const std::vector<double>& v) {
  uint64_t h = test::hash_bytes(v.data(), v.size() * sizeof(double));
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<uint64_t> all(size_t(n), 0);
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}

void check_group(MpiTest& t, int group) {
  const int k = group == 0 ? t.size() : group;
  const int first = t.rank() / k * k;
  BnGroupSync sync(MPI_COMM_WORLD, group, CommConfig{});
  MPI_EXPECT(t, sync.ranks() == k, "group ", group, ": ", sync.ranks(), " ranks, expected ", k);
  for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(7), size_t(6145), size_t(100003)}) {
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = double(t.rank()) * 1000.0 + double(i % 97) + 0.5;
    sync.sum(v.data(), n);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int r = first; r < first + k; ++r) want += double(r) * 1000.0 + double(i % 97) + 0.5;
      bad += v[i] != want;
    }
    MPI_EXPECT(t, bad == 0, "group ", group, ", count ", n, ": ", bad, " wrong sums");
    // Values whose sums round: still the same bits on every rank of the group.
    std::mt19937_64 g(uint64_t(t.rank()) * 7919 + n);
    std::uniform_real_distribution<double> u(-1, 1);
    for (double& x : v) x = u(g) * std::pow(10.0, double(g() % 12));
    sync.sum(v.data(), n);
    const auto h = all_hashes(v);
    for (int r = first; r < first + k; ++r)
      MPI_EXPECT(t, h[size_t(r)] == h[size_t(t.rank())], "group ", group, ", count ", n, ": rank ", r,
                 " of this rank's group holds other bits");
  }
}

// Within a group of two (both sides exchange, so both see it): a count that differs is an error
// naming the peer, never a silent sum.
void check_count_mismatch(MpiTest& t) {
  if (t.size() % 2 != 0) return;
  BnGroupSync sync(MPI_COMM_WORLD, 2, CommConfig{});
  std::vector<double> v(9, 1.0);
  std::string what;
  try {
    sync.sum(v.data(), t.rank() % 2 == 0 ? 8 : 9);
  } catch (const CommError& e) {
    what = e.what();
  }
  MPI_EXPECT(t, what.find("disagree on the buffer size") != std::string::npos ||
                    what.find("failed") != std::string::npos,
             "a count differing within the group gave: '", what, "'");
}

void check_group_disagreement(MpiTest& t) {
  if (t.size() < 2) return;
  std::string what;
  try {
    BnGroupSync sync(MPI_COMM_WORLD, t.rank() == t.size() - 1 ? 0 : 1, CommConfig{});
  } catch (const CommError& e) {
    what = e.what();
  }
  MPI_EXPECT(t, what.find("model.bn_group differs between ranks") != std::string::npos &&
                    what.find(str_cat("rank ", t.size() - 1, ": 0")) != std::string::npos,
             "ranks with different groups gave: '", what, "'");
  what.clear();
  try {
    BnGroupSync sync(MPI_COMM_WORLD, t.size() + 1, CommConfig{});
  } catch (const CommError& e) {
    what = e.what();
  }
  MPI_EXPECT(t, what.find("does not divide") != std::string::npos, "an oversized group gave: '", what, "'");
}

int run() {
  MpiTest t;
  for (int group = 0; group <= t.size(); ++group)
    if (group == 0 || t.size() % group == 0) check_group(t, group);
  check_count_mismatch(t);
  check_group_disagreement(t);
  return t.finish("test_mpi_bn_sync");
}

}  // namespace
}  // namespace rt::comm

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rc = rt::comm::comm_run_or_abort([] { return rt::comm::run(); });
  MPI_Finalize();
  return rc;
}

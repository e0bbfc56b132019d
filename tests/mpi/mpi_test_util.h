// Checks for programs run under mpirun: failures are printed with the rank, counted, and combined
// over all ranks at the end so that the exit status is non-zero on every rank if any rank failed.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "nn/error.h"

namespace rt::test {

class MpiTest {
 public:
  MpiTest() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  long failures() const { return failures_; }

  void fail(const std::string& what) {
    if (++failures_ <= 20) std::fprintf(stderr, "FAIL rank %d of %d: %s\n", rank_, size_, what.c_str());
  }
  // Combines every rank's failures; rank 0 prints the verdict. Returns the exit status.
  int finish(const char* name) {
    long total = 0;
    MPI_Allreduce(&failures_, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank_ == 0)
      std::printf("%s: %s with %d ranks (%ld failures)\n", name, total ? "FAILED" : "passed", size_,
                  total);
    return total ? 1 : 0;
  }

 private:
  int rank_ = 0, size_ = 1;
  long failures_ = 0;
};

// FNV-1a over raw bytes: equal hashes on all ranks <=> (almost surely) bitwise identical buffers.
inline uint64_t hash_bytes(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// True on every rank iff all ranks passed the same value.
inline bool same_on_all_ranks(uint64_t v) {
  uint64_t lo = v, hi = v;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

// nccl-tests' InitData idea: integer values that depend on rank and position, so the sum over
// any number of ranks is exact in fp32 and a misplaced chunk shows up.
inline float init_value(int rank, size_t i) {
  return static_cast<float>(rank + 1) * static_cast<float>(1 + i % 1021);
}
inline float expected_sum(int size, size_t i) {
  return static_cast<float>(size * (size + 1) / 2) * static_cast<float>(1 + i % 1021);
}

}  // namespace rt::test

#define MPI_EXPECT(t, cond, ...) \
  do {                           \
    if (!(cond)) (t).fail(::rt::str_cat(__FILE__, ":", __LINE__, ": ", #cond, ": ", __VA_ARGS__)); \
  } while (0)

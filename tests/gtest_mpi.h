// For GoogleTest programs that need MPI (a Communicator) but run without mpirun: MPI_Init as a
// singleton (one rank) before the first test, MPI_Finalize after the last.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

namespace rt::test {

class MpiSingleton : public ::testing::Environment {
 public:
  void SetUp() override { MPI_Init(nullptr, nullptr); }
  void TearDown() override { MPI_Finalize(); }
};

// Registered once per program however many sources include this header.
inline ::testing::Environment* const kMpiSingleton =
    ::testing::AddGlobalTestEnvironment(new MpiSingleton);

}  // namespace rt::test

// Placements across machines, emulated on one: this program's MPI_Comm_split_type (MPI's
// profiling interface lets a program define an MPI function itself and reach the library's as
// PMPI_) groups the ranks into the "hosts" RT_TEST_HOSTS lists (one host id per rank, e.g.
// "0,1,0,1,0,0"). Under them, every algorithm gives the exact sum (both rings in host order, not
// rank order), and `hierarchical` with
// comm.ranks_per_node (blocks of consecutive ranks that span hosts, which its ring puts in host
// order) pairs across blocks the ranks that own the same chunk.
// Usage: RT_TEST_HOSTS=0,1,0,1,0,0 mpirun -np 6 test_mpi_hierarchical_hosts
#include <mpi.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "comm/allreduce.h"
#include "comm/communicator.h"
#include "comm/mpi_check.h"
#include "tests/mpi/mpi_test_util.h"

namespace {
std::vector<int> hosts() {
  std::vector<int> h;
  std::stringstream s(std::getenv("RT_TEST_HOSTS") ? std::getenv("RT_TEST_HOSTS") : "");
  for (std::string x; std::getline(s, x, ',');) h.push_back(std::atoi(x.c_str()));
  return h;
}
}  // namespace

// The shared-memory split by the listed host of each rank of `comm` (its world rank's entry).
extern "C" int MPI_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info, MPI_Comm* out) {
  const std::vector<int> h = hosts();
  int world = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &world);
  if (type != MPI_COMM_TYPE_SHARED || size_t(world) >= h.size())
    return PMPI_Comm_split_type(comm, type, key, info, out);
  return PMPI_Comm_split(comm, h[size_t(world)], key, out);
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int failures = 0;
  {
    using namespace rt;
    test::MpiTest t;
    comm::Communicator comm;
    MPI_EXPECT(t, hosts().size() == size_t(t.size()), "RT_TEST_HOSTS lists ", hosts().size(), " hosts for ",
               t.size(), " ranks");
    for (const int per : {0, 3, 2}) {
      if (per > 0 && t.size() % per != 0) continue;
      for (const std::string algo : {"ring", "ring_pipelined", "hierarchical", "reducer"}) {
        comm::CommConfig cfg;
        cfg.algorithm = algo;
        cfg.ranks_per_node = per;
        cfg.segment_bytes = 64;
        cfg.recv_depth = 2 + per;  // 2, 5, 4 receives in flight
        std::unique_ptr<comm::Allreducer> ar;
        try {
          ar = comm::make_allreducer(cfg, comm);
        } catch (const rt::CommError& e) {  // hierarchical on uneven hosts without blocks: said
          MPI_EXPECT(t, algo == "hierarchical" && per == 0, algo, " ranks_per_node ", per, ": ", e.what());
          continue;
        }
        for (const size_t count : {size_t(1), size_t(7), size_t(12), size_t(1000)}) {
          std::vector<float> v(count);
          for (size_t i = 0; i < count; ++i) v[i] = test::init_value(t.rank(), i);
          ar->allreduce(v.data(), count, DType::f32, comm::ReduceOp::sum);
          size_t bad = 0;
          for (size_t i = 0; i < count; ++i) bad += v[i] != test::expected_sum(t.size(), i);
          MPI_EXPECT(t, bad == 0, algo, " ranks_per_node ", per, " count ", count, ": ", bad, " wrong sums");
        }
      }
    }
    failures = t.finish("test_mpi_hierarchical_hosts");
  }
  MPI_Finalize();
  return failures;
}

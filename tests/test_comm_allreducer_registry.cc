// make_allreducer's registry: "nccl" without its registration says why it is missing, a
// registered factory is what make_allreducer then builds, and built-in names cannot be taken;
// the hierarchical allreduce's placement rule.
// One rank, no messages (MPI only because make_allreducer takes a Communicator).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "comm/allreduce.h"
#include "comm/hierarchical.h"
#include "comm/mpi_check.h"
#include "tests/gtest_mpi.h"

namespace rt::comm {
namespace {

// Stands in for cuda/'s NCCL allreducer: counts its calls, touches nothing.
class FakeAllreducer final : public Allreducer {
 public:
  FakeAllreducer(Communicator& comm, const ReduceKernels& k, const CommConfig& cfg)
      : Allreducer(comm, k, cfg), algorithm(cfg.algorithm) {}
  const char* name() const override { return "fake"; }
  std::string algorithm;  // what the factory was asked for
  int calls = 0;

 protected:
  void run(void*, size_t, DType, ReduceOp) override { ++calls; }
};

std::unique_ptr<Allreducer> make_fake(const CommConfig& cfg, Communicator& comm,
                                      const ReduceKernels& k) {
  return std::make_unique<FakeAllreducer>(comm, k, cfg);
}

std::string error_of(const CommConfig& cfg, Communicator& comm) {
  try {
    make_allreducer(cfg, comm);
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}
std::string error_of(const std::string& algorithm, Communicator& comm) {
  CommConfig cfg;
  cfg.algorithm = algorithm;
  return error_of(cfg, comm);
}

TEST(AllreducerRegistry, NcclUnregisteredSaysWhyThenRegisteredIsBuilt) {
  Communicator comm(MPI_COMM_SELF);
  const std::string m = error_of("nccl", comm);
  EXPECT_NE(m.find("'nccl' is GPU only and not"), std::string::npos) << m;
  // Not built (no CUDA/NCCL) or built but not linked into this program: either way it names
  // what would provide it.
  EXPECT_TRUE(m.find("trainer_cuda") != std::string::npos || m.find("without") != std::string::npos)
      << m;

  register_allreducer("nccl", &make_fake);
  register_allreducer("nccl", &make_fake);  // harmless twice
  CommConfig cfg;
  cfg.algorithm = "nccl";
  auto ar = make_allreducer(cfg, comm);
  auto* fake = dynamic_cast<FakeAllreducer*>(ar.get());
  ASSERT_NE(fake, nullptr) << ar->name();
  EXPECT_EQ(fake->algorithm, "nccl");
  std::vector<float> v(3, 1.0f);
  ar->allreduce(v, ReduceOp::sum);
  EXPECT_EQ(fake->calls, 1);

  // The built-ins are unaffected, and the list of names is the same as before.
  cfg.algorithm = "ring";
  EXPECT_EQ(std::string(make_allreducer(cfg, comm)->name()).find("ring"), 0u);
  const auto& names = allreduce_algorithms();
  EXPECT_EQ(names, (std::vector<std::string>{"ring", "hierarchical", "mpi", "reducer", "nccl"}));
}

TEST(AllreducerRegistry, BuiltinNamesAndNullFactoriesAreRefused) {
  for (const char* name : {"ring", "ring_pipelined", "hierarchical", "mpi", "reducer"})
    EXPECT_THROW(register_allreducer(name, &make_fake), CommError) << name;
  EXPECT_THROW(register_allreducer("tree", nullptr), CommError);
  Communicator comm(MPI_COMM_SELF);
  EXPECT_NE(error_of("tree", comm).find("unknown allreduce algorithm 'tree'"), std::string::npos);
}

// Nodes are named by their lowest rank; any placement with equal node sizes passes, whatever the
// order of the ranks (round-robin over nodes too).
TEST(HierarchicalPlacement, EqualNodesPassUnequalAreNamed) {
  EXPECT_EQ(hierarchical_placement_error({0}), "");
  EXPECT_EQ(hierarchical_placement_error({0, 0, 2, 2}), "");
  EXPECT_EQ(hierarchical_placement_error({0, 1, 2, 0, 1, 2}), "");  // --map-by node
  EXPECT_EQ(hierarchical_placement_error({0, 1, 2, 3}), "");        // one rank per node
  const std::string e = hierarchical_placement_error({0, 0, 0, 3, 3, 0, 6});
  EXPECT_NE(e.find("ranks per node: 4 (rank 0's node), 2 (rank 3's node), 1 (rank 6's node)"),
            std::string::npos) << e;
  EXPECT_NE(e.find("comm.ranks_per_node"), std::string::npos) << e;
  // Unequal whichever node is the smallest: the first (rank 0's) one too, or a middle one.
  EXPECT_NE(hierarchical_placement_error({0, 1, 1}), "");
  EXPECT_NE(hierarchical_placement_error({0, 1, 1, 3, 3, 3}), "");
  EXPECT_NE(hierarchical_placement_error({0, 0, 2, 3, 3}), "");
}

// One rank: the hierarchy is one node of one rank, and the buffer is left as it is.
TEST(HierarchicalPlacement, OneRankIsTheIdentity) {
  Communicator comm(MPI_COMM_SELF);
  CommConfig cfg;
  cfg.algorithm = "hierarchical";
  auto ar = make_allreducer(cfg, comm);
  EXPECT_STREQ(ar->name(), "hierarchical");
  std::vector<float> v = {1.5f, -2.0f, 3.25f};
  ar->allreduce(v, ReduceOp::average);
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  cfg.ranks_per_node = -1;
  EXPECT_NE(error_of(cfg, comm).find("ranks_per_node must be >= 0"), std::string::npos);
}

}  // namespace
}  // namespace rt::comm

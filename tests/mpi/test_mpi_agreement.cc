// Agreement and faults under mpirun. Without arguments: ranks that built another model or chose
// other settings make every rank throw a message naming them. With a mode, the program must end
// the whole job with a non-zero status (tests/mpi/expect_failure.sh checks status and message):
//   abort-settings  the last rank has another bucket size; the error is not caught -> MPI_Abort
//   throw           the last rank throws mid-training while the others wait in an allreduce
//   kill            the last rank is killed (SIGKILL) while the others wait in an allreduce
//   single-thread   MPI initialised without thread support, yet overlap requested
//   count-mismatch  the last rank passes one element more to a plain allreduce (no count check):
//                   a receive of the wrong size is an error, not a wrong sum
#include <mpi.h>

#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "comm/agreement.h"
#include "comm/mpi_check.h"
#include "comm/gradient_reducer.h"
#include "nn/resnet.h"
#include "tests/mpi/mpi_test_util.h"

namespace rt::comm {
namespace {

using test::MpiTest;

// Expects fn() to throw CommError on every rank with every needle in the message.
template <class F>
void expect_comm_error(MpiTest& t, const std::string& what, const std::vector<std::string>& needles,
                       F&& fn) {
  try {
    fn();
    t.fail(what + ": no error");
  } catch (const CommError& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles)
      MPI_EXPECT(t, msg.find(n) != std::string::npos, what, ": message lacks '", n, "': ", msg);
    if (t.rank() == 0) std::printf("%s -> %s\n", what.c_str(), msg.c_str());
  }
}

std::unique_ptr<Net<float>> small_net(double width) {
  ResNetConfig rc;
  rc.name = "resnet20";
  rc.num_classes = 10;
  rc.image_size = 16;
  rc.batch = 2;
  rc.width = width;
  return build_resnet<float>(rc, make_backend<float>("reference"));
}

int run_checks() {
  MpiTest t;
  Communicator comm;
  const int last = t.size() - 1;
  std::vector<float> g(1000);
  const ModelFingerprint fp = buffer_fingerprint(g.size(), DType::f32);

  { GradientReducer ok(comm, CommConfig{}, g, fp); }  // same everything: no error
  if (t.size() < 2) return t.finish("test_mpi_agreement");

  CommConfig other;
  other.bucket_bytes = 1 << 20;
  expect_comm_error(t, "bucket size", {str_cat("rank ", last, " has comm.bucket_bytes 1048576"), "rank 0: 26214400"},
                    [&] { GradientReducer gr(comm, t.rank() == last ? other : CommConfig{}, g, fp); });
  CommConfig algo;
  algo.algorithm = "reducer";
  expect_comm_error(t, "algorithm", {"rank 1 has comm.algorithm 'reducer'", "rank 0: 'ring'"},
                    [&] { GradientReducer gr(comm, t.rank() == 1 ? algo : CommConfig{}, g, fp); });
  CommConfig no_overlap;
  no_overlap.overlap = false;
  expect_comm_error(t, "overlap", {str_cat("rank ", last, " has comm.overlap false")},
                    [&] { GradientReducer gr(comm, t.rank() == last ? no_overlap : CommConfig{}, g, fp); });
  CommConfig staged;
  staged.device_path = "staged";
  expect_comm_error(t, "device path", {str_cat("rank ", last, " has comm.device_path 'staged'"), "rank 0: 'auto'"},
                    [&] { GradientReducer gr(comm, t.rank() == last ? staged : CommConfig{}, g, fp); });

  // Another gradient buffer length on one rank: caught before a single element is summed.
  std::vector<float> g2(1001);
  expect_comm_error(t, "buffer length", {str_cat("rank ", last, " has gradient buffer length 1001")}, [&] {
    std::vector<float>& mine = t.rank() == last ? g2 : g;
    GradientReducer gr(comm, CommConfig{}, mine, buffer_fingerprint(mine.size(), DType::f32));
  });

  // Another model (different width: other dims, same names) on rank 1.
  auto net = small_net(t.rank() == 1 ? 0.25 : 0.5);
  expect_comm_error(t, "model", {"rank 1 has parameter count", "rank 1 has model layout hash"}, [&] {
    GradientReducer gr(comm, CommConfig{}, net->arena().grads(), model_fingerprint(net->arena()));
  });
  return t.finish("test_mpi_agreement");
}

// Modes that must take the whole job down.
int run_fault(const std::string& mode) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const bool culprit = rank == size - 1;
  Communicator comm;
  std::vector<float> g(100000, 1.0f);
  if (mode == "single-thread") {
    GradientReducer gr(comm, CommConfig{}, g, buffer_fingerprint(g.size(), DType::f32));
    return 0;  // not reached
  }
  if (mode == "abort-settings") {
    CommConfig cfg;
    if (culprit) cfg.bucket_bytes = 4096;
    GradientReducer gr(comm, cfg, g, buffer_fingerprint(g.size(), DType::f32));
    return 0;  // not reached
  }
  auto ar = make_allreducer(CommConfig{}, comm);
  if (mode == "count-mismatch") {
    std::vector<float> h(culprit ? 1001 : 1000, 1.0f);
    ar->allreduce(h, ReduceOp::sum);
    return 0;
  }
  for (int it = 0; it < 1000000; ++it) {
    if (culprit && it == 3) {
      if (mode == "kill") std::raise(SIGKILL);
      throw Error("injected failure in step 3");
    }
    ar->allreduce(g, ReduceOp::sum);
  }
  return 0;
}

}  // namespace
}  // namespace rt::comm

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  int provided = 0;
  MPI_Init_thread(&argc, &argv, mode == "single-thread" ? MPI_THREAD_SINGLE : MPI_THREAD_SERIALIZED,
                  &provided);
  const int rc = rt::comm::comm_run_or_abort(
      [&] { return mode.empty() ? rt::comm::run_checks() : rt::comm::run_fault(mode); });
  MPI_Finalize();
  return rc;
}

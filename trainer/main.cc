// The trainer program: MPI start-up and the abort-all error path around trainer::cli_main.
#include <mpi.h>
#include <sys/prctl.h>

#include <csignal>
#include <cstdlib>

#include "comm/communicator.h"
#include "trainer/cli.h"
#ifdef RT_HAVE_CUDA
#include "cuda/backend.h"
#include "cuda/device_grads.h"
#include "trainer/trainer.h"
#ifdef RT_HAVE_NCCL
#include "cuda/nccl_allreducer.h"
#endif
#endif

namespace {

// A rank whose launcher is gone (mpirun killed, or stopped twice so that it exits without waiting
// for its ranks) otherwise goes on training and writing checkpoints for seconds until the MPI
// runtime notices, behind the back of whatever the user starts next. The kernel ends it instead,
// with SIGKILL: SIGTERM would ask for a clean stop (trainer/stop_signal.h), which needs the job's
// other ranks. Only under a launcher: a rank started on its own may outlive its shell (nohup).
void end_with_the_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(var) != nullptr) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      return;
    }
}

}  // namespace

int main(int argc, char** argv) {
  end_with_the_launcher();
#ifdef RT_HAVE_CUDA
  rt::cuda::select_launcher_device();  // before MPI_Init, which a CUDA-aware MPI binds to it
#endif
  // The gradient reducer's communication thread makes MPI calls during a step while the main
  // thread computes: SERIALIZED at least. MULTIPLE where offered, for model.bn_group, whose
  // batch norms sum over their group on the main thread during backward.
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
    rt::comm::comm_abort("MPI_Init_thread failed");
  if (provided < MPI_THREAD_SERIALIZED)
    rt::comm::comm_abort("the MPI library does not provide MPI_THREAD_SERIALIZED, which the trainer needs");
#ifdef RT_HAVE_CUDA
  rt::cuda::register_backend();  // makes `backend: cuda` available to make_backend
  // ... and keeps its gradients on the device through the reducer (comm.device_path).
  rt::trainer::register_device_grads([](void* stream, rt::comm::DevicePath path) {
    return rt::cuda::make_device_grads(static_cast<cudaStream_t>(stream), path);
  });
#ifdef RT_HAVE_NCCL
  rt::cuda::register_nccl_allreducer();  // and `comm.algorithm: nccl` to make_allreducer
#endif
#endif
  const int rc = rt::comm::comm_run_or_abort([&] { return rt::trainer::cli_main(argc, argv); });
  MPI_Finalize();
  return rc;
}

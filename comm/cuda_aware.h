// Whether this MPI library takes CUDA device pointers, and the gradient path comm.device_path
// chooses from that: reduce on the device buffer (direct) or through a host mirror (staged).
#pragma once
#include <string>
#include <vector>

#include "comm/allreduce.h"
#include "comm/device_grads.h"

namespace rt::comm {

struct CudaAwareness {
  bool aware = false;  // MPI calls may be handed device pointers
  std::string detail;  // what the library said, for messages and logs
};

// Asks the library (after MPI_Init): OpenMPI's mpi-ext.h says at compile time whether it was built
// with CUDA support (MPIX_CUDA_AWARE_SUPPORT) and MPIX_Query_cuda_support() whether that support
// is on in this run; both must say yes. An MPI without the extension counts as not aware, unless
// the environment says otherwise (cuda_aware_override).
CudaAwareness mpi_cuda_awareness();

// The environment variable that overrides the library's answer: 1 for a CUDA-aware MPI that lacks
// OpenMPI's extension (MVAPICH2-GDR, Cray MPICH with GPU support on), 0 to keep one that says yes
// off the direct path.
inline constexpr const char* kCudaAwareEnv = "RINGTRAIN_MPI_CUDA_AWARE";
// `detected` as `value` (the variable's value, null when unset) overrides it; throws rt::CommError
// naming the variable for a value other than 0 or 1.
CudaAwareness cuda_aware_override(CudaAwareness detected, const char* value);

// The values comm.device_path takes: auto, staged, direct.
const std::vector<std::string>& device_path_names();

// cfg.device_path given what MPI can do. "auto": direct if mpi.aware, else staged. "staged".
// "direct": throws rt::CommError naming comm.device_path and what the library said unless
// mpi.aware. Any other value: CommError. With algorithm nccl, which moves device memory itself
// (MPI only starts it), auto and direct give direct whatever MPI is, and staged is an error.
DevicePath resolve_device_path(const CommConfig& cfg, const CudaAwareness& mpi);

// resolve_device_path(cfg, mpi_cuda_awareness()): the path a GPU run takes.
DevicePath comm_device_path(const CommConfig& cfg);

}  // namespace rt::comm

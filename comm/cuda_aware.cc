// CUDA-aware MPI detection through OpenMPI's extension header, and comm.device_path's choice.
#include "comm/cuda_aware.h"

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // OpenMPI's extensions; MPICH and others have no such header
#endif

#include <cstdlib>
#include <string>
#include <utility>

#include "comm/mpi_check.h"

namespace rt::comm {

CudaAwareness mpi_cuda_awareness() {
  CudaAwareness a;
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  // The macro is 0 when the library was built without CUDA; the query then answers 0 as well, and
  // when built with CUDA it can still answer 0 (the CUDA libraries did not load, or it is off).
  const int built = MPIX_CUDA_AWARE_SUPPORT;
  const int on = MPIX_Query_cuda_support();
  a.aware = built && on;
  a.detail = str_cat("mpi-ext.h MPIX_CUDA_AWARE_SUPPORT ", built, ", MPIX_Query_cuda_support() ", on);
#else
  a.detail = "this MPI has no CUDA extension in mpi-ext.h (MPIX_CUDA_AWARE_SUPPORT undefined)";
#endif
  return cuda_aware_override(std::move(a), std::getenv(kCudaAwareEnv));
}

CudaAwareness cuda_aware_override(CudaAwareness detected, const char* value) {
  if (!value) return detected;
  const std::string v = value;
  if (v != "0" && v != "1")
    throw CommError(str_cat(kCudaAwareEnv, ": '", v, "' is neither 1 (MPI takes device pointers) "
                            "nor 0 (it does not)"));
  return {v == "1", str_cat(kCudaAwareEnv, "=", v, " (the library: ", detected.detail, ")")};
}

const std::vector<std::string>& device_path_names() {
  static const std::vector<std::string> names = {"auto", "staged", "direct"};
  return names;
}

DevicePath resolve_device_path(const CommConfig& cfg, const CudaAwareness& mpi) {
  const std::string& path = cfg.device_path;
  if (path != "auto" && path != "staged" && path != "direct")
    throw CommError(str_cat("comm.device_path: unknown value '", path, "' (known: auto, staged, direct)"));
  if (cfg.algorithm == "nccl") {
    if (path == "staged")
      throw CommError("comm.device_path: staged cannot be used with comm.algorithm nccl, which "
                      "reduces device memory itself; use auto or direct");
    return DevicePath::direct;
  }
  if (path == "auto") return mpi.aware ? DevicePath::direct : DevicePath::staged;
  if (path == "staged") return DevicePath::staged;
  if (!mpi.aware)
    throw CommError(str_cat("comm.device_path: direct needs an MPI that takes device pointers, and "
                            "this one is not CUDA-aware (", mpi.detail,
                            "); use staged or auto, or a CUDA-aware MPI"));
  return DevicePath::direct;
}

DevicePath comm_device_path(const CommConfig& cfg) {
  return resolve_device_path(cfg, mpi_cuda_awareness());
}

}  // namespace rt::comm

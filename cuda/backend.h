// The CUDA rt::Backend<float>: NCHW fp32 activations and gradients in device memory, the
// parameter arena too, every op on one CudaContext's stream.
#pragma once
#include <memory>
#include <string>

#include "cuda/context.h"
#include "nn/ops.h"

namespace rt::cuda {

// Throws rt::Error naming the backend, with the runtime's reason, when no device is usable.
std::unique_ptr<Backend<float>> make_cuda_backend(const ContextConfig& cfg = {});

// This process's node-local rank and the node's rank count: o.local_rank / o.local_size where set
// (an MPI program's own answer), else the launcher's variables (OMPI_COMM_WORLD_LOCAL_RANK,
// MPI_LOCALRANKID or SLURM_LOCALID; OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS), else 0 and 1.
int node_local_rank(const BackendOptions& o);
int node_local_size(const BackendOptions& o);
// The device for this process: node_local_rank modulo the visible devices. The registered
// backends use it, with `note`: where the node has more ranks than devices, local rank 0 then
// prints shared_device_note once to stderr.
int local_rank_device(const BackendOptions& o, bool note = true);
// "" when each of a node's local_size ranks has a device of its own; else a one-line note that
// they share them. Sharing works (the tests run two ranks on one GPU) but each rank then gets a
// fraction of a device, which is rarely what a launch meant. `visible` is CUDA_VISIBLE_DEVICES
// (null when unset): where it is set, each rank may see another GPU under the same number (a
// launcher giving each rank its own), which a rank cannot tell, so the note says so.
std::string shared_device_note(int local_size, int devices, const char* visible = nullptr);

// Before MPI_Init: makes local_rank_device (from the launcher's variables) this process's current
// device, where there is one. A CUDA-aware MPI (UCX, say) opens its CUDA context on the device
// current at MPI_Init, so without this every rank of a node holds one on GPU 0. Does nothing
// without a usable device.
void select_launcher_device();

// Makes rt::make_backend<float>("cuda") build make_cuda_backend() with the default
// configuration, "cuda-tf32" with TF32 and measured algorithm choice, and "cuda-bf16" and
// "cuda-fp16" (mixed precision, cuda/lowp_backend.h). Call once in programs that link rt_cuda;
// calling again is harmless.
void register_backend();

}  // namespace rt::cuda

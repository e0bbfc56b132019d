// GradientReducer on gradients in GPU memory under mpirun (all ranks on one GPU), through
// cuda::make_device_grads on the path named by argv[1] (staged or direct): a backward that
// reports pieces while the GPU is still busy producing them, buckets of several sizes, overlap
// on and off, ring, hierarchical and reducer (and NCCL on the direct path, where each rank has a GPU of its
// own: on the CUDA emulator); the averages must be exact (integer-valued data), all ranks bitwise
// identical, and no device or pinned memory allocated after set-up. Exit status 77 (with a line starting
// "SKIP: " on rank 0) when there is no GPU, or for direct when MPI is not CUDA-aware.
// Launched by tests/gpu/gpu_device_grads_mpi.cc.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/agreement.h"
#include "comm/cuda_aware.h"
#include "comm/gradient_reducer.h"
#include "comm/mpi_check.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/device_grads.h"
#include "cuda/kernels.h"
#include "cuda/memory.h"
#include "tests/mpi/mpi_test_util.h"
#ifdef RT_HAVE_NCCL
#include "cuda/nccl_allreducer.h"
#endif

namespace rt {
namespace {

using comm::CommConfig;
using comm::DevicePath;
using test::MpiTest;

constexpr int kSkip = 77;
constexpr size_t kCount = 300007;
constexpr int kSteps = 3;
// Slow work queued before each piece of "backward". The emulator runs queued work only when
// waited for, so there a little is as slow as any.
#ifdef RT_CUDA_EMULATOR
constexpr size_t kBusyBytes = size_t{32} << 10;
#else
constexpr size_t kBusyBytes = size_t{32} << 20;
#endif

int skip(MpiTest& t, const std::string& why) {
  if (t.rank() == 0) std::printf("SKIP: %s\n", why.c_str());
  return kSkip;
}

int run(const std::string& path_name) {
  MpiTest t;
  std::string why;
  const bool gpu = cuda::device_count(&why) > 0;
  if (!test::same_on_all_ranks(gpu)) throw Error("some ranks see a GPU and others do not");
  if (!gpu) return skip(t, "no CUDA device: " + why);
  const comm::CudaAwareness aware = comm::mpi_cuda_awareness();
  if (t.rank() == 0) std::printf("CUDA-aware MPI: %s (%s)\n", aware.aware ? "yes" : "no", aware.detail.c_str());
  if (path_name == "direct" && !aware.aware)
    return skip(t, "the direct path needs a CUDA-aware MPI and this one is not (" + aware.detail + ")");
  CUDA_CHECK(cudaSetDevice(0));

  comm::Communicator comm;
  cudaStream_t compute;
  CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  // Each step's gradients, computed on the host and put on the device before any step, so that
  // "backward" is device-to-device copies on the compute stream.
  std::vector<cuda::DeviceBuffer> inputs;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<float> v(kCount);
    for (size_t i = 0; i < kCount; ++i) v[i] = test::init_value(t.rank(), i + size_t(s));
    inputs.emplace_back(kCount * 4);
    inputs.back().upload(v.data(), kCount * 4);
  }
  cuda::DeviceBuffer grads(kCount * 4), busy(kBusyBytes);
  std::vector<float> got(kCount);
  const float inv = 1.0f / float(t.size());

  struct Case {
    std::string algo;
    size_t bucket_bytes;
    bool overlap;
    std::string compression = "none";
  };
  std::vector<Case> cases;
  for (const char* algo : {"ring", "reducer"})
    for (size_t bucket_bytes : {size_t(65536), size_t(400000), size_t(25) << 20})
      for (bool overlap : {true, false}) cases.push_back({algo, bucket_bytes, overlap});
  // Compressed: the device conversions and 16-bit sums give the host path's bits (the kernels
  // equal the CPU's bit for bit, tests/gpu/gpu_reduce.cc), the wire buffer allocated at set-up.
  cases.push_back({"ring", 400000, true, "bf16"});
  cases.push_back({"reducer", 65536, false, "fp16"});
  // Hierarchical, each rank a node of its own (so its rings are the device kernels' too).
  cases.push_back({"hierarchical", 400000, true});
  cases.push_back({"hierarchical", 65536, false, "bf16"});
#ifdef RT_HAVE_NCCL
  // NCCL, direct only (it reduces device memory itself). It needs a GPU per rank, which one GPU
  // cannot give: there its set-up refuses on every rank and these cases say so and are left out;
  // on the CUDA emulator each rank has a device of its own.
  if (path_name == "direct") {
    cuda::register_nccl_allreducer();
    cases.push_back({"nccl", 65536, true});
    cases.push_back({"nccl", size_t(25) << 20, false});
    cases.push_back({"nccl", 400000, true, "bf16"});
  }
#endif
  comm::Communicator ref_comm;
  for (const Case& c : cases) {
    CommConfig cfg;
    cfg.algorithm = c.algo;
    cfg.ranks_per_node = 1;  // hierarchical: two one-rank nodes; the shared-memory view would be one
    cfg.bucket_bytes = c.bucket_bytes;
    cfg.overlap = c.overlap;
    cfg.device_path = path_name;
    cfg.compression = c.compression;
    const std::string what = str_cat(path_name, " ", c.algo, " bucket ", c.bucket_bytes, " overlap ",
                                     c.overlap, " compression ", c.compression);
    std::vector<float> host(kCount);
    CommConfig ref_cfg = cfg;  // the host path's reference: NCCL takes no host buffers
    if (c.algo == "nccl") ref_cfg.algorithm = "ring";
    comm::GradientReducer ref(ref_comm, ref_cfg, host, comm::buffer_fingerprint(kCount, DType::f32));
    std::unique_ptr<comm::GradientReducer> reducer;
    try {
      reducer = std::make_unique<comm::GradientReducer>(
          comm, cfg, cuda::make_device_grads(compute, comm::comm_device_path(cfg)), grads.get(), kCount,
          DType::f32, comm::buffer_fingerprint(kCount, DType::f32));
    } catch (const CommError& e) {
      if (c.algo != "nccl" || std::string(e.what()).find("would share GPU") == std::string::npos) throw;
      if (t.rank() == 0) std::printf("%s: left out: %s\n", what.c_str(), e.what());
      continue;
    }
    comm::GradientReducer& gr = *reducer;
    const cuda::AllocStats set_up = cuda::alloc_stats();
    for (int step = 0; step < kSteps; ++step) {
      // NaN everywhere first, then the pieces, each behind some slow work: the reports run
      // ahead of the GPU, so only the fences keep the reducer from reading NaN.
      CUDA_CHECK(cudaMemsetAsync(grads.get(), 0xff, kCount * 4, compute));
      gr.begin_step();
      const size_t piece = kCount / 9 + 1;
      for (size_t done = 0; done < kCount;) {
        const size_t end = std::min(kCount, done + piece);
        for (int k = 0; k < 10; ++k) cuda::scale(cuda::Elem::f32, busy.get(), busy.bytes() / 4, 1.0f, compute);
        CUDA_CHECK_LAUNCH();
        CUDA_CHECK(cudaMemcpyAsync(grads.as<float>() + done, inputs[step].as<float>() + done,
                                   (end - done) * 4, cudaMemcpyDeviceToDevice, compute));
        done = end;
        gr.on_ready(done);
      }
      gr.wait();
      CUDA_CHECK(cudaStreamSynchronize(compute));
      grads.download(got.data(), kCount * 4);
      if (c.compression != "none") {  // the host path on the same data
        inputs[step].download(host.data(), kCount * 4);
        ref.wait();
      }
      size_t bad = 0;
      for (size_t i = 0; i < kCount; ++i)
        bad += c.compression == "none"
                   ? got[i] != test::expected_sum(t.size(), i + size_t(step)) * inv
                   : std::memcmp(&got[i], &host[i], 4) != 0;
      MPI_EXPECT(t, bad == 0, what, " step ", step, ": ", bad, " wrong (first: ", got[0], ")");
      MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(got.data(), kCount * 4)), what,
                 " step ", step, ": ranks differ");
    }
    const cuda::AllocStats end = cuda::alloc_stats();
    MPI_EXPECT(t, end.device_allocs == set_up.device_allocs && end.pinned_allocs == set_up.pinned_allocs,
               what, ": allocated during steps (device ", end.device_allocs - set_up.device_allocs,
               ", pinned ", end.pinned_allocs - set_up.pinned_allocs, ")");
    if (t.rank() == 0)
      std::printf("%s: %zu buckets, compute %.4f s, exposed %.4f s, comm %.4f s\n", what.c_str(),
                  gr.num_buckets(), gr.last_step().compute_s, gr.last_step().exposed_comm_s,
                  gr.last_step().total_comm_s);
  }
  CUDA_CHECK(cudaStreamDestroy(compute));
  return t.finish(("gpu_mpi_device_grads " + path_name).c_str());
}

}  // namespace
}  // namespace rt

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  const std::string path = argc > 1 ? argv[1] : "staged";
  const int rc = rt::comm::comm_run_or_abort([&] { return rt::run(path); });
  MPI_Finalize();
  return rc;
}

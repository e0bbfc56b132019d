// comm.algorithm nccl on device buffers: rank-dependent integer-valued f32, bf16 and f16 data
// reduce exactly (sum and average) for counts 0, 1, 7 and 2^20 + 3, on device and managed memory;
// a host buffer is refused with a clear error.
//
// NCCL refuses two ranks of one communicator on one GPU. ctest therefore runs this program plainly
// (one rank, MPI as a singleton) and under mpirun -np 2, where, when ranks of a node share a GPU,
// only the test that the allreducer refuses them runs (and main exits 77, ctest: skipped, on a
// node without GPUs). Every rank runs every test, and a failed check
// never returns early, so the ranks stay in step through the collectives.
#include <cuda_fp16.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/mpi_check.h"
#include "cuda/check.h"
#include "cuda/nccl_allreducer.h"
#include "tests/gpu/gpu_test_util.h"

namespace rt::cuda {
namespace {

using comm::ReduceOp;

int g_rank = 0, g_ranks = 1;
bool g_shared_gpu = false;  // ranks of one node share a GPU: only the refusal below runs

// As tests/mpi's init_value (nccl-tests' InitData): integers that depend on rank and position.
// bf16 holds integers exactly only up to 256, so the 16-bit pattern repeats every 7: the sum over
// 8 ranks stays within 36 * 7 = 252.
size_t period(DType t) { return t == DType::f32 ? 1021 : 7; }
float init_value(DType t, int rank, size_t i) { return float(rank + 1) * float(1 + i % period(t)); }

uint16_t f16_bits(float f) { return __half_raw(__float2half_rn(f)).x; }
float f16_value(uint16_t b) {
  __half_raw r;
  r.x = b;
  return __half2float(__half(r));
}

// Host images of device buffers as raw bytes.
std::vector<char> encode(DType t, const std::vector<float>& v) {
  std::vector<char> b(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(&b[4 * i], &v[i], 4);
    } else {
      const uint16_t h = t == DType::bf16 ? to_bf16(v[i]).bits : f16_bits(v[i]);
      std::memcpy(&b[2 * i], &h, 2);
    }
  }
  return b;
}
float decode(DType t, const std::vector<char>& b, size_t i) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, &b[4 * i], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &b[2 * i], 2);
  return t == DType::bf16 ? from_bf16(bf16_t{h}) : f16_value(h);
}

// ncclAvg scales each input by 1/ranks before summing: exact when ranks is a power of two, else
// within about one rounding per rank.
float average_tolerance(DType t, float want) {
  if ((g_ranks & (g_ranks - 1)) == 0) return 0;
  const float eps = t == DType::f32 ? 0x1p-23f : t == DType::bf16 ? 0x1p-7f : 0x1p-10f;
  return float(g_ranks) * eps * std::fabs(want);
}

// One allreduce of n elements at buf (device or managed, at least n elements); returns how many
// results are wrong, reporting the first few.
size_t check_allreduce(comm::Allreducer& ar, void* buf, DType t, size_t n, ReduceOp op) {
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = init_value(t, g_rank, i);
  const std::vector<char> in = encode(t, mine);
  CUDA_CHECK(cudaMemcpy(buf, in.data(), in.size(), cudaMemcpyDefault));
  CUDA_CHECK(cudaDeviceSynchronize());  // NCCL's stream does not wait for the legacy stream
  ar.allreduce(buf, n, t, op);
  std::vector<char> out(in.size());
  CUDA_CHECK(cudaMemcpy(out.data(), buf, out.size(), cudaMemcpyDefault));
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const float sum = float(g_ranks * (g_ranks + 1) / 2) * float(1 + i % period(t));
    const float want = op == ReduceOp::sum ? sum : sum / float(g_ranks);
    const float tol = op == ReduceOp::sum ? 0 : average_tolerance(t, want);
    const float got = decode(t, out, i);
    if (!(std::fabs(got - want) <= tol) && ++bad <= 3)
      ADD_FAILURE() << dtype_name(t) << (op == ReduceOp::sum ? " sum" : " average") << " n " << n
                    << " at " << i << ": " << got << ", want " << want;
  }
  return bad;
}

const size_t kCounts[] = {0, 1, 7, (size_t{1} << 20) + 3};

TEST(GpuNccl, SumAndAverageAreExactOnDeviceMemory) {
  RT_REQUIRE_GPU();
  comm::Communicator comm(MPI_COMM_WORLD);
  auto ar = make_nccl_allreducer(comm, {});
  EXPECT_STREQ(ar->name(), "nccl");
  DeviceBuffer buf(kCounts[3] * 4);
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::average})
      for (size_t n : kCounts) EXPECT_EQ(check_allreduce(*ar, buf.get(), t, n, op), 0u);
}

// Managed memory is accepted too (the trainer's arena is plain device memory).
TEST(GpuNccl, ManagedMemoryOnTheCallersStream) {
  RT_REQUIRE_GPU();
  comm::Communicator comm(MPI_COMM_WORLD);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* buf = nullptr;
  CUDA_CHECK(cudaMallocManaged(&buf, kCounts[3] * 4));
  {
    auto ar = make_nccl_allreducer(comm, {}, stream);
    for (size_t n : kCounts)
      EXPECT_EQ(check_allreduce(*ar, buf, DType::f32, n, ReduceOp::average), 0u);
  }
  CUDA_CHECK(cudaFree(buf));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(GpuNccl, RegisteredAsCommAlgorithm) {
  RT_REQUIRE_GPU();
  register_nccl_allreducer();
  comm::Communicator comm(MPI_COMM_WORLD);
  comm::CommConfig cfg;
  cfg.algorithm = "nccl";
  auto ar = comm::make_allreducer(cfg, comm);  // the CPU kernels by default: unused by NCCL
  DeviceBuffer buf(1001 * 2);
  EXPECT_STREQ(ar->name(), "nccl");
  EXPECT_EQ(check_allreduce(*ar, buf.get(), DType::f16, 1001, ReduceOp::sum), 0u);
}

// Refused on every rank before any collective starts, so no rank is left waiting.
TEST(GpuNccl, HostBufferIsRefusedThenTheCommunicatorIsGone) {
  RT_REQUIRE_GPU();
  comm::Communicator comm(MPI_COMM_WORLD);
  auto ar = make_nccl_allreducer(comm, {});
  std::vector<float> host(4, 1.0f);
  std::string m;
  try {
    ar->allreduce(host, ReduceOp::sum);
  } catch (const CommError& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("allreduce 'nccl': the buffer is not device or managed memory"),
            std::string::npos) << m;
  m.clear();
  DeviceBuffer buf(16);
  try {
    ar->allreduce(buf.get(), 4, DType::f32, ReduceOp::sum);
  } catch (const CommError& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("given up after an earlier failure"), std::string::npos) << m;
}

// Ranks sharing a GPU (mpirun -np 2 on one GPU): every rank refuses the communicator with an
// error naming the ranks, before NCCL is asked (which would answer only "invalid usage").
TEST(GpuNccl, RanksSharingAGpuAreRefused) {
  if (!g_shared_gpu) GTEST_SKIP() << "every rank has a GPU of its own";
  comm::Communicator comm(MPI_COMM_WORLD);
  std::string m;
  try {
    make_nccl_allreducer(comm, {});
  } catch (const CommError& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("would share GPU"), std::string::npos) << m;
}

}  // namespace
}  // namespace rt::cuda

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  using rt::cuda::g_rank, rt::cuda::g_ranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_ranks);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0, local_ranks = 1;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &local_ranks);
  std::string why;
  const int gpus = rt::cuda::device_count(&why);
  // A single rank without a GPU runs and each test skips itself; several ranks need one each.
  int none_here = g_ranks > 1 && gpus == 0, none_any = 0;
  MPI_Allreduce(&none_here, &none_any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (none_any) {
    if (g_rank == 0)
      std::printf("gpu_nccl: skipped: %d ranks, and a rank sees no GPU%s%s\n", g_ranks,
                  why.empty() ? "" : ": ", why.c_str());
    MPI_Comm_free(&node);
    MPI_Finalize();
    return 77;
  }
  // Local rank k on GPU k mod the GPUs it sees. Whether two ranks of a node then share one is
  // told by their PCI bus ids (ranks given one GPU each through CUDA_VISIBLE_DEVICES all see
  // device 0, a different one each); where they do, only the test of NCCL's refusal runs.
  char bus[32] = {};
  if (gpus > 0) {
    if (cudaSetDevice(local % gpus) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bus, sizeof bus, local % gpus) != cudaSuccess) {
      std::fprintf(stderr, "gpu_nccl: rank %d: cannot select GPU %d\n", g_rank, local % gpus);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  std::vector<char> buses(sizeof bus * size_t(local_ranks));
  MPI_Allgather(bus, sizeof bus, MPI_CHAR, buses.data(), sizeof bus, MPI_CHAR, node);
  MPI_Comm_free(&node);
  int shared_here = 0, shared_any = 0;
  for (int r = 0; r < local_ranks; ++r)
    shared_here |= r != local && std::strcmp(&buses[sizeof bus * size_t(r)], bus) == 0;
  MPI_Allreduce(&shared_here, &shared_any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (shared_any) {
    rt::cuda::g_shared_gpu = true;
    ::testing::GTEST_FLAG(filter) = "GpuNccl.RanksSharingAGpuAreRefused";
  }
  int rc = RUN_ALL_TESTS(), worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

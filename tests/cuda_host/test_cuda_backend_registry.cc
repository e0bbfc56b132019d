// make_backend<float>("cuda"), "cuda-tf32", "cuda-bf16" and "cuda-fp16" before and after
// rt::cuda::register_backend(): without a device the error names the backend and gives the
// runtime's reason.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "cuda/backend.h"
#include "cuda/context.h"
#include "cuda/device.h"

namespace rt::cuda {
namespace {

std::string error_of(const std::string& name) {
  try {
    make_backend<float>(name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaBackendRegistry, UnregisteredThenRegistered) {
  const char* names[] = {"cuda", "cuda-tf32", "cuda-bf16", "cuda-fp16"};
  for (const char* n : names)
    EXPECT_NE(error_of(n).find("rt::cuda::register_backend()"), std::string::npos) << n;
  register_backend();
  register_backend();  // harmless twice
  std::string why;
  for (const std::string n : names) {
    const std::string family = n == "cuda-tf32" ? "cuda" : n;  // cuda-tf32 is the cuda backend
    if (device_count(&why) == 0) {
      const std::string m = error_of(n);
      EXPECT_NE(m.find("backend '" + family + "': no usable CUDA device: " + why), std::string::npos) << m;
    } else {
      EXPECT_EQ(make_backend<float>(n)->name(), family);
    }
  }
}

TEST(CudaBackendRegistry, SharedDeviceNote) {
  EXPECT_EQ(shared_device_note(1, 1), "");
  EXPECT_EQ(shared_device_note(8, 8), "");
  EXPECT_EQ(shared_device_note(2, 0), "");  // no device: the backend says so itself
  EXPECT_EQ(shared_device_note(2, 1),
            "ringtrain: note: 2 ranks on this node share its 1 GPU (local rank k takes GPU k mod 1): "
            "each gets a fraction of one; launch one rank per GPU for full speed");
  EXPECT_NE(shared_device_note(16, 8).find("16 ranks on this node share its 8 GPUs"), std::string::npos);
  // A launcher may give each rank its own GPU through CUDA_VISIBLE_DEVICES: not claimed shared.
  EXPECT_EQ(shared_device_note(2, 1, ""), shared_device_note(2, 1));  // set but empty: as unset
  const std::string v = shared_device_note(4, 1, "3");
  EXPECT_NE(v.find("4 ranks on this node, and CUDA_VISIBLE_DEVICES=3 shows this one 1 GPU"),
            std::string::npos) << v;
  EXPECT_NE(v.find("unless each rank was given GPUs of its own there"), std::string::npos) << v;
  EXPECT_EQ(shared_device_note(4, 4, "0,1,2,3"), "");
}

// The node-local rank an MPI program gives wins over the launchers' variables, which stand in
// where it gives none; without either, rank 0 of 1.
TEST(CudaBackendRegistry, NodeLocalRankFromTheProgramOrTheLauncher) {
  const char* vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                        "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : vars) {
    if (const char* s = std::getenv(v)) saved.emplace_back(v, s);
    unsetenv(v);
  }
  BackendOptions o;
  EXPECT_EQ(node_local_rank(o), 0);
  EXPECT_EQ(node_local_size(o), 1);
  setenv("SLURM_LOCALID", "3", 1);
  setenv("MPI_LOCALNRANKS", "4", 1);
  EXPECT_EQ(node_local_rank(o), 3);
  EXPECT_EQ(node_local_size(o), 4);
  o.local_rank = 1;
  o.local_size = 2;
  EXPECT_EQ(node_local_rank(o), 1);
  EXPECT_EQ(node_local_size(o), 2);
  for (const char* v : vars) unsetenv(v);
  for (const auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
}

// A job's cuda.* options as the context the backend runs on.
TEST(CudaBackendOptions, ContextConfigFollowsTheOptions) {
  BackendOptions o;
  ContextConfig c = context_config(o, "cuda", false, 3);
  EXPECT_EQ(c.device, 3);
  EXPECT_FALSE(c.benchmark_algos);  // auto: the backend's own choice
  EXPECT_FALSE(c.deterministic);
  EXPECT_EQ(c.workspace_limit, size_t{1} << 30);
  EXPECT_TRUE(context_config(o, "cuda-bf16", true, 0).benchmark_algos);
  o.conv_algos = "timed";
  EXPECT_TRUE(context_config(o, "cuda", false, 0).benchmark_algos);
  o.conv_algos = "heuristic";
  EXPECT_FALSE(context_config(o, "cuda-bf16", true, 0).benchmark_algos);
  o.conv_algos = "auto";
  o.deterministic = true;  // heuristics even where the backend would time: same choice every run
  c = context_config(o, "cuda-bf16", true, 0);
  EXPECT_TRUE(c.deterministic);
  EXPECT_FALSE(c.benchmark_algos);
  o.workspace_mib = 0;
  EXPECT_EQ(context_config(o, "cuda", false, 0).workspace_limit, 0u);

  auto error = [](BackendOptions b) {
    try {
      context_config(b, "cuda-fp16", true, 0);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  BackendOptions bad;
  bad.conv_algos = "fastest";
  EXPECT_NE(error(bad).find("backend 'cuda-fp16': conv_algos must be auto, timed or heuristic (got 'fastest')"),
            std::string::npos) << error(bad);
  bad = {};
  bad.workspace_mib = -1;
  EXPECT_NE(error(bad).find("workspace_mib must be >= 0"), std::string::npos) << error(bad);
  bad = {};
  bad.conv_algos = "timed";
  bad.deterministic = true;
  EXPECT_NE(error(bad).find("deterministic results need heuristic"), std::string::npos) << error(bad);
  // make_backend hands the options to the registered factory, which refuses them before looking
  // for a device.
  register_backend();
  try {
    make_backend<float>("cuda-bf16", bad);
    ADD_FAILURE() << "timed + deterministic accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend 'cuda-bf16': deterministic"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rt::cuda

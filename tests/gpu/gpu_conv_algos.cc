// How the cuDNN convolutions' algorithms are chosen: once per shape (kind, math, geometry), none
// for backward data without an input gradient, kept in a file for the next run; and, on the
// emulator, candidates cuDNN refuses or oversizes passed over, one listed under two math types
// taken once, a first choice refused at its first run replaced, a device fault at a first run
// not taken for a refusal. Every layer still computes what the reference backend does.
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/conv_algo_file.h"
#include "cuda/conv_algos.h"
#include "cuda/cudnn_conv.h"
#include "cuda/lowp_conv.h"
#include "cuda/lowp_kernels.h"  // bf16
#include "tests/gpu/cudnn_test_util.h"
#ifdef RT_CUDA_EMULATOR
#include "tests/cuda_emu/cudnn_emu.h"  // the emulated cuDNN's test hooks
#endif

namespace rt::cuda {
namespace {

using namespace test;

// A context chooses algorithms once per distinct convolution (kind, math, geometry); a layer of a
// shape seen before takes that choice, math types included, and computes as well.
TEST(GpuCudnnConv, AlgorithmsChosenOncePerShape) {
  RT_REQUIRE_GPU();
  for (bool benchmark : {false, true}) {
    ContextConfig cfg;
    cfg.benchmark_algos = benchmark;
    CudaContext ctx(cfg);
    const ConvDesc d{"a", {4, 16, 12, 12}, 32, 3, 3, 1, 1, 1, 1, false};
    CudnnConv a(d, ctx);
    EXPECT_EQ(ctx.conv_algos().shapes(), 1);
    EXPECT_EQ(ctx.conv_algos().reused(), 0);
    ConvDesc same = d;  // another name and a bias: the same algorithms
    same.name = "same";
    same.bias = true;
    CudnnConv b(same, ctx);
    EXPECT_EQ(ctx.conv_algos().shapes(), 1);
    EXPECT_EQ(ctx.conv_algos().reused(), 1);
    EXPECT_EQ(b.workspace_bytes(), a.workspace_bytes());
    check_conv(ctx, same);  // a third layer of the shape, against the reference
    EXPECT_EQ(ctx.conv_algos().reused(), 2);
    ConvDesc other[4] = {d, d, d, d};  // each differs from d in one respect
    other[0].stride_h = 2;
    other[1].pad_w = 0;
    other[2].out_c = 8;
    other[3].in.n = 5;
    for (const ConvDesc& o : other) {
      CudnnConv c(o, ctx);
    }
    EXPECT_EQ(ctx.conv_algos().shapes(), 5);
    LowpConv<bf16> lowp(d, ctx);  // another data type and layout
    EXPECT_EQ(ctx.conv_algos().shapes(), 6);
    EXPECT_EQ(ctx.conv_algos().reused(), 2);
    CudaContext fresh(cfg);  // choices are per context
    CudnnConv e(d, fresh);
    EXPECT_EQ(fresh.conv_algos().shapes(), 1);
    EXPECT_EQ(fresh.conv_algos().reused(), 0);
  }
}

// A layer built without an input gradient (the network's first): no backward-data algorithm is
// chosen, its choice is kept apart from the same geometry's with one, y and dw are still right,
// and a backward asking for dx is refused.
TEST(GpuCudnnConv, NoBackwardDataAlgorithmWithoutAnInputGradient) {
  RT_REQUIRE_GPU();
  ContextConfig cfg;
  cfg.benchmark_algos = true;
  CudaContext ctx(cfg);
  ConvDesc d{"stem", {2, 3, 16, 16}, 8, 7, 7, 2, 2, 3, 3, true};
  d.input_grad = false;
#ifdef RT_CUDA_EMULATOR
  const int64_t queries = rt_emu::bwd_data_algo_queries();
#endif
  CudnnConv conv(d, ctx);
  LowpConv<bf16> lowp(d, ctx);
#ifdef RT_CUDA_EMULATOR
  EXPECT_EQ(rt_emu::bwd_data_algo_queries(), queries);
#endif
  EXPECT_EQ(ctx.conv_algos().shapes(), 2);
  ConvDesc with_dx = d;
  with_dx.input_grad = true;
  CudnnConv other(with_dx, ctx);
  EXPECT_EQ(ctx.conv_algos().shapes(), 3);
  EXPECT_EQ(ctx.conv_algos().reused(), 0);

  auto ref = make_backend<float>("reference")->make_conv(with_dx);
  const size_t nx = size_t(d.in.numel()), nw = size_t(d.weight_count()), ny = size_t(d.out().numel());
  const auto x = randn(nx, 7), w = randn(nw, 8), b = randn(8, 9), dy = randn(ny, 10);
  std::vector<float> y(ny), dx(nx), dw(nw), db(8);
  ref->forward(x.data(), w.data(), b.data(), y.data());
  ref->backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
  DeviceBuffer gx = to_device(x), gw = to_device(w), gb = to_device(b), gdy = to_device(dy),
               gy(ny * 4), gdx(nx * 4), gdw(nw * 4), gdb(8 * 4);
  conv.forward(gx.as<float>(), gw.as<float>(), gb.as<float>(), gy.as<float>());
  conv.backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), nullptr, gdw.as<float>(),
                gdb.as<float>());
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  expect_close(to_host<float>(gy, ny), y, "y", d.name);
  expect_close(to_host<float>(gdw, nw), dw, "dw", d.name);
  expect_close(to_host<float>(gdb, 8), db, "db", d.name);
  EXPECT_THROW(conv.backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), gdx.as<float>(),
                             gdw.as<float>(), gdb.as<float>()),
               Error);
  EXPECT_THROW(lowp.backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), gdx.as<float>(),
                             gdw.as<float>(), gdb.as<float>()),
               Error);
}

bool same_algos(const ConvAlgos& a, const ConvAlgos& b) {
  return a.fwd == b.fwd && a.bwd_data == b.bwd_data && a.bwd_filter == b.bwd_filter &&
         a.fwd_math == b.fwd_math && a.bwd_data_math == b.bwd_data_math &&
         a.bwd_filter_math == b.bwd_filter_math && a.workspace == b.workspace;
}

// cuda.algo_cache: a later context with the same settings takes every choice from the file (no
// timing) and computes as well; other settings choose afresh; a stored choice that cuDNN does not
// accept for its shape, or that would put fp32 on tensor cores without TF32, is chosen again and
// the new choice appended.
TEST(GpuCudnnConv, AlgorithmChoicesKeptInAFile) {
  RT_REQUIRE_GPU();
  const std::string file = std::filesystem::temp_directory_path() /
                           ("rt_gpu_algos_" + std::to_string(getpid()) + ".tsv");
  std::filesystem::remove(file);
  ContextConfig cfg;
  cfg.benchmark_algos = true;
  cfg.algo_cache = file;
  const std::string id = context_identity(cfg);
  const ConvDesc a{"a", {4, 16, 12, 12}, 32, 3, 3, 1, 1, 1, 1, false};
  const ConvDesc b{"b", {2, 32, 9, 9}, 64, 1, 1, 2, 2, 0, 0, false};
  ConvAlgos chosen;
  {
    CudaContext ctx(cfg);
    CudnnConv ca(a, ctx), cb(b, ctx), again(a, ctx);
    EXPECT_EQ(ctx.conv_algos().shapes(), 2);
    EXPECT_EQ(ctx.conv_algos().loaded(), 0);
    chosen = *ctx.conv_algos().find(conv_algo_key(a, false, ""));
  }
  EXPECT_EQ(read_algo_file(file, id).lines, 2);
  {
    CudaContext ctx(cfg);
    check_conv(ctx, a);  // the file's choice, against the reference
    CudnnConv cb(b, ctx);
    EXPECT_EQ(ctx.conv_algos().shapes(), 2);
    EXPECT_EQ(ctx.conv_algos().loaded(), 2);
    EXPECT_TRUE(same_algos(*ctx.conv_algos().find(conv_algo_key(a, false, "")), chosen));
  }
  EXPECT_EQ(read_algo_file(file, id).lines, 2);  // nothing new to append
  ContextConfig heuristic = cfg;
  heuristic.benchmark_algos = false;
  {
    CudaContext ctx(heuristic);
    CudnnConv ca(a, ctx);
    EXPECT_EQ(ctx.conv_algos().loaded(), 0);
  }
  EXPECT_EQ(read_algo_file(file, context_identity(heuristic)).choices.size(), 1u);

  // Stale lines, as a hand edit or another cuDNN could leave: Winograd for a 1x1 convolution, and
  // tensor-op math for fp32 without TF32.
  const ConvDesc c{"c", {2, 32, 9, 9}, 16, 1, 1, 2, 2, 0, 0, false};
  const ConvDesc d{"d", {4, 16, 12, 12}, 8, 3, 3, 1, 1, 1, 1, false};
  ConvAlgos winograd, tensor_op;
  winograd.fwd = CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD;
  winograd.fwd_math = winograd.bwd_data_math = winograd.bwd_filter_math = CUDNN_FMA_MATH;
  tensor_op.fwd_math = tensor_op.bwd_data_math = tensor_op.bwd_filter_math = CUDNN_TENSOR_OP_MATH;
  append_algo_file(file, algo_file_line(id, conv_algo_key(c, false, ""), winograd));
  append_algo_file(file, algo_file_line(id, conv_algo_key(d, false, ""), tensor_op));
  {
    CudaContext ctx(cfg);
    check_conv(ctx, c);
    check_conv(ctx, d);
    EXPECT_EQ(ctx.conv_algos().loaded(), 0);
    EXPECT_EQ(ctx.conv_algos().shapes(), 2);
  }
  const AlgoFileContents after = read_algo_file(file, id);
  EXPECT_EQ(after.lines, 7);  // 2 + 1 heuristic + 2 stale + 2 chosen again
  EXPECT_NE(after.choices.at(conv_algo_key(c, false, "")).fwd, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD);
  EXPECT_EQ(after.choices.at(conv_algo_key(d, false, "")).fwd_math, CUDNN_FMA_MATH);

  // A stale line for a tensor-op convolution (an algorithm cuDNN refuses, under FMA math): the
  // search that replaces it runs under the convolution's own math type, not the line's.
  ConvAlgos fma_stale;
  fma_stale.fwd = CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD;
  fma_stale.fwd_math = fma_stale.bwd_data_math = fma_stale.bwd_filter_math = CUDNN_FMA_MATH;
  append_algo_file(file, algo_file_line(id, conv_algo_key(c, true, "bf16 NHWC "), fma_stale));
  {
    CudaContext ctx(cfg);
    LowpConv<bf16> lowp(c, ctx);
    EXPECT_EQ(ctx.conv_algos().loaded(), 0);
    const ConvAlgos* chosen_again = ctx.conv_algos().find(conv_algo_key(c, true, "bf16 NHWC "));
    ASSERT_NE(chosen_again, nullptr);
    EXPECT_NE(chosen_again->fwd, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD);
#ifdef RT_CUDA_EMULATOR  // which reports the descriptor's math type as the algorithm's
    EXPECT_EQ(chosen_again->fwd_math, CUDNN_TENSOR_OP_MATH);
#endif
  }
  std::filesystem::remove(file);
}

#ifdef RT_CUDA_EMULATOR
// Rankings that put first an algorithm the workspace query refuses and one whose query asks for
// far more than its ranking said (both seen from real cuDNN): the choice passes over both, in
// each direction, timed or not, fp32 and 16-bit, and the layer computes. When the policy allows
// none, the error says how many were ranked and allowed.
// Sets d up as an fp32 layer (checked against the reference) and a bf16 one, with heuristic and
// with timed choice, and hands each context's choice for the two to check(key, algos).
template <class Check>
void check_choices(const ConvDesc& d, Check check) {
  for (bool benchmark : {false, true}) {
    ContextConfig cfg;
    cfg.benchmark_algos = benchmark;
    CudaContext ctx(cfg);
    check_conv(ctx, d);
    LowpConv<bf16> lowp(d, ctx);
    for (const std::string& key : {conv_algo_key(d, false, ""), conv_algo_key(d, true, "bf16 NHWC ")}) {
      const ConvAlgos* a = ctx.conv_algos().find(key);
      ASSERT_NE(a, nullptr) << key;
      check(key, *a);
    }
  }
}

TEST(GpuCudnnConv, RefusedAndOversizedCandidatesArePassedOver) {
  const rt_emu::DecoyAlgorithms decoys;
  const ConvDesc d{"3x3", {4, 16, 12, 12}, 32, 3, 3, 1, 1, 1, 1, false};
  check_choices(d, [](const std::string& key, const ConvAlgos& a) {
    EXPECT_EQ(int(a.fwd), 0) << key;
    EXPECT_EQ(int(a.bwd_data), 0) << key;
    EXPECT_EQ(int(a.bwd_filter), 0) << key;
    EXPECT_EQ(a.workspace, 4096u) << key;  // the emulator's need, not the decoy's 1 TiB
  });
  ContextConfig small;
  small.workspace_limit = 1000;  // below every candidate's reported need
  CudaContext ctx(small);
  try {
    CudnnConv conv(d, ctx);
    FAIL() << "a convolution with no algorithm allowed was set up";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layer 3x3: no cuDNN forward algorithm"), std::string::npos) << m;
    EXPECT_NE(m.find("(3 candidates, 0 allowed)"), std::string::npos) << m;
  }
}

// cuDNN's heuristics list an algorithm under each math type it has; without TF32 both run as
// FMA math, one candidate: the choice's followers (where a refused first run goes) never repeat
// it, nor any other (algorithm, math type). The layer computes as the reference.
TEST(GpuCudnnConv, AnAlgorithmListedTwiceIsOneCandidate) {
  const rt_emu::AlgorithmsListedTwice twice;
  const ConvDesc d{"3x3", {4, 16, 12, 12}, 32, 3, 3, 1, 1, 1, 1, false};
  check_choices(d, [&](const std::string& key, const ConvAlgos& a) {
    for (int dir = 0; dir < 3; ++dir) {
      std::vector<ConvCandidate> all{direction(a, dir)};
      all.insert(all.end(), a.next[dir].begin(), a.next[dir].end());
      for (size_t i = 0; i < all.size(); ++i)
        for (size_t j = 0; j < i; ++j)
          EXPECT_FALSE(all[i].algo == all[j].algo && all[i].math == all[j].math)
              << key << " direction " << dir << ": algorithm " << all[i].algo << " twice";
    }
    // fp32 without TF32: the second listing (tensor-op math) ran as FMA too, the same candidate.
    if (key == conv_algo_key(d, false, "")) {
      EXPECT_TRUE(a.next[0].empty()) << key;
    }
  });
}

// cuDNN can refuse at run time an algorithm its workspace query accepted, and heuristic choice
// runs none at set-up; the emulator's algorithm 3 is such a one, ranked first, needing less
// workspace than algorithm 0. Heuristic choice takes it; each direction's first run moves on to
// algorithm 0, growing the workspace, and the layer computes as the reference (fp32) or at all
// (bf16); the context's choice and the algorithm cache file then hold algorithm 0, revised once
// per direction for the two layers of the shape. Timed choice saw the refusal and never takes
// algorithm 3. A file's choice refused at its first run is followed by the heuristic ranking.
// Without another candidate the first run fails, naming the layer and cuDNN's reason; as out of
// memory when cuDNN said so.
TEST(GpuCudnnConv, AlgorithmRefusedAtItsFirstRunIsReplaced) {
  std::optional<rt_emu::UnrunnableAlgorithm> unrunnable(std::in_place);
  const ConvDesc d{"3x3", {4, 16, 12, 12}, 32, 3, 3, 1, 1, 1, 1, true};
  const std::string file = std::filesystem::temp_directory_path() /
                           ("rt_gpu_refused_" + std::to_string(getpid()) + ".tsv");
  std::filesystem::remove(file);
  for (bool benchmark : {false, true}) {
    ContextConfig cfg;
    cfg.benchmark_algos = benchmark;
    cfg.algo_cache = benchmark ? "" : file;
    CudaContext ctx(cfg);
    const std::string key = conv_algo_key(d, false, "");
    {
      CudnnConv first(d, ctx);
      EXPECT_EQ(first.forward_algo(), benchmark ? 0 : 3);
      EXPECT_EQ(first.workspace_bytes(), benchmark ? 4096u : 2048u);
    }
    check_conv(ctx, d);  // runs forward, backward-data and backward-filter once
    check_conv(ctx, d);  // another layer of the shape, which also started from algorithm 3
    const ConvAlgos* a = ctx.conv_algos().find(key);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(int(a->fwd), 0);
    EXPECT_EQ(int(a->bwd_data), 0);
    EXPECT_EQ(int(a->bwd_filter), 0);
    EXPECT_EQ(a->workspace, 4096u);
    EXPECT_EQ(ctx.conv_algos().revised(), benchmark ? 0 : 3);  // once per direction
    EXPECT_GE(ctx.workspace_bytes(), 4096u);

    LowpConv<bf16> lowp(d, ctx);
    const size_t nx = size_t(d.in.numel()), nw = size_t(d.weight_count()),
                 ny = size_t(d.out().numel());
    // bf16 0.5 and 0.25 for x and dy (the weights are the arena's fp32).
    DeviceBuffer gx = to_device(std::vector<uint16_t>(nx, 0x3F00)),
                 gdy = to_device(std::vector<uint16_t>(ny, 0x3E80)), gw = to_device(randn(nw, 1)),
                 gb = to_device(randn(size_t(d.out_c), 2)), gy(ny * 2), gdx(nx * 2), gdw(nw * 4),
                 gdb(size_t(d.out_c) * 4);
    lowp.forward(gx.as<float>(), gw.as<float>(), gb.as<float>(), gy.as<float>());
    lowp.backward(gx.as<float>(), gw.as<float>(), gdy.as<float>(), gdx.as<float>(),
                  gdw.as<float>(), gdb.as<float>());
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    const ConvAlgos* l = ctx.conv_algos().find(conv_algo_key(d, true, "bf16 NHWC "));
    ASSERT_NE(l, nullptr);
    EXPECT_EQ(int(l->fwd) + int(l->bwd_data) + int(l->bwd_filter), 0);
  }
  // The file's last line for the shape (the one a later run takes) holds algorithm 0, and each
  // direction's revision was appended once: the choice, then three revisions, per kind.
  ContextConfig heuristic;
  heuristic.algo_cache = file;
  const AlgoFileContents kept = read_algo_file(file, context_identity(heuristic));
  EXPECT_EQ(kept.lines, 8);
  EXPECT_EQ(int(kept.choices.at(conv_algo_key(d, false, "")).fwd), 0);
  // A choice read from the file that cuDNN refuses to run all the same (algorithm 3 in every
  // direction) is followed by cuDNN's heuristic ranking.
  ConvAlgos three;
  three.fwd = cudnnConvolutionFwdAlgo_t(3);
  three.bwd_data = cudnnConvolutionBwdDataAlgo_t(3);
  three.bwd_filter = cudnnConvolutionBwdFilterAlgo_t(3);
  three.fwd_math = three.bwd_data_math = three.bwd_filter_math = CUDNN_FMA_MATH;
  append_algo_file(file, algo_file_line(context_identity(heuristic), conv_algo_key(d, false, ""),
                                        three));
  {
    CudaContext ctx(heuristic);
    check_conv(ctx, d);
    EXPECT_EQ(ctx.conv_algos().loaded(), 1);
    EXPECT_EQ(ctx.conv_algos().revised(), 3);
  }
  std::filesystem::remove(file);

  ContextConfig only;
  only.workspace_limit = 3000;  // algorithm 3 alone fits
  CudaContext ctx(only);
  try {
    check_conv(ctx, d);
    FAIL() << "a convolution whose every algorithm cuDNN refused ran";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layer 3x3: cuDNN runs no forward algorithm whose workspace it confirmed"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("algorithm 3 cannot run this convolution"), std::string::npos) << m;
  }
  // Refused for want of memory, it is out of memory (the trainer's error then says what to cut).
  unrunnable.emplace(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED);
  EXPECT_THROW(check_conv(ctx, d), OutOfMemory);
}

// A first run that fails because the device faulted (a sticky error: every later call returns
// it) is no refusal: no other candidate is tried, nothing is revised, and the error names the
// fault instead of blaming the choice.
TEST(GpuCudnnConv, DeviceFaultAtAFirstRunIsNotTakenForARefusal) {
  rt_emu::UnrunnableAlgorithm faulting(CUDNN_STATUS_EXECUTION_FAILED, cudaErrorIllegalAddress);
  const ConvDesc d{"3x3", {4, 16, 12, 12}, 32, 3, 3, 1, 1, 1, 1, true};
  ContextConfig cfg;
  CudaContext ctx(cfg);
  CudnnConv conv(d, ctx);
  ASSERT_EQ(conv.forward_algo(), 3);
  DeviceBuffer x(size_t(d.in.numel()) * 4), w(size_t(d.weight_count()) * 4), b(size_t(d.out_c) * 4),
      y(size_t(d.out().numel()) * 4);
  testing::internal::CaptureStderr();
  try {
    conv.forward(x.as<float>(), w.as<float>(), b.as<float>(), y.as<float>());
    FAIL() << "a faulted device's convolution ran";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const std::string& want :
         {std::string("layer 3x3: the device failed while cuDNN ran its forward algorithm 3"),
          std::string("cudaErrorIllegalAddress"), std::string("not a refusal"),
          str_cat("(", int(CUDNN_STATUS_EXECUTION_FAILED), ")")})
      EXPECT_NE(m.find(want), std::string::npos) << "no '" << want << "' in: " << m;
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("refused"), std::string::npos);
  EXPECT_EQ(ctx.conv_algos().revised(), 0);
  EXPECT_EQ(conv.forward_algo(), 3);
}

#endif  // RT_CUDA_EMULATOR

}  // namespace
}  // namespace rt::cuda

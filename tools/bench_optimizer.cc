// Optimizer-step benchmark: one update of a model's whole arena (ResNet-50's 25.6M parameters by
// default) by SGD, AdamW and LAMB on the host, median and spread over repeats after warm-up.
// Prints one "RESULT,kind=...,median_ms=...,min_ms=...,max_ms=..." line per optimizer
// (tools/bench_optimizer.sh puts PyTorch's beside them).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "nn/adam.h"
#include "nn/resnet.h"
#include "tools/cli_args.h"

namespace {
constexpr const char* kUsage = "usage: bench_optimizer [--model resnet50] [--threads 1] [--iters 10]\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_optimizer: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}
}  // namespace

int main(int argc, char** argv) try {
  std::string model = "resnet50";
  int threads = 1, warmup = 2, iters = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (k != "--model" && k != "--threads" && k != "--iters") usage("unknown flag " + k);
    if (i + 1 >= argc) usage("missing value for " + k);
    const std::string v = argv[++i];
    if (k == "--model") {
      model = v;
      continue;
    }
    const long long hi = k == "--threads" ? 1024 : 1000000;
    const auto x = rt::tools::parse_int(v, 1, hi);
    if (!x) usage(k + " takes an integer in [1, " + std::to_string(hi) + "], not '" + v + "'");
    (k == "--threads" ? threads : iters) = int(*x);
  }
  omp_set_num_threads(threads);
  rt::ResNetConfig c;
  c.name = model;
  c.batch = 1;
  c.image_size = 32;
  c.inference_only = true;  // only its arena is used
  auto net = rt::build_resnet<float>(c, rt::make_backend<float>("reference"));
  auto& a = net->arena();
  std::mt19937 g(1);
  std::normal_distribution<float> d(0, 1e-3f);
  for (float& x : a.grads()) x = d(g);
  for (auto kind : {rt::OptimizerKind::sgd, rt::OptimizerKind::adamw, rt::OptimizerKind::lamb}) {
    rt::SgdConfig cfg;
    cfg.kind = kind;
    cfg.decay_bn_and_bias = false;
    auto opt = rt::make_host_optimizer<float>(a.layout(), cfg);
    std::vector<double> ms;
    for (int i = 0; i < warmup + iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      opt->step(a.params().data(), a.grads().data(), 1e-4);
      const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i >= warmup) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("RESULT,kind=%s,model=%s,params=%zu,threads=%d,median_ms=%.2f,min_ms=%.2f,max_ms=%.2f\n",
                rt::optimizer_kind_name(kind), model.c_str(), a.param_count(), threads, ms[ms.size() / 2], ms.front(),
                ms.back());
  }
  return 0;
} catch (const std::exception& e) {  // an unknown --model
  std::fprintf(stderr, "bench_optimizer: error: %s\n", e.what());
  return 1;
}

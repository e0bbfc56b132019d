// Training-step benchmark: images/s of forward + backward + SGD update on a synthetic batch,
// median and spread over clean repeats, peak resident memory, and achieved GFLOP/s against the
// machine's measured fp32 peak (a large oneDNN sgemm).
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.h>

#include "nn/clock.h"
#include "nn/optimizer.h"
#include "nn/resnet.h"
#include "tools/cli_args.h"
#include "tools/profile_print.h"
#ifdef RT_HAVE_CUDA
#include "cuda/backend.h"
#endif

namespace {

using rt::now_s;

// CPU-seconds used by all processes (user + nice + system) and by this process.
double machine_busy_s() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  long long user = 0, nice = 0, sys = 0;
  f >> cpu >> user >> nice >> sys;
  return double(user + nice + sys) / double(sysconf(_SC_CLK_TCK));
}
double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Args {
  std::string model = "resnet50", backend = "onednn";
  int64_t batch = 32, size = 224, classes = 0;
  int threads = 0, warmup = 2, iters = 6;
  int block = 0;  // oneDNN's activation channel block (0: the processor's)
  double time_cap = 150;
  double drop_path = 0;  // stochastic depth's rate in the last block (model.drop_path)
  bool peak = false, profile = false;
};

constexpr const char* kUsage =
    "usage: bench_train_step [--model resnet50] [--batch 32] [--size 224] [--classes N]\n"
    "                        [--threads N] [--backend onednn|onednn-direct|reference|cuda] [--warmup 2] [--iters 6]\n"
    "                        [--time-cap 150] [--drop-path R] [--block 8|16] [--peak] [--profile]\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_train_step: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  // Integer flags and their ranges (far past any use: a stray digit is refused, not wrapped).
  static const std::map<std::string, std::pair<long long, long long>> ints = {
      {"--batch", {1, 1 << 16}},  {"--size", {8, 4096}},     {"--classes", {0, 1 << 20}}, {"--threads", {0, 1024}},
      {"--warmup", {0, 1 << 20}}, {"--iters", {1, 1 << 20}}, {"--block", {0, 16}}};
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      std::fputs(
          "Times forward + backward + SGD(momentum 0.9, wd 1e-4) on one synthetic batch. An iteration\n"
          "during which other processes used the CPU is reported with '*' and left out when at least\n"
          "3 clean ones remain. --peak also measures the fp32 peak with a 3072^3 oneDNN sgemm;\n"
          "--profile prints each layer's forward and backward time per step, summed by layer kind;\n"
          "--drop-path adds stochastic depth at that rate (model.drop_path); --block sets the oneDNN\n"
          "backend's activation layout to nChw8c or nChw16c (default: 16 where the CPU has AVX-512).\n",
          stdout);
      std::exit(0);
    }
    if (k == "--peak" || k == "--profile") {
      (k == "--peak" ? a.peak : a.profile) = true;
      continue;
    }
    if (!ints.count(k) && k != "--model" && k != "--backend" && k != "--time-cap" && k != "--drop-path")
      usage("unknown flag " + k);
    if (i + 1 >= argc) usage("missing value for " + k);
    const std::string v = argv[++i];
    long long n = 0;
    if (const auto it = ints.find(k); it != ints.end()) {
      const auto x = rt::tools::parse_int(v, it->second.first, it->second.second);
      if (!x)
        usage(k + " takes an integer in [" + std::to_string(it->second.first) + ", " +
              std::to_string(it->second.second) + "], not '" + v + "'");
      n = *x;
    }
    if (k == "--model") a.model = v;
    else if (k == "--backend") a.backend = v;
    else if (k == "--batch") a.batch = n;
    else if (k == "--size") a.size = n;
    else if (k == "--classes") a.classes = n;
    else if (k == "--threads") a.threads = int(n);
    else if (k == "--warmup") a.warmup = int(n);
    else if (k == "--iters") a.iters = int(n);
    else if (k == "--block") {
      if (n != 0 && n != 8 && n != 16) usage("--block takes 8 or 16 (0: the processor's), not '" + v + "'");
      a.block = int(n);
    }
    else if (k == "--time-cap") {
      // A cap above 0: the first iteration always runs (there is a time to report).
      const auto x = rt::tools::parse_real(v, 0, 1e7);
      if (!x || *x <= 0) usage("--time-cap takes seconds in (0, 1e7], not '" + v + "'");
      a.time_cap = *x;
    }
    else {
      const auto x = rt::tools::parse_real(v, 0, 1);
      if (!x || *x >= 1) usage("--drop-path takes a rate in [0, 1), not '" + v + "'");
      a.drop_path = *x;
    }
  }
  return a;
}

// Best of 5 large sgemms: the practical fp32 ceiling of this machine with these threads.
double sgemm_peak_gflops() {
  const int n = 3072;
  std::vector<float> A(size_t(n) * n, 0.5f), B(size_t(n) * n, 0.25f), C(size_t(n) * n, 0.f);
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    double t0 = now_s();
    dnnl_sgemm('N', 'N', n, n, n, 1.f, A.data(), n, B.data(), n, 0.f, C.data(), n);
    best = std::max(best, 2.0 * n * n * double(n) / (now_s() - t0) / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) try {
  Args a = parse(argc, argv);
  if (a.threads > 0) omp_set_num_threads(a.threads);
  int threads = omp_get_max_threads();

  rt::ResNetConfig cfg;
  cfg.name = a.model;
  cfg.batch = a.batch;
  cfg.image_size = a.size;
  cfg.drop_path = a.drop_path;
  // CIFAR models default to 10 classes, ImageNet ones to 1000 (as the PyTorch peer script).
  bool cifar = a.model == "resnet20" || a.model == "resnet32" || a.model == "resnet44" ||
               a.model == "resnet56" || a.model == "resnet110";
  cfg.num_classes = a.classes > 0 ? a.classes : cifar ? 10 : 1000;
#ifdef RT_HAVE_CUDA
  rt::cuda::register_backend();
#endif
  rt::BackendOptions opts;
  opts.onednn_block = a.block;
  auto net = rt::build_resnet<float>(cfg, rt::make_backend<float>(a.backend, opts));
  // The backend's optimizer: Sgd on the CPU backends, the fused device step on CUDA ones (whose
  // arena the host cannot touch).
  auto opt = net->backend().make_sgd(net->arena().layout(), rt::SgdConfig{});

  std::mt19937_64 rng(0);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(net->shape(0).numel()));
  for (auto& v : x) v = nd(rng);
  std::vector<int32_t> y(size_t(a.batch));
  for (auto& v : y) v = int32_t(rng() % uint64_t(cfg.num_classes));

  double loss = 0;
  auto step = [&] {
    net->queue_forward(x.data(), y.data(), true);
    net->backward();
    opt->step(net->arena().params().data(), net->arena().grads().data(), 0.01);
    net->backend().sync();  // a device queues the update: the step's time includes it
    loss = net->last_loss();
  };
  for (int i = 0; i < a.warmup; ++i) step();
  net->set_profiling(a.profile);

  std::vector<double> all, clean;
  std::string log;
  double t_start = now_s();
  while (int(clean.size()) < a.iters && int(all.size()) < 3 * a.iters && now_s() - t_start < a.time_cap) {
    double b0 = machine_busy_s(), c0 = process_cpu_s(), t0 = now_s();
    step();
    double dt = now_s() - t0, foreign = (machine_busy_s() - b0) - (process_cpu_s() - c0);
    bool ok = foreign < std::max(0.05 * dt, 0.03);
    all.push_back(dt);
    if (ok) clean.push_back(dt);
    char buf[32];
    std::snprintf(buf, sizeof buf, " %.3f%s", dt, ok ? "" : "*");
    log += buf;
  }
  if (a.profile) rt::tools::print_profile(*net);
  if (!std::isfinite(loss)) throw rt::Error("non-finite loss " + std::to_string(loss));
  std::vector<double> use = clean.size() >= 3 ? clean : all;
  std::sort(use.begin(), use.end());
  double med = use.size() % 2 ? use[use.size() / 2] : 0.5 * (use[use.size() / 2 - 1] + use[use.size() / 2]);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::string setup = net->backend().setup_note();  // a CSV field: no commas
  std::replace(setup.begin(), setup.end(), ',', ';');
  double gflop = net->train_flops() / 1e9;
  std::printf(
      "RESULT,ringtrain,%s,train,batch=%lld,size=%lld,threads=%d,backend=%s,setup=%s,params=%zu,clean_iters=%zu,"
      "total_iters=%zu,median_s=%.4f,min_s=%.4f,max_s=%.4f,img_per_s=%.2f,img_per_s_best=%.2f,"
      "img_per_s_worst=%.2f,gflop_per_step=%.1f,gflops=%.1f,peak_rss_mb=%.0f,status=%s\n",
      a.model.c_str(), (long long)a.batch, (long long)a.size, threads, a.backend.c_str(),
      setup.c_str(), net->arena().param_count(), clean.size(), all.size(), med, use.front(), use.back(), a.batch / med,
      a.batch / use.front(), a.batch / use.back(), gflop, gflop / med, double(ru.ru_maxrss) / 1024.0,
      clean.size() >= 3 ? "clean" : "CONTENDED");
  std::printf("# per-iter wall s (* = disturbed by other processes, excluded):%s\n", log.c_str());
  if (a.peak) {
    double peak = sgemm_peak_gflops();
    std::printf("PEAK,threads=%d,sgemm_gflops=%.1f,step_gflops=%.1f,fraction=%.3f\n", threads, peak,
                gflop / med, gflop / med / peak);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_train_step: error: %s\n", e.what());
  return 1;
}

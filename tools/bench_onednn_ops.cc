// Per-op benchmark of a backend on ResNet layer shapes: median milliseconds of forward and
// backward per op over repeats (conv, BN with and without ReLU, add+ReLU, max pool, accumulate).
//   bench_onednn_ops [--backend onednn] [--threads N] [--reps 7] [--filter SUBSTRING] [--clock wall|cpu]
//                    [--compare BACKEND_A,BACKEND_B]
// --clock cpu times process CPU seconds instead of wall time (meaningful with --threads 1 on a
// machine shared with other work). --compare times the 3x3 stride-1 convolutions of resnet18
// (batch 64) and resnet50 (batch 32) at 224 on two backends, alternating A and B call by call
// so that both see the same machine load: forward, backward data (full backward minus backward
// without dx) and backward weights, median and range, and B's speed-up.
#include <omp.h>

#include <algorithm>
#include <ctime>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "nn/clock.h"
#include "nn/ops.h"
#include "tools/cli_args.h"

namespace {

constexpr const char* kUsage =
    "usage: bench_onednn_ops [--backend onednn] [--threads N] [--reps 7] [--filter SUBSTRING] [--clock wall|cpu]\n"
    "                        [--compare BACKEND_A,BACKEND_B]\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_onednn_ops: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

using rt::Shape;
using Vec = std::vector<float>;

using rt::now_s;

// CPU seconds of this process: on a machine shared with other work, a single-threaded run's CPU
// time does not include the time it spent descheduled.
double cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
bool g_cpu_clock = false;

double median_ms(const std::function<void()>& f, int reps) {
  f();  // warm-up: first-touch of buffers, JIT
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    double t0 = g_cpu_clock ? cpu_s() : now_s();
    f();
    t.push_back(1e3 * ((g_cpu_clock ? cpu_s() : now_s()) - t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Vec rand_vec(size_t n, float lo = -1.f, float hi = 1.f) {
  static std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(lo, hi);
  Vec v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

struct Row {
  std::string name;
  std::function<void(rt::Backend<float>&, int)> run;
};

void report(const std::string& name, double fwd, double bwd) {
  std::printf("%-44s fwd %8.2f ms  bwd %8.2f ms  total %8.2f ms\n", name.c_str(), fwd, bwd, fwd + bwd);
  std::fflush(stdout);
}

Row conv_row(Shape in, int64_t oc, int64_t k, int64_t s, int64_t p) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "conv %lldx%lld/%lld %lld->%lld @%lldx%lld n%lld", (long long)k, (long long)k,
                (long long)s, (long long)in.c, (long long)oc, (long long)in.h, (long long)in.w, (long long)in.n);
  return {buf, [=](rt::Backend<float>& be, int reps) {
            rt::ConvDesc d{.name = "conv", .in = in, .out_c = oc, .kernel_h = k, .kernel_w = k,
                           .stride_h = s, .stride_w = s, .pad_h = p, .pad_w = p};
            auto op = be.make_conv(d);
            Vec x = rand_vec(be.act_size(in)), w = rand_vec(size_t(d.weight_count())),
                y(be.act_size(d.out())), dy = rand_vec(be.act_size(d.out())), dx(x.size()), dw(w.size());
            double f = median_ms([&] { op->forward(x.data(), w.data(), nullptr, y.data()); }, reps);
            float* dxp = in.c == 3 ? nullptr : dx.data();
            double b = median_ms(
                [&] { op->backward(x.data(), w.data(), dy.data(), dxp, dw.data(), nullptr); }, reps);
            report(buf, f, b);
          }};
}

Row bn_row(Shape in, bool relu) {
  std::string name = "bn" + std::string(relu ? "+relu " : " ") + std::to_string(in.c) + " @" +
                     std::to_string(in.h) + " n" + std::to_string(in.n);
  return {name, [=](rt::Backend<float>& be, int reps) {
            auto op = be.make_batchnorm({.name = "bn", .in = in, .relu = relu});
            const size_t n = be.act_size(in), c = size_t(in.c);
            Vec x = rand_vec(n), y(n), dy = rand_vec(n), dx(n), g = rand_vec(c, 0.5f, 1.5f),
                b = rand_vec(c), rm(c), rv(c, 1.f), dg(c), db(c);
            double f = median_ms(
                [&] { op->forward_train(x.data(), g.data(), b.data(), y.data(), rm.data(), rv.data()); }, reps);
            double bw = median_ms(
                [&] { op->backward(x.data(), g.data(), y.data(), dy.data(), dx.data(), dg.data(), db.data()); },
                reps);
            report(name, f, bw);
          }};
}

Row add_row(Shape in) {
  std::string name = "add+relu " + std::to_string(in.c) + " @" + std::to_string(in.h) + " n" + std::to_string(in.n);
  return {name, [=](rt::Backend<float>& be, int reps) {
            auto op = be.make_add({.name = "add", .in = in, .relu = true});
            const size_t n = be.act_size(in);
            Vec a = rand_vec(n), b = rand_vec(n), y(n), dy = rand_vec(n), dx(n);
            double f = median_ms([&] { op->forward(a.data(), b.data(), y.data()); }, reps);
            double bw = median_ms([&] { op->backward(y.data(), dy.data(), dx.data()); }, reps);
            report(name, f, bw);
          }};
}

Row pool_row(Shape in) {
  std::string name = "maxpool 3x3/2 " + std::to_string(in.c) + " @" + std::to_string(in.h);
  return {name, [=](rt::Backend<float>& be, int reps) {
            rt::MaxPoolDesc d{.name = "pool", .in = in};
            auto op = be.make_maxpool(d);
            Vec x = rand_vec(be.act_size(in)), y(be.act_size(d.out())), dy = rand_vec(y.size()), dx(x.size());
            double f = median_ms([&] { op->forward(x.data(), y.data(), true); }, reps);
            double bw = median_ms([&] { op->backward(x.data(), y.data(), dy.data(), dx.data()); }, reps);
            report(name, f, bw);
          }};
}

Row accumulate_row(Shape in) {
  std::string name = "accumulate " + std::to_string(in.c) + " @" + std::to_string(in.h);
  return {name, [=](rt::Backend<float>& be, int reps) {
            const size_t n = be.act_size(in);
            Vec a = rand_vec(n), b = rand_vec(n);
            double f = median_ms([&] { be.accumulate(a.data(), b.data(), n); }, reps);
            report(name, f, 0);
          }};
}

// Median, min and max of samples.
struct Stats {
  double med, lo, hi;
};
Stats stats(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), t.back()};
}

void compare_conv(rt::Backend<float>& a, rt::Backend<float>& b, rt::Shape in, int reps) {
  rt::ConvDesc d{.name = "conv", .in = in, .out_c = in.c, .kernel_h = 3, .kernel_w = 3, .stride_h = 1,
                 .stride_w = 1, .pad_h = 1, .pad_w = 1};
  std::unique_ptr<rt::ConvOp<float>> ops[2] = {a.make_conv(d), b.make_conv(d)};
  Vec x = rand_vec(a.act_size(in)), w = rand_vec(size_t(d.weight_count()), -0.05f, 0.05f),
      y(x.size()), dy = rand_vec(x.size()), dx(x.size()), dw(w.size());
  // Samples per backend: forward, full backward, backward without dx.
  std::vector<double> t[2][3];
  auto clock = [] { return g_cpu_clock ? cpu_s() : now_s(); };
  for (int r = -1; r < reps; ++r)
    for (int i = 0; i < 2; ++i) {
      double t0 = clock();
      ops[i]->forward(x.data(), w.data(), nullptr, y.data());
      double t1 = clock();
      ops[i]->backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr);
      double t2 = clock();
      ops[i]->backward(x.data(), w.data(), dy.data(), nullptr, dw.data(), nullptr);
      double t3 = clock();
      if (r < 0) continue;  // warm-up
      t[i][0].push_back(1e3 * (t1 - t0));
      t[i][1].push_back(1e3 * (t2 - t1 - (t3 - t2)));
      t[i][2].push_back(1e3 * (t3 - t2));
    }
  std::printf("conv3x3 %4lld @%3lld n%-3lld", (long long)in.c, (long long)in.h, (long long)in.n);
  const char* part[3] = {"fwd", "bwd-d", "bwd-w"};
  double sum[2] = {0, 0};
  for (int k = 0; k < 3; ++k) {
    Stats sa = stats(t[0][k]), sb = stats(t[1][k]);
    sum[0] += sa.med, sum[1] += sb.med;
    std::printf(" | %s %7.1f [%5.1f-%5.1f] %7.1f [%5.1f-%5.1f] x%.2f", part[k], sa.med, sa.lo, sa.hi, sb.med,
                sb.lo, sb.hi, sa.med / sb.med);
  }
  std::printf(" | total %7.1f %7.1f x%.2f\n", sum[0], sum[1], sum[0] / sum[1]);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  std::string backend = "onednn", filter, compare;
  int reps = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (k != "--backend" && k != "--threads" && k != "--reps" && k != "--filter" && k != "--clock" &&
        k != "--compare")
      usage("unknown flag " + k);
    if (i + 1 >= argc) usage("missing value for " + k);
    const std::string v = argv[++i];
    const auto integer = [&](long long lo, long long hi) {
      const auto x = rt::tools::parse_int(v, lo, hi);
      if (!x)
        usage(k + " takes an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not '" + v + "'");
      return int(*x);
    };
    if (k == "--backend") backend = v;
    else if (k == "--threads") omp_set_num_threads(integer(1, 1024));
    else if (k == "--reps") reps = integer(1, 1000000);
    else if (k == "--filter") filter = v;
    else if (k == "--clock") {
      if (v != "wall" && v != "cpu") usage("--clock must be wall or cpu, not '" + v + "'");
      g_cpu_clock = v == "cpu";
    }
    else {
      const size_t comma = v.find(',');
      if (comma == std::string::npos || comma == 0 || comma + 1 == v.size())
        usage("--compare takes two backends, A,B, not '" + v + "'");
      compare = v;
    }
  }
  const int64_t n = 32;
  std::vector<Row> rows = {
      conv_row({n, 3, 224, 224}, 64, 7, 2, 3),
      conv_row({n, 64, 56, 56}, 64, 3, 1, 1),
      conv_row({n, 64, 56, 56}, 256, 1, 1, 0),
      conv_row({n, 256, 56, 56}, 64, 1, 1, 0),
      conv_row({n, 256, 56, 56}, 512, 1, 2, 0),
      conv_row({n, 256, 14, 14}, 256, 3, 1, 1),
      conv_row({128, 16, 32, 32}, 16, 3, 1, 1),
      bn_row({n, 64, 112, 112}, true),
      bn_row({n, 64, 56, 56}, true),
      bn_row({n, 256, 56, 56}, false),
      bn_row({n, 128, 28, 28}, true),
      bn_row({n, 512, 28, 28}, false),
      bn_row({n, 1024, 14, 14}, false),
      bn_row({128, 16, 32, 32}, true),
      add_row({n, 256, 56, 56}),
      add_row({128, 16, 32, 32}),
      pool_row({n, 64, 112, 112}),
      accumulate_row({n, 256, 56, 56}),
  };
  if (!compare.empty()) {
    const size_t comma = compare.find(',');
    auto a = rt::make_backend<float>(compare.substr(0, comma)),
         b = rt::make_backend<float>(compare.substr(comma + 1));
    std::printf("# %s vs %s, %d threads, %d alternating reps, %s clock: ms median [min-max]\n",
                a->name().c_str(), b->name().c_str(), omp_get_max_threads(), reps,
                g_cpu_clock ? "cpu" : "wall");
    for (int64_t batch : {64, 32})
      for (auto [c, hw] : {std::pair<int64_t, int64_t>{64, 56}, {128, 28}, {256, 14}, {512, 7}}) {
        const std::string name = "conv3x3 " + std::to_string(c) + " @" + std::to_string(hw) + " n" +
                                 std::to_string(batch);
        if (filter.empty() || name.find(filter) != std::string::npos) compare_conv(*a, *b, {batch, c, hw, hw}, reps);
      }
    return 0;
  }
  auto be = rt::make_backend<float>(backend);
  std::printf("# backend %s, %d threads, median of %d, %s clock\n", backend.c_str(), omp_get_max_threads(),
              reps, g_cpu_clock ? "cpu" : "wall");
  for (auto& r : rows)
    if (filter.empty() || r.name.find(filter) != std::string::npos) r.run(*be, reps);
  return 0;
} catch (const std::exception& e) {  // an unknown backend, an op the backend refuses
  std::fprintf(stderr, "bench_onednn_ops: error: %s\n", e.what());
  return 1;
}

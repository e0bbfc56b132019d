// Overlap benchmark (run under mpirun): how much of the gradient allreduce a real ResNet's backward
// hides. Measures backward alone and the allreduce of the whole gradient buffer alone, then runs
// training steps (forward, backward reporting ready gradients to GradientReducer, wait) with
// overlap off and on, taking turns step by step, and prints per-step compute, exposed and total
// communication (median, min-max over steps) and exposed / total.
//
// Usage: mpirun -np N build/bin/bench_overlap [--model resnet18] [--batch 8] [--size 64]
//          [--threads 1] [--algorithm ring] [--bucket-mib 4] [--segment-kib 512]
//          [--idle-sleep-us 0] [--overlap-sleep-us 50[,0,...]] [--steps 10] [--warmup 2]
//          [--transport shm] [--emulate-ms 0]
// --idle-sleep-us is CommConfig::idle_sleep_us (the allreduce alone and the overlap-off row),
// --overlap-sleep-us CommConfig::overlap_idle_sleep_us (the communication thread's waits); several
// values add one "overlap on" row each, and all rows take turns every step.
// --emulate-ms T > 0 replaces backward in the timed steps by T ms of waiting that hands the gradient
// buffer (computed once by a real backward) to the reducer in 64 equal parts at an even pace: a
// backward that runs elsewhere (a GPU) and leaves the cores to communication, with T chosen to
// match the allreduce alone; `--emulate-ms auto` takes the median of five allreduces of the whole
// buffer (with sleeping waits), measured first.
// --transport only labels the output: the transport is chosen by mpirun's flags (shared memory by
// default; TCP loopback with --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo).
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/agreement.h"
#include "comm/allreduce.h"
#include "comm/communicator.h"
#include "comm/gradient_reducer.h"
#include "comm/mpi_check.h"
#include "nn/clock.h"
#include "nn/resnet.h"
#include "tools/cli_args.h"

namespace rt::comm {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "resnet18", algorithm = "ring", transport = "shm";
  int64_t batch = 8, size = 64;
  int threads = 1, steps = 10, warmup = 2;
  int idle_sleep_us = CommConfig{}.idle_sleep_us;
  std::vector<int> overlap_sleep_us = {CommConfig{}.overlap_idle_sleep_us};
  double bucket_mib = 4, segment_kib = 512;
  double emulate_ms = 0;
};

constexpr const char* kUsage =
    "usage: mpirun -np N bench_overlap [--model resnet18] [--batch 8] [--size 64] [--threads 1] [--algorithm ring]\n"
    "         [--bucket-mib 4] [--segment-kib 512] [--idle-sleep-us 0] [--overlap-sleep-us 50[,0,...]]\n"
    "         [--steps 10] [--warmup 2] [--transport shm] [--emulate-ms 0|T|auto]\n"
    "Backward alone, the gradient allreduce alone, then training steps with overlap off and on, taking\n"
    "turns: per-step compute, exposed and total communication (median, min-max) and exposed / total.\n"
    "--emulate-ms T (or auto: the allreduce's own time) waits T ms in place of backward, handing the\n"
    "gradients over at an even pace, as a GPU's backward would leave the cores to communication.\n";

using rt::tools::int_option, rt::tools::real_option;

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank == 0) std::printf("%s", kUsage);
      MPI_Finalize();
      std::exit(0);
    }
    if (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0) throw Error("option " + k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--model") a.model = v;
    else if (k == "--batch") a.batch = int_option(k, v, 1, 1 << 20);
    else if (k == "--size") a.size = int_option(k, v, 1, 1 << 14);
    else if (k == "--threads") a.threads = int(int_option(k, v, 1, 1024));
    else if (k == "--algorithm") a.algorithm = v;
    else if (k == "--bucket-mib") a.bucket_mib = real_option(k, v, 0.001, 1e6);
    else if (k == "--segment-kib") a.segment_kib = real_option(k, v, 0.001, 1e6);
    else if (k == "--idle-sleep-us") a.idle_sleep_us = int(int_option(k, v, 0, 1000000));
    else if (k == "--overlap-sleep-us") {
      a.overlap_sleep_us.clear();
      for (size_t p = 0; p <= v.size();) {
        const size_t e = std::min(v.find(',', p), v.size());
        a.overlap_sleep_us.push_back(int(int_option(k, v.substr(p, e - p), 0, 1000000)));
        p = e + 1;
      }
    }
    else if (k == "--steps") a.steps = int(int_option(k, v, 1, 1000000));
    else if (k == "--warmup") a.warmup = int(int_option(k, v, 0, 1000000));
    else if (k == "--transport") a.transport = v;
    else if (k == "--emulate-ms") a.emulate_ms = v == "auto" ? -1 : real_option(k, v, 0, 1e7);
    else throw Error("unknown option " + k + " (--help lists them)");
  }
  return a;
}

struct Stat {
  double med = 0, lo = 0, hi = 0;
};
Stat stat(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}
// Per step, the slowest rank's value (a step is as slow as its slowest rank).
std::vector<double> max_over_ranks(Communicator& comm, const std::vector<double>& mine) {
  std::vector<double> out(mine.size());
  MPI_CHECK(MPI_Allreduce(mine.data(), out.data(), int(mine.size()), MPI_DOUBLE, MPI_MAX, comm.mpi()));
  return out;
}
uint64_t hash_bytes(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  return h;
}

int run(int argc, char** argv) {
  Args a = parse(argc, argv);
  Communicator comm;
  const int rank = comm.rank(), n = comm.size();
  omp_set_num_threads(a.threads);

  ResNetConfig rc;
  rc.name = a.model;
  rc.batch = a.batch;
  rc.image_size = a.size;
  const bool cifar = a.model == "resnet20" || a.model == "resnet32" || a.model == "resnet44" ||
                     a.model == "resnet56" || a.model == "resnet110";
  rc.num_classes = cifar ? 10 : 1000;
  auto net = build_resnet<float>(rc, make_backend<float>("onednn"));
  Arena<float>& arena = net->arena();
  broadcast_model(comm, arena);
  std::span<float> g = arena.grads();
  const double grad_mib = double(g.size()) * 4 / (1 << 20);

  // Each rank its own synthetic batch (data parallelism: same model, different data).
  std::mt19937_64 rng(100 + rank);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(net->shape(0).numel()));
  for (float& v : x) v = nd(rng);
  std::vector<int32_t> y(size_t(a.batch));
  for (int32_t& v : y) v = int32_t(rng() % uint64_t(rc.num_classes));

  CommConfig base;
  base.algorithm = a.algorithm;
  base.bucket_bytes = size_t(a.bucket_mib * (1 << 20));
  base.segment_bytes = size_t(a.segment_kib * 1024);
  base.idle_sleep_us = a.idle_sleep_us;
  if (rank == 0) {
    std::printf("# bench_overlap np=%d model=%s batch=%lld size=%lld threads=%d algorithm=%s "
                "bucket=%.2f MiB segment=%.0f KiB idle_sleep_us=%d transport=%s\n",
                n, a.model.c_str(), (long long)a.batch, (long long)a.size, a.threads,
                a.algorithm.c_str(), a.bucket_mib, a.segment_kib, a.idle_sleep_us,
                a.transport.c_str());
    std::printf("# gradients: %zu floats = %.1f MiB\n", g.size(), grad_mib);
    std::fflush(stdout);
  }

  // Backward alone (no communication) and the allreduce of the whole buffer alone (with MPI_Wait
  // and with sleeping waits), measured in the same rotation as the training steps below.
  std::vector<double> fwd, bwd, ar_whole, ar_sleep;
  auto whole = make_allreducer(base, comm);
  CommConfig sleeping = base;  // the waits of the overlapping thread (first --overlap-sleep-us)
  sleeping.idle_sleep_us = a.overlap_sleep_us[0];
  auto whole_sleep = make_allreducer(sleeping, comm);
  std::vector<float> scratch(g.size());
  // With --emulate-ms: the gradients of one real backward, restored before every emulated step
  // (the allreduce averages them in place), and the emulated backward itself.
  std::vector<float> g0;
  if (a.emulate_ms != 0) {
    net->forward(x.data(), y.data(), true);
    net->backward();
    g0.assign(g.begin(), g.end());
  }
  if (a.emulate_ms < 0) {  // auto: as long as the allreduce alone
    std::vector<double> t;
    for (int i = 0; i < 6; ++i) {
      std::copy(g0.begin(), g0.end(), scratch.begin());
      comm.barrier();
      const double t0 = now_s();
      whole_sleep->allreduce(std::span<float>(scratch), ReduceOp::average);
      if (i > 0) t.push_back(now_s() - t0);
    }
    a.emulate_ms = 1e3 * stat(max_over_ranks(comm, t)).med;
  }
  auto emulated_backward = [&](const std::function<void(size_t)>& on_ready) {
    constexpr int kParts = 64;
    const auto t0 = Clock::now();
    for (int k = 1; k <= kParts; ++k) {
      std::this_thread::sleep_until(t0 + std::chrono::duration<double, std::milli>(a.emulate_ms * k / kParts));
      if (on_ready) on_ready(g.size() * size_t(k) / kParts);
    }
  };
  auto alone_step = [&](bool keep) {
    comm.barrier();
    const double t0 = now_s();
    if (a.emulate_ms <= 0) net->forward(x.data(), y.data(), true);
    const double t1 = now_s();
    if (a.emulate_ms > 0) emulated_backward({});
    else net->backward();
    const double t2 = now_s();
    std::copy_n(g0.empty() ? g.data() : g0.data(), g.size(), scratch.begin());
    comm.barrier();
    const double t3 = now_s();
    whole->allreduce(std::span<float>(scratch), ReduceOp::average);
    const double t4 = now_s();
    std::copy_n(g0.empty() ? g.data() : g0.data(), g.size(), scratch.begin());
    comm.barrier();
    const double t5 = now_s();
    whole_sleep->allreduce(std::span<float>(scratch), ReduceOp::average);
    const double t6 = now_s();
    if (keep) {
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      ar_whole.push_back(t4 - t3);
      ar_sleep.push_back(t6 - t5);
    }
  };

  // Training steps, overlap off and on, and the measurements alone, taking turns step by step
  // (a drifting machine load hits them alike).
  struct Mode {
    std::string name;
    std::unique_ptr<GradientReducer> gr;
    std::vector<double> compute, exposed, total, step;
    std::vector<double> before;  // buckets done before wait
    uint64_t hash = 0;
  };
  std::vector<Mode> modes(1 + a.overlap_sleep_us.size());
  for (size_t m = 0; m < modes.size(); ++m) {
    CommConfig cfg = base;
    cfg.overlap = m > 0;
    if (m > 0) cfg.overlap_idle_sleep_us = a.overlap_sleep_us[m - 1];
    modes[m].name = m == 0 ? std::string("off")
                           : str_cat("on, thread waits ", cfg.overlap_idle_sleep_us > 0
                                                               ? str_cat("sleep ", cfg.overlap_idle_sleep_us, " us")
                                                               : std::string("MPI_Wait"));
    modes[m].gr = std::make_unique<GradientReducer>(comm, cfg, g, model_fingerprint(arena));
  }
  const size_t nm = modes.size();
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    for (size_t m = 0; m <= nm; ++m) {
      const size_t which = (m + size_t(s)) % (nm + 1);  // rotate which goes first
      if (which == nm) {
        alone_step(s >= a.warmup);
        continue;
      }
      Mode& md = modes[which];
      if (!g0.empty()) std::copy(g0.begin(), g0.end(), g.begin());
      comm.barrier();
      const double t0 = now_s();
      if (a.emulate_ms <= 0) net->forward(x.data(), y.data(), true);
      md.gr->begin_step();
      if (a.emulate_ms > 0) emulated_backward(md.gr->ready_callback());
      else net->backward(md.gr->ready_callback());
      md.gr->wait();
      const double t1 = now_s();
      const StepTimes& st = md.gr->last_step();
      md.hash = hash_bytes(g.data(), g.size() * 4);
      if (s < a.warmup) continue;
      md.compute.push_back(st.compute_s);
      md.exposed.push_back(st.exposed_comm_s);
      md.total.push_back(st.total_comm_s);
      md.step.push_back(t1 - t0);
      md.before.push_back(double(st.buckets_done_before_wait));
    }
  }
  const Stat sf = stat(max_over_ranks(comm, fwd)), sb = stat(max_over_ranks(comm, bwd)),
             sa = stat(max_over_ranks(comm, ar_whole)), ss = stat(max_over_ranks(comm, ar_sleep));
  if (rank == 0) {
    std::printf("forward alone        %8.1f ms (%.1f-%.1f)\n", sf.med * 1e3, sf.lo * 1e3, sf.hi * 1e3);
    if (a.emulate_ms > 0) std::printf("(forward skipped, backward emulated: %.1f ms of waiting)\n", a.emulate_ms);
    std::printf("backward alone       %8.1f ms (%.1f-%.1f)\n", sb.med * 1e3, sb.lo * 1e3, sb.hi * 1e3);
    std::printf("allreduce alone      %8.1f ms (%.1f-%.1f)  whole %.1f MiB buffer, %s: "
                "comm / backward = %.2f\n", sa.med * 1e3, sa.lo * 1e3, sa.hi * 1e3, grad_mib,
                a.algorithm.c_str(), sa.med / sb.med);
    std::printf("  with sleeping waits %8.1f ms (%.1f-%.1f)  idle_sleep_us %d: comm / backward = %.2f\n",
                ss.med * 1e3, ss.lo * 1e3, ss.hi * 1e3, sleeping.idle_sleep_us, ss.med / sb.med);
    std::fflush(stdout);
  }

  // The same batch and parameters every step: overlap must not change a single bit.
  int identical = 1;
  for (const Mode& md : modes) identical &= md.hash == modes[0].hash;
  int all_identical = 0;
  MPI_CHECK(MPI_Allreduce(&identical, &all_identical, 1, MPI_INT, MPI_MIN, comm.mpi()));

  if (rank == 0)
    std::printf("\n| overlap | step (fwd+bwd+exposed) ms | compute (bwd) ms | exposed comm ms | "
                "total comm ms | exposed / total | buckets done before wait |\n"
                "|---|---:|---:|---:|---:|---:|---:|\n");
  bool over_total = false;
  for (Mode& md : modes) {
    // Per-rank fractions, then the worst rank's per step.
    std::vector<double> frac(md.exposed.size());
    for (size_t i = 0; i < frac.size(); ++i) frac[i] = md.total[i] > 0 ? md.exposed[i] / md.total[i] : 0;
    const Stat st = stat(max_over_ranks(comm, md.step)), sc = stat(max_over_ranks(comm, md.compute)),
               se = stat(max_over_ranks(comm, md.exposed)), stt = stat(max_over_ranks(comm, md.total)),
               sfr = stat(max_over_ranks(comm, frac)), sbe = stat(md.before);
    if (rank == 0)
      std::printf("| %s | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) "
                  "| %.0f%% (%.0f-%.0f%%) | %.0f of %zu |\n", md.name.c_str(), st.med * 1e3, st.lo * 1e3,
                  st.hi * 1e3, sc.med * 1e3, sc.lo * 1e3, sc.hi * 1e3, se.med * 1e3, se.lo * 1e3,
                  se.hi * 1e3, stt.med * 1e3, stt.lo * 1e3, stt.hi * 1e3, sfr.med * 100,
                  sfr.lo * 100, sfr.hi * 100, sbe.med, md.gr->num_buckets());
    over_total |= sfr.hi >= 1.005;  // prints as 101 % or more
  }
  if (rank == 0) {
    std::printf("\n(times: the slowest rank per step; median (min-max) over %d steps)\n", a.steps);
    if (over_total)
      std::printf("(exposed / total above 100%%: the wait also covers the communication thread's wake-up and "
                  "hand-over, which no allreduce time includes; with tiny buckets it can outweigh them)\n");
    std::printf("overlapped gradients bitwise equal to sequential ones on every rank: %s\n",
                all_identical ? "yes" : "NO");
  }
  return all_identical ? 0 : 1;
}

}  // namespace
}  // namespace rt::comm

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  const int rc = rt::comm::comm_run_or_abort([&] { return rt::comm::run(argc, argv); });
  MPI_Finalize();
  return rc;
}

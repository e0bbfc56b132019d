// Allreduce benchmark in the style of nccl-tests: for each algorithm and size, check the result,
// then time it (median over iterations after warm-up, slowest rank per iteration) and print time,
// algbw = bytes/time and busbw = algbw·2(N-1)/N, as CSV RESULT lines in the format of
// /work/shared/peers/mpi_allreduce.c so both tables can be read side by side.
//
// Usage: mpirun -np N build/bin/allreduce_bench [--algos ring,mpi,reducer] [--min-bytes 4096]
//          [--max-bytes 268435456] [--factor 4] [--budget 2] [--min-reps 5] [--max-reps 1000]
//          [--segment-bytes 524288] [--recv-depth 4] [--idle-sleep-us 0] [--sizes B1,B2,...]
//          [--interleave 1] [--ranks-per-node K]
//
// An algorithm may carry its own segment size, receive depth and waiting policy, "ring@128K^8~20"
// (segment 128 KiB, recv_depth 8, idle_sleep_us 20) or "ring/rank" (comm.ring_order rank: MPI's
// order around the ring instead of node by node), so that variants run side by side;
// "openmpi" is MPI_Allreduce out of place, exactly as the peer benchmark calls it. A suffix
// ":bf16" or ":fp16" times gradient compression as GradientReducer does it: the fp32 buffer
// converted to the 16-bit type, allreduced as such, converted back (the timing includes both
// conversions; the check's sums are small integers, exact in both types). With
// --interleave 1 the algorithms take turns iteration by iteration (rather than size by size), so a
// machine load that drifts during the run affects them alike: use it to compare alternatives.
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "comm/allreduce.h"
#include "comm/communicator.h"
#include "comm/mpi_check.h"
#include "tools/cli_args.h"

namespace rt::comm {
namespace {

struct Options {
  std::vector<std::string> algos = {"ring", "mpi", "reducer"};
  std::vector<size_t> sizes;
  size_t min_bytes = 4096, max_bytes = size_t(256) << 20, factor = 4;
  double budget = 2.0;  // seconds of timed iterations per size (at least min_reps)
  int min_reps = 5, max_reps = 1000;
  size_t segment_bytes = CommConfig{}.segment_bytes;
  int recv_depth = CommConfig{}.recv_depth;
  bool segment_set = false;  // --segment-bytes given: also across nodes
  int idle_sleep_us = CommConfig{}.idle_sleep_us;
  int ranks_per_node = 0;  // hierarchical: comm.ranks_per_node (0: the ranks sharing memory)
  bool interleave = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

size_t parse_bytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  const std::string unit = end;
  if (unit == "K" || unit == "k") v *= 1024;
  else if (unit == "M" || unit == "m") v *= 1024 * 1024;
  else if (unit == "G" || unit == "g") v *= 1024.0 * 1024 * 1024;
  else if (!unit.empty()) v = -1;
  // Whole bytes from 1 to 64 GiB: a negative or astronomic size is a typo, not a buffer to allocate.
  if (end == s.c_str() || !(v >= 1 && v <= 68719476736.0) || v != std::floor(v))
    throw Error("bad byte size '" + s + "' (use e.g. 4096, 64K, 16M; 1 byte to 64G)");
  return static_cast<size_t>(v);
}

// A segment size, bounded as the trainer bounds comm.segment_bytes: a float at least.
size_t segment_size(const std::string& what, const std::string& s) {
  const size_t b = parse_bytes(s);
  if (b < 4) throw Error(str_cat(what, " '", s, "' must be >= 4 bytes (one float), as comm.segment_bytes"));
  return b;
}

// A buffer size: whole 4-byte floats (a size of 3 measured 0 bytes and called it OK).
size_t whole_floats(const std::string& s) {
  const size_t b = parse_bytes(s);
  if (b % 4) throw Error(str_cat("byte size '", s, "' is not a whole number of 4-byte floats (", b, " bytes)"));
  return b;
}

constexpr const char* kUsage =
    "usage: mpirun -np N allreduce_bench [--algos ring,mpi,reducer] [--min-bytes 4096] [--max-bytes 268435456] "
    "[--factor 4] [--budget 2] [--min-reps 5] [--max-reps 1000] [--segment-bytes 524288] [--recv-depth 4] "
    "[--idle-sleep-us 0] [--sizes B1,B2,...] [--interleave 1] [--ranks-per-node K]\n"
    "--algos: ring, ring_pipelined, hierarchical, mpi, reducer, or openmpi (MPI_Allreduce as the peer calls\n"
    "  it); all but openmpi may carry, in this order, /rank (MPI's ring order), @SEGMENT (bytes), ^RECV_DEPTH,\n"
    "  ~IDLE_SLEEP_US and :bf16 or :fp16 (a 16-bit wire), e.g. ring@128K^8~20, ring/rank, ring:bf16\n"
    "--ranks-per-node K: what a node is for hierarchical (comm.ranks_per_node; default: the ranks sharing\n"
    "  memory), e.g. to time two-level rings on one machine or over an uneven placement\n";

using rt::tools::int_option;

// Options, or nothing for --help (usage printed by rank 0).
std::optional<Options> parse(int argc, char** argv) {
  Options o;
  static const char* const known[] = {"--algos", "--sizes", "--min-bytes", "--max-bytes", "--factor", "--budget",
                                      "--min-reps", "--max-reps", "--segment-bytes", "--idle-sleep-us",
                                      "--recv-depth", "--interleave", "--ranks-per-node"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return std::nullopt;
    if (std::find(std::begin(known), std::end(known), a) == std::end(known)) throw Error("unknown option " + a);
    if (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0) throw Error("option " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--algos") {
      o.algos = split(v);
      if (o.algos.size() != size_t(std::count(v.begin(), v.end(), ',')) + 1)  // split drops empty names
        throw Error("option --algos lists an empty name ('" + v + "'): e.g. --algos ring,mpi");
    }
    else if (a == "--sizes") for (const std::string& s : split(v)) o.sizes.push_back(whole_floats(s));
    else if (a == "--min-bytes") o.min_bytes = whole_floats(v);
    else if (a == "--max-bytes") o.max_bytes = whole_floats(v);
    else if (a == "--factor") o.factor = size_t(int_option(a, v, 2, 1 << 20));
    else if (a == "--budget") {
      const auto b = rt::tools::parse_real(v, 0, 1e6);
      if (!b) throw Error("option --budget takes seconds >= 0, not '" + v + "'");
      o.budget = *b;
    }
    else if (a == "--min-reps") o.min_reps = int_option(a, v, 1, 1 << 30);
    else if (a == "--max-reps") o.max_reps = int_option(a, v, 1, 1 << 30);
    else if (a == "--segment-bytes") o.segment_bytes = segment_size(a, v), o.segment_set = true;
    else if (a == "--idle-sleep-us") o.idle_sleep_us = int_option(a, v, 0, 1000000);
    else if (a == "--recv-depth") o.recv_depth = int_option(a, v, 2, 64);  // the ring's own bounds
    else if (a == "--ranks-per-node") o.ranks_per_node = int_option(a, v, 1, 1 << 20);
    else o.interleave = int_option(a, v, 0, 1) != 0;
  }
  if (o.ranks_per_node > 0 && std::none_of(o.algos.begin(), o.algos.end(), [](const std::string& x) {
        return x.rfind("hierarchical", 0) == 0;
      }))
    throw Error("option --ranks-per-node applies to hierarchical only (as comm.ranks_per_node): add it to --algos");
  if (o.min_bytes < 1 || o.max_bytes < o.min_bytes)
    throw Error(str_cat("need 1 <= --min-bytes <= --max-bytes (got ", o.min_bytes, " and ", o.max_bytes, ")"));
  if (o.sizes.empty())
    for (size_t b = o.min_bytes; b <= o.max_bytes; b *= std::max<size_t>(2, o.factor)) o.sizes.push_back(b);
  if (o.min_reps < 1 || o.max_reps < o.min_reps)
    throw Error(str_cat("need 1 <= --min-reps <= --max-reps (got ", o.min_reps, " and ", o.max_reps, ")"));
  return o;
}

// CPU-seconds used by the whole machine and by this process (to flag disturbed measurements the
// way the peer benchmarks do: foreign = machine busy time minus all ranks' own time).
double machine_busy() {
  unsigned long long u = 0, n = 0, s = 0;
  FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return 0;
  const int got = std::fscanf(f, "cpu %llu %llu %llu", &u, &n, &s);
  std::fclose(f);
  return got == 3 ? double(u + n + s) / double(sysconf(_SC_CLK_TCK)) : 0;
}
double own_cpu() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * double(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
}

// Rank r contributes (r+1)(1 + i%3): the sum n(n+1)/2 (1 + i%3) is exact in fp32.
void fill(std::vector<float>& v, int rank) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(rank + 1) * float(1 + i % 3);
}
long count_wrong(const std::vector<float>& v, int n) {
  const float base = float(n * (n + 1) / 2);
  long bad = 0;
  for (size_t i = 0; i < v.size(); ++i) bad += v[i] != base * float(1 + i % 3);
  return bad;
}

// One column of the table: one of our algorithms (possibly with its own segment size), or the
// peer's call, MPI_Allreduce out of place.
struct Candidate {
  std::string label;
  std::unique_ptr<Allreducer> ar;  // null: "openmpi"
  DType wire = DType::f32;         // bf16/f16: compressed (label suffix ":bf16" / ":fp16")
  std::vector<uint16_t> wire_buf;
};

// Buffers of one size: src holds the rank's contribution; ours reduce buf in place (restored from
// src before every call, outside the timing), "openmpi" reduces src into buf.
struct Buffers {
  std::vector<float> src, buf;
};

void run_once(Candidate& c, Buffers& b, bool restore) {
  if (!c.ar) {
    MPI_CHECK(MPI_Allreduce(b.src.data(), b.buf.data(), int(b.src.size()), MPI_FLOAT, MPI_SUM,
                            MPI_COMM_WORLD));
    return;
  }
  if (restore) std::copy(b.src.begin(), b.src.end(), b.buf.begin());
  if (c.wire == DType::f32) {
    c.ar->allreduce(b.buf, ReduceOp::sum);
    return;
  }
  c.wire_buf.resize(b.buf.size());
  compressed_allreduce(*c.ar, cpu_reduce_kernels(), c.wire, c.wire_buf.data(), b.buf.data(),
                       b.buf.size(), 1.0f);
}

// Measures the candidates at one size. More than one candidate: they take turns every iteration,
// and the budget is per candidate.
void bench_size(Communicator& comm, std::vector<Candidate*> cands, const Options& o, size_t bytes) {
  const int rank = comm.rank(), n = comm.size();
  const size_t count = bytes / 4, nc = cands.size();
  Buffers b{std::vector<float>(count), std::vector<float>(count)};
  fill(b.src, rank);
  const int warm = bytes <= (size_t(1) << 20) ? 10 : 1;
  std::vector<long> bad(nc, 0);
  for (size_t c = 0; c < nc; ++c) {
    for (int w = 0; w < warm; ++w) run_once(*cands[c], b, true);
    bad[c] += count_wrong(b.buf, n);
  }

  std::vector<std::vector<double>> times(nc);
  int attempt = 0, ok = 0;
  double foreign_cores = 0;
  for (attempt = 0; attempt < 3 && !ok; ++attempt) {
    for (auto& t : times) t.clear();
    comm.barrier();
    const double b0 = rank == 0 ? machine_busy() : 0, c0 = own_cpu(), start = MPI_Wtime();
    for (;;) {
      const int reps = int(times[0].size());
      int go = reps < o.min_reps ||
               (reps < o.max_reps && MPI_Wtime() - start < o.budget * double(nc));
      MPI_CHECK(MPI_Bcast(&go, 1, MPI_INT, 0, comm.mpi()));  // rank 0 decides for all
      if (!go) break;
      for (size_t c = 0; c < nc; ++c) {
        if (cands[c]->ar) std::copy(b.src.begin(), b.src.end(), b.buf.begin());
        comm.barrier();
        const double t0 = MPI_Wtime();
        run_once(*cands[c], b, false);
        times[c].push_back(MPI_Wtime() - t0);
        if (times[c].size() == 1) bad[c] += count_wrong(b.buf, n);  // a timed result, too
      }
    }
    comm.barrier();
    double mine = own_cpu() - c0, all = 0;
    MPI_CHECK(MPI_Reduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, 0, comm.mpi()));
    if (rank == 0) {
      const double wall = MPI_Wtime() - start, foreign = std::max(0.0, machine_busy() - b0 - all);
      foreign_cores = foreign / wall;
      ok = foreign_cores < 0.05 || foreign < 0.03;
    }
    MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, comm.mpi()));
  }
  for (size_t c = 0; c < nc; ++c) {
    bad[c] += count_wrong(b.buf, n) * (c + 1 == nc);  // the last one ran last
    long bad_all = 0;
    MPI_CHECK(MPI_Reduce(&bad[c], &bad_all, 1, MPI_LONG, MPI_SUM, 0, comm.mpi()));
    std::vector<double> tmax(times[c].size());
    MPI_CHECK(MPI_Reduce(times[c].data(), tmax.data(), int(times[c].size()), MPI_DOUBLE, MPI_MAX,
                         0, comm.mpi()));
    if (rank != 0) continue;
    std::sort(tmax.begin(), tmax.end());
    const size_t r = tmax.size();
    const double med = r % 2 ? tmax[r / 2] : 0.5 * (tmax[r / 2 - 1] + tmax[r / 2]);
    const double algbw = double(count * 4) / med / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
    std::printf("RESULT,%s,%d,%zu,%zu,%zu,%.1f,%.1f,%.1f,%.3f,%.3f,%s,%d,%.3f%s\n",
                cands[c]->label.c_str(), n, count * 4, count, r, med * 1e6, tmax[0] * 1e6,
                tmax[r - 1] * 1e6, algbw, busbw, bad_all ? "FAIL" : "OK", attempt, foreign_cores,
                ok ? "" : ",CONTENDED");
  }
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  const std::optional<Options> parsed = parse(argc, argv);
  Communicator comm;
  if (!parsed) {
    if (comm.rank() == 0) std::fputs(kUsage, stdout);
    return 0;
  }
  const Options& o = *parsed;
  if (comm.rank() == 0) {
    std::printf("# allreduce_bench np=%d algos=", comm.size());
    for (const std::string& a : o.algos) std::printf("%s ", a.c_str());
    const size_t net_seg = o.segment_set ? o.segment_bytes : CommConfig{}.network_segment_bytes;
    if (o.ranks_per_node > 0) std::printf("ranks_per_node=%d ", o.ranks_per_node);
    std::printf("nodes=%d segment_bytes=%zu (across nodes: %zu) recv_depth=%d idle_sleep_us=%d budget=%.1fs "
                "min_reps=%d interleave=%d\n",
                comm.nodes(), comm.nodes() > 1 ? net_seg : o.segment_bytes, net_seg, o.recv_depth, o.idle_sleep_us,
                o.budget, o.min_reps, int(o.interleave));
    std::printf("RESULT,impl,np,bytes,count,reps,median_us,min_us,max_us,algbw_GBps,busbw_GBps,"
                "check,attempts,foreign_cores\n");
    std::fflush(stdout);
  }
  std::vector<Candidate> cands;
  for (const std::string& spec : o.algos) {
    Candidate c{spec, nullptr, DType::f32, {}};
    if (spec == "openmpi") {
      cands.push_back(std::move(c));
      continue;
    }
    if (spec.rfind("openmpi", 0) == 0)  // MPI_Allreduce has no 16-bit sum, segments or depth
      throw Error(str_cat("algorithm '", spec, "': openmpi takes no suffix (MPI_Allreduce of floats, as the peer)"));
    // spec: algorithm[/ring_order][@segment][^recv_depth][~idle_sleep_us][:bf16|:fp16], e.g.
    // ring@128K^8~20 or ring/rank
    CommConfig cfg;
    const size_t colon = spec.find(':');
    if (colon != std::string::npos) c.wire = compression_wire_type(spec.substr(colon + 1), DType::f32);
    const std::string base = spec.substr(0, colon);
    const size_t tl = base.find('~');
    std::string head = base.substr(0, tl);
    const size_t caret = head.find('^');
    cfg.recv_depth = caret == std::string::npos ? o.recv_depth
                                                : int_option(spec + " (^: recv_depth)", head.substr(caret + 1), 2, 64);
    head = head.substr(0, caret);
    const size_t at = head.find('@');
    cfg.algorithm = head.substr(0, at);
    if (const size_t slash = cfg.algorithm.find('/'); slash != std::string::npos) {
      cfg.ring_order = cfg.algorithm.substr(slash + 1);  // ring/rank: MPI's order around the ring
      cfg.algorithm.resize(slash);
    }
    cfg.segment_bytes =
        at == std::string::npos ? o.segment_bytes : segment_size(spec + " (@: segment)", head.substr(at + 1));
    // "@X" and --segment-bytes fix the segment whether or not the ranks span several nodes.
    if (at != std::string::npos || o.segment_set) cfg.network_segment_bytes = cfg.segment_bytes;
    cfg.idle_sleep_us = tl == std::string::npos
                            ? o.idle_sleep_us
                            : int_option(spec + " (~: idle_sleep_us)", base.substr(tl + 1), 0, 1000000);
    cfg.ranks_per_node = o.ranks_per_node;
    c.ar = make_allreducer(cfg, comm);
    cands.push_back(std::move(c));
  }
  std::vector<Candidate*> all;
  for (Candidate& c : cands) all.push_back(&c);
  // Algorithms interleaved per size (or per iteration): a drifting load affects them alike.
  for (size_t bytes : o.sizes) {
    if (o.interleave) bench_size(comm, all, o, bytes);
    else for (Candidate* c : all) bench_size(comm, {c}, o, bytes);
  }
  return 0;
}

}  // namespace
}  // namespace rt::comm

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rc = rt::comm::comm_run_or_abort([&] { return rt::comm::run(argc, argv); });
  MPI_Finalize();
  return rc;
}

// Gradient buckets under mpirun: a fake backward that reports growing prefixes and a real small
// ResNet on the reference backend; bucketed (overlapped or not) allreduce must equal one
// allreduce of the whole buffer, and every rank must end bitwise identical.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "comm/agreement.h"
#include "comm/allreduce.h"
#include "comm/gradient_reducer.h"
#include "comm/mpi_check.h"
#include "nn/resnet.h"
#include "tests/mpi/mpi_test_util.h"

namespace rt::comm {
namespace {

using test::MpiTest;

// "Backward" writes the buffer front to back in rank-dependent pieces (ranks progress
// differently, as real ones do) and reports each finished prefix.
void fake_backward(MpiTest& t, GradientReducer& gr, std::vector<float>& g, int step) {
  std::mt19937 gen(77 + t.rank() * 13 + step);
  std::uniform_int_distribution<size_t> piece(1, g.size() / 7 + 1);
  gr.begin_step();
  size_t done = 0;
  while (done < g.size()) {
    const size_t end = std::min(g.size(), done + piece(gen));
    for (size_t i = done; i < end; ++i) g[i] = test::init_value(t.rank(), i + step);
    done = end;
    gr.on_ready(done);
    if (gen() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  gr.wait();
}

void check_fake_backward(MpiTest& t, Communicator& comm) {
  const size_t count = 300007;
  const float inv = 1.0f / static_cast<float>(t.size());
  for (const std::string algo : {"ring", "hierarchical", "reducer", "mpi"}) {
    for (size_t bucket_bytes : {size_t(4096), size_t(100000), size_t(25) << 20}) {
      for (bool overlap : {true, false}) {
        CommConfig cfg;
        cfg.algorithm = algo;
        cfg.ranks_per_node = t.size() % 2 == 0 ? 2 : 0;  // nodes of two ranks where they divide
        cfg.bucket_bytes = bucket_bytes;
        cfg.overlap = overlap;
        cfg.idle_sleep_us = overlap ? 0 : 20;  // the sequential waits: sleeping too
        // The communication thread's waits: MPI_Wait with the smallest buckets, sleeping otherwise.
        cfg.overlap_idle_sleep_us = bucket_bytes == 4096 ? 0 : 20;
        std::vector<float> g(count);
        GradientReducer gr(comm, cfg, g, buffer_fingerprint(count, DType::f32));
        for (int step = 0; step < 2; ++step) {
          fake_backward(t, gr, g, step);
          size_t bad = 0;
          for (size_t i = 0; i < count; ++i) bad += g[i] != test::expected_sum(t.size(), i + step) * inv;
          const std::string what = str_cat(algo, " bucket ", bucket_bytes, " overlap ", overlap,
                                           " step ", step);
          MPI_EXPECT(t, bad == 0, what, ": ", bad, " wrong");
          MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(g.data(), count * 4)), what,
                     ": ranks differ");
          const StepTimes& st = gr.last_step();
          MPI_EXPECT(t, st.buckets == gr.num_buckets() && st.total_comm_s >= 0 &&
                            st.exposed_comm_s >= 0 && st.compute_s >= 0, what, ": bad times");
          // One rank sends nothing, and hands nothing to a communication thread.
          MPI_EXPECT(t, t.size() > 1 || (st.exposed_comm_s == 0 && st.total_comm_s == 0), what,
                     ": one rank reports communication: exposed ", st.exposed_comm_s, " s, total ",
                     st.total_comm_s, " s");
        }
        if (algo == "ring" && bucket_bytes == 4096 && t.rank() == 0)
          std::printf("fake backward, %zu buckets, overlap %d: compute %.4f s, exposed %.4f s, "
                      "comm %.4f s, %zu buckets done before wait\n", gr.num_buckets(), overlap,
                      gr.last_step().compute_s, gr.last_step().exposed_comm_s,
                      gr.last_step().total_comm_s, gr.last_step().buckets_done_before_wait);
      }
    }
  }
}

// comm.compression: buckets go as bf16/fp16, each value divided by the ranks and rounded once
// before the ring, each hop's sum rounded once. Small integers (exact in both types, as every
// partial sum of them) come out exact on a power-of-two number of ranks; general values stay
// within a rounding per rank of the fp32 average and do differ from it (the wire really is 16
// bits); fp16 overflows only where the average does; mpi, which has no 16-bit sum, is refused.
void check_compression(MpiTest& t, Communicator& comm) {
  const int n = t.size();
  const size_t count = 50021;
  const bool pow2 = (n & (n - 1)) == 0;
  for (const std::string algo : {"ring", "hierarchical", "reducer"}) {
    for (const std::string comp : {"bf16", "fp16"}) {
      for (bool overlap : {true, false}) {
        CommConfig cfg;
        cfg.algorithm = algo;
        cfg.ranks_per_node = n % 2 == 0 ? 2 : 0;
        cfg.bucket_bytes = 40000;
        cfg.overlap = overlap;
        cfg.compression = comp;
        const std::string what = str_cat(algo, " ", comp, " overlap ", overlap);
        std::vector<float> g(count);
        GradientReducer gr(comm, cfg, g, buffer_fingerprint(count, DType::f32));
        MPI_EXPECT(t, gr.wire_type() == (comp == "bf16" ? DType::bf16 : DType::f16), what,
                   ": wire type ", dtype_name(gr.wire_type()));
        // (rank + 1) · (1 + i % 7): every partial sum is an integer below 256 over a power of two.
        for (size_t i = 0; i < count; ++i) g[i] = float((t.rank() + 1) * int(1 + i % 7));
        gr.begin_step();
        gr.on_ready(count);
        gr.wait();
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i)
          bad += g[i] != float(n * (n + 1) / 2 * int(1 + i % 7)) / float(n);
        if (pow2) MPI_EXPECT(t, bad == 0, what, ": ", bad, " of the exact small sums wrong");
        MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(g.data(), count * 4)), what,
                   ": ranks differ");

        // General values (not dyadic, so the fp32 average is rarely a 16-bit number): bounded by
        // (ranks + 1) roundings of the largest partial sum, the average itself.
        const double u = comp == "bf16" ? 0x1p-8 : 0x1p-11;
        auto value = [](int r, size_t i) { return float((r + 1) * int(1 + i % 1021)) * 0.01f; };
        for (size_t i = 0; i < count; ++i) g[i] = value(t.rank(), i);
        gr.begin_step();
        gr.on_ready(count);
        gr.wait();
        size_t off = 0, differ = 0;
        for (size_t i = 0; i < count; ++i) {
          double exact = 0;
          for (int r = 0; r < n; ++r) exact += double(value(r, i)) / n;
          off += std::fabs(g[i] - exact) > (n + 1) * u * exact;
          differ += g[i] != float(exact);
        }
        MPI_EXPECT(t, off == 0, what, ": ", off, " values beyond the rounding bound");
        if (n > 1) MPI_EXPECT(t, differ > 0, what, ": every value is fp32's: not compressed?");
        MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(g.data(), count * 4)), what,
                   ": ranks differ");
      }
    }
  }
  // fp16: 40960 on every rank averages to about 40960 (exactly on a power-of-two number of
  // ranks): the running sums of 40960/n stay below 65504; 70000 averages to inf, which dynamic
  // loss scaling then sees.
  CommConfig cfg;
  cfg.compression = "fp16";
  std::vector<float> g(1000);
  GradientReducer gr(comm, cfg, g, buffer_fingerprint(g.size(), DType::f32));
  for (size_t i = 0; i < g.size(); ++i) g[i] = i % 2 ? 40960.0f : 70000.0f;
  gr.wait();
  size_t bad = 0;
  const double slack = pow2 ? 0 : (n + 1) * 0x1p-11 * 40960;
  for (size_t i = 0; i < g.size(); ++i)
    bad += i % 2 ? !(std::fabs(g[i] - 40960.0) <= slack) : (n > 1 && !std::isinf(g[i]));
  MPI_EXPECT(t, bad == 0, "fp16 range: ", bad, " wrong (", g[0], ", ", g[1], ")");
  try {
    CommConfig m;
    m.algorithm = "mpi";
    m.compression = "bf16";
    GradientReducer bad_gr(comm, m, g, buffer_fingerprint(g.size(), DType::f32));
    t.fail("mpi with compression bf16 was accepted");
  } catch (const CommError& e) {
    MPI_EXPECT(t, std::string(e.what()).find("compression bf16 needs an algorithm that sums bf16") !=
                      std::string::npos, "mpi refusal: ", e.what());
  }
}

// A real network: gradients of rank-dependent batches averaged by buckets during backward.
void check_real_net(MpiTest& t, Communicator& comm) {
  ResNetConfig rc;
  rc.name = "resnet20";
  rc.num_classes = 10;
  rc.image_size = 16;
  rc.batch = 2;
  rc.width = 0.5;
  rc.seed = 5;
  auto net = build_resnet<float>(rc, make_backend<float>("reference"));
  Arena<float>& arena = net->arena();
  // Different initial weights per rank, then rank 0's everywhere.
  std::mt19937 gen(1000 + t.rank());
  std::normal_distribution<float> nd(0.0f, 0.01f);
  for (float& p : arena.params()) p += nd(gen);
  broadcast_model(comm, arena);
  MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(arena.params().data(), arena.params().size() * 4)),
             "parameters differ after broadcast_model");

  std::vector<float> x(2 * 3 * 16 * 16);
  for (float& v : x) v = nd(gen) * 100.0f;  // rank-dependent batch
  const int32_t labels[2] = {t.rank() % 10, (3 * t.rank() + 1) % 10};
  net->forward(x.data(), labels, true);

  const ModelFingerprint fp = model_fingerprint(arena);
  std::span<float> g = arena.grads();
  // Reference: plain backward, then one ring allreduce of the whole buffer.
  std::fill(g.begin(), g.end(), 0.0f);
  net->backward();
  std::vector<float> local(g.begin(), g.end());
  CommConfig whole_cfg;
  auto whole = make_allreducer(whole_cfg, comm);
  std::vector<float> ref = local;
  whole->allreduce(ref, ReduceOp::average);
  double gmax = 0;
  for (float v : ref) gmax = std::max(gmax, double(std::fabs(v)));

  std::vector<float> first;
  for (bool overlap : {true, false}) {
    CommConfig cfg;
    cfg.bucket_bytes = 16 << 10;  // ~ a dozen buckets for this small model
    cfg.overlap = overlap;
    GradientReducer gr(comm, cfg, g, fp);
    std::fill(g.begin(), g.end(), 0.0f);
    gr.begin_step();
    net->backward(gr.ready_callback());
    gr.wait();
    const std::string what = str_cat("resnet20 overlap ", overlap, " (", gr.num_buckets(), " buckets)");
    MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(g.data(), g.size() * 4)), what,
               ": ranks not bitwise identical");
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, double(std::fabs(g[i] - ref[i])));
    // Two ranks: one addition per element, so any order gives the same bits. More ranks: the
    // bucket boundaries change the summation order, so compare to float rounding.
    if (t.size() <= 2)
      MPI_EXPECT(t, worst == 0, what, ": differs from one whole allreduce by ", worst);
    else
      MPI_EXPECT(t, worst <= 1e-5 * gmax, what, ": differs from one whole allreduce by ", worst,
                 " (max |g| ", gmax, ")");
    if (overlap)
      first.assign(g.begin(), g.end());
    else
      MPI_EXPECT(t, std::equal(first.begin(), first.end(), g.begin()), what,
                 ": overlapped and sequential buckets differ");
    if (t.rank() == 0)
      std::printf("%s: compute %.4f s, exposed comm %.4f s, total comm %.4f s, %zu of %zu buckets "
                  "done before wait\n", what.c_str(), gr.last_step().compute_s,
                  gr.last_step().exposed_comm_s, gr.last_step().total_comm_s,
                  gr.last_step().buckets_done_before_wait, gr.num_buckets());
  }
}

// comm.bucket_bytes is in bytes: each bucket holds bucket_bytes / element size elements, rounded
// down to whole 64-byte lines (at least one), the last one the rest; together they tile the buffer
// in order. (A size taken as elements would make buckets four times larger for fp32 and still
// reduce correctly: only the bucket count shows it.)
void check_bucket_sizes(MpiTest& t, Communicator& comm) {
  const size_t count = 300007;
  for (size_t bucket_bytes : {size_t(4096), size_t(100000), size_t(100), size_t(25) << 20}) {
    CommConfig cfg;
    cfg.bucket_bytes = bucket_bytes;
    cfg.overlap = false;
    std::vector<float> g(count);
    GradientReducer gr(comm, cfg, g, buffer_fingerprint(count, DType::f32));
    const size_t per = std::max<size_t>(16, bucket_bytes / 4 / 16 * 16);  // 16 floats a line
    const size_t want = (count + per - 1) / per;
    MPI_EXPECT(t, gr.num_buckets() == want, "bucket_bytes ", bucket_bytes, ": ", gr.num_buckets(),
               " buckets, want ", want, " of ", per, " floats");
    size_t next = 0;
    for (size_t b = 0; b < gr.num_buckets(); ++b) {
      const Range r = gr.bucket(b);
      const size_t len = b + 1 == gr.num_buckets() ? count - next : per;
      MPI_EXPECT(t, r.offset == next && r.len == len, "bucket_bytes ", bucket_bytes, ": bucket ", b, " is [",
                 r.offset, ", +", r.len, "), want [", next, ", +", len, ")");
      next = r.offset + r.len;
    }
    MPI_EXPECT(t, next == count, "bucket_bytes ", bucket_bytes, ": buckets end at ", next, " of ", count);
  }
}

int run() {
  MpiTest t;
  Communicator comm;
  check_bucket_sizes(t, comm);
  check_fake_backward(t, comm);
  check_compression(t, comm);
  check_real_net(t, comm);
  return t.finish("test_mpi_gradient_reducer");
}

}  // namespace
}  // namespace rt::comm

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  const int rc = rt::comm::comm_run_or_abort([] { return rt::comm::run(); });
  MPI_Finalize();
  return rc;
}

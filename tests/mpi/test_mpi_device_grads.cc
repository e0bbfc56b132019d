// GradientReducer on a gradient buffer behind device hooks (a host fake of a GPU, see
// fake_device_grads.h) under mpirun: staged and direct paths, overlap on and off, several bucket
// sizes, must give bitwise what the plain host path gives on the same data (integer valued, so the
// sums are exact), wait for each bucket's fence before touching it, allocate scratch only at
// set-up, and end the job when one rank's device fails. Also CUDA-aware MPI detection.
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "comm/agreement.h"
#include "comm/cuda_aware.h"
#include "comm/gradient_reducer.h"
#include "comm/mpi_check.h"
#include "tests/mpi/fake_device_grads.h"
#include "tests/mpi/mpi_test_util.h"

namespace rt::comm {
namespace {

using test::FakeDeviceGrads;
using test::MpiTest;
using Event = FakeDeviceGrads::Event;
using std::chrono::microseconds;

constexpr size_t kCount = 100003;  // a prime: the last bucket and the ring's chunks are ragged

// One step of a backward whose writes land late on the fake device: rank-dependent pieces,
// sometimes a slow "kernel" before a piece, some reports repeated. Steps that are odd leave the
// last report to wait(), which must fence the remaining buckets itself; even steps call
// begin_step(), odd ones let the first report start the step.
void device_backward(MpiTest& t, GradientReducer& gr, FakeDeviceGrads& dev, int step) {
  std::mt19937 gen(77 + t.rank() * 13 + step);
  std::uniform_int_distribution<size_t> piece(1, kCount / 7 + 1);
  if (step % 2 == 0) gr.begin_step();
  const int rank = t.rank();
  for (size_t done = 0; done < kCount;) {
    const size_t end = std::min(kCount, done + piece(gen));
    const microseconds lag(gen() % 3 == 0 ? 400 : 0);
    dev.produce(done * 4, end * 4, lag, [=](char* p) {
      for (size_t i = done; i < end; ++i) {
        const float v = test::init_value(rank, i + size_t(step));
        std::memcpy(p + (i - done) * 4, &v, 4);
      }
    });
    done = end;
    if (done < kCount || step % 2 == 0) gr.on_ready(done);
    if (gen() % 5 == 0) gr.on_ready(done);
  }
  gr.wait();
}

// The same data through the plain host path.
void host_backward(MpiTest& t, GradientReducer& gr, std::vector<float>& g, int step) {
  for (size_t i = 0; i < kCount; ++i) g[i] = test::init_value(t.rank(), i + size_t(step));
  gr.begin_step();
  gr.on_ready(kCount);
  gr.wait();
}

// What the log of one step must show: nothing with one rank; else at most one fence per bucket; staged, each bucket
// downloaded once behind a fence that covers it, its download waited before its upload, and the
// uploads waited at the end; direct, a host wait per bucket for a fence covering it, in order.
void check_log(MpiTest& t, const GradientReducer& gr, const std::vector<Event>& log, bool staged,
               const std::string& what) {
  if (t.size() == 1) {  // nothing to average: no fence, copy or wait at all
    MPI_EXPECT(t, log.empty(), what, ": ", log.size(), " device events with one rank");
    return;
  }
  const size_t nb = gr.num_buckets();
  size_t records = 0, waits = 0, uploads = 0;
  std::vector<int> downloaded(nb, 0), waited_dl(nb, 0);
  std::vector<uint64_t> ticket(nb, ~uint64_t{0});
  bool upload_wait_last = false;
  auto bucket_at = [&](size_t offset) {
    for (size_t b = 0; b < nb; ++b)
      if (gr.bucket(b).offset * 4 == offset) return b;
    return nb;
  };
  for (const Event& e : log) {
    upload_wait_last = false;
    switch (e.kind) {
      case Event::record: ++records; break;
      case Event::wait: {
        const Range r = gr.bucket(std::min(waits, nb - 1));
        MPI_EXPECT(t, !staged && waits < nb && e.covered >= (r.offset + r.len) * 4, what,
                   ": host wait ", waits, " for a fence covering ", e.covered, " bytes");
        ++waits;
        break;
      }
      case Event::download: {
        const size_t b = bucket_at(e.offset);
        MPI_EXPECT(t, staged && b < nb && e.bytes == gr.bucket(b).len * 4 &&
                          e.covered >= e.offset + e.bytes, what, ": download of ", e.bytes,
                   " bytes at ", e.offset, " behind a fence covering ", e.covered);
        if (b < nb) ++downloaded[b], ticket[b] = e.id;
        break;
      }
      case Event::download_wait:
        for (size_t b = 0; b < nb; ++b)
          if (ticket[b] == e.id) ++waited_dl[b];
        break;
      case Event::upload: {
        const size_t b = bucket_at(e.offset);
        MPI_EXPECT(t, b < nb && waited_dl[b] == 1 && e.bytes == gr.bucket(b).len * 4, what,
                   ": upload at ", e.offset, " before its download was waited");
        ++uploads;
        break;
      }
      case Event::upload_wait: upload_wait_last = uploads == nb; break;
    }
  }
  MPI_EXPECT(t, records >= 1 && records <= nb, what, ": ", records, " fences for ", nb, " buckets");
  if (staged) {
    for (size_t b = 0; b < nb; ++b)
      MPI_EXPECT(t, downloaded[b] == 1 && waited_dl[b] == 1, what, ": bucket ", b, " downloaded ",
                 downloaded[b], " times, waited ", waited_dl[b]);
    MPI_EXPECT(t, uploads == nb && upload_wait_last, what, ": ", uploads,
               " uploads, the last event must be their wait");
  } else {
    MPI_EXPECT(t, waits == nb, what, ": ", waits, " host fence waits for ", nb, " buckets");
  }
}

void check_paths(MpiTest& t) {
  Communicator comm, ref_comm;  // the plain reducer on its own communicator
  const float inv = 1.0f / float(t.size());
  struct Case {
    DevicePath path;
    std::string algo;
    size_t bucket_bytes;
    std::string compression = "none";
    bool converts = false;  // staged: the hooks convert to the wire type on the "device"
  };
  std::vector<Case> cases;
  for (DevicePath p : {DevicePath::staged, DevicePath::direct})
    for (size_t bb : {size_t(4096), size_t(100000), size_t(25) << 20}) cases.push_back({p, "ring", bb});
  for (const char* algo : {"ring_pipelined", "hierarchical", "reducer", "mpi"}) {
    cases.push_back({DevicePath::direct, algo, 100000});
    cases.push_back({DevicePath::staged, algo, 100000});
  }
  // Compressed: the conversions too touch only fenced bytes, the wire buffer is allocated at
  // set-up (device scratch on the direct path), and the result is the host path's bit for bit.
  for (DevicePath p : {DevicePath::staged, DevicePath::direct}) {
    cases.push_back({p, "ring", 100000, "bf16"});
    cases.push_back({p, "reducer", 4096, "fp16"});
    cases.push_back({p, "hierarchical", 100000, "bf16"});
  }
  cases.push_back({DevicePath::staged, "ring", 100000, "bf16", true});
  cases.push_back({DevicePath::staged, "reducer", 4096, "fp16", true});
  for (const Case& c : cases) {
    for (bool overlap : {true, false}) {
      CommConfig cfg;
      cfg.algorithm = c.algo;
      cfg.ranks_per_node = t.size() % 2 == 0 ? 2 : 0;  // hierarchical: nodes of two where they divide
      cfg.bucket_bytes = c.bucket_bytes;
      cfg.overlap = overlap;
      cfg.idle_sleep_us = overlap ? 0 : 20;
      cfg.overlap_idle_sleep_us = 20;
      cfg.compression = c.compression;
      const std::string what = str_cat(device_path_name(c.path), " ", c.algo, " bucket ",
                                       c.bucket_bytes, " overlap ", overlap, " compression ",
                                       c.compression, c.converts ? " (converted by the hooks)" : "");
      const ModelFingerprint fp = buffer_fingerprint(kCount, DType::f32);
      std::vector<float> dev_buf(kCount), host(kCount);
      auto owned = std::make_unique<FakeDeviceGrads>(c.path, c.converts);
      FakeDeviceGrads& dev = *owned;
      GradientReducer gr(comm, cfg, std::move(owned), dev_buf.data(), kCount, DType::f32, fp);
      GradientReducer ref(ref_comm, cfg, host, fp);
      dev.attach(dev_buf.data(), kCount * 4);
      const bool solo = t.size() == 1;  // the hooks are never set up: nothing is allocated
      MPI_EXPECT(t, dev.setups == (solo ? 0 : 1), what, ": hooks set up ", dev.setups, " times");
      MPI_EXPECT(t, dev.staged_wire() == (c.converts && !solo ? gr.wire_type() : DType::f32), what,
                 ": the hooks stage ", dtype_name(dev.staged_wire()));
      MPI_EXPECT(t, std::string(gr.device_path()) == device_path_name(c.path), what, ": path ",
                 gr.device_path());
      const int scratch_allocs = dev.scratch.allocs;  // reserved at set-up on the direct path
      if (c.path == DevicePath::direct && c.algo != "mpi")
        MPI_EXPECT(t, solo ? scratch_allocs == 0 : scratch_allocs > 0, what, ": ", scratch_allocs,
                   " scratch allocations in the device space");
      for (int step = 0; step < 3; ++step) {
        dev.new_step();
        std::fill(dev_buf.begin(), dev_buf.end(), std::numeric_limits<float>::quiet_NaN());
        device_backward(t, gr, dev, step);
        // One rank's wait() waits for nothing: the host syncs the device, as a trainer would
        // before reading (more ranks' wait() has waited for every bucket's fence).
        if (t.size() == 1) dev.sync();
        host_backward(t, ref, host, step);
        const std::string at = str_cat(what, " step ", step);
        size_t bad = 0;
        for (size_t i = 0; i < kCount; ++i)
          bad += dev_buf[i] != test::expected_sum(t.size(), i + size_t(step)) * inv;
        // 16-bit sums of these values round (test_mpi_gradient_reducer holds them to bounds).
        if (c.compression == "none")
          MPI_EXPECT(t, bad == 0, at, ": ", bad, " wrong (first: ", dev_buf[0], ")");
        MPI_EXPECT(t, std::memcmp(dev_buf.data(), host.data(), kCount * 4) == 0, at,
                   ": differs from the plain host path");
        MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(dev_buf.data(), kCount * 4)), at,
                   ": ranks differ");
        check_log(t, gr, dev.take_log(), c.path == DevicePath::staged, at);
        for (const std::string& v : dev.violations()) t.fail(str_cat(at, ": ", v));
        MPI_EXPECT(t, gr.last_step().buckets == gr.num_buckets(), at, ": bad step record");
      }
      MPI_EXPECT(t, dev.scratch.allocs == scratch_allocs, what, ": scratch allocated during steps (",
                 dev.scratch.allocs - scratch_allocs, " times)");
      if (t.rank() == 0 && c.bucket_bytes == 4096)
        std::printf("%s: %zu buckets, compute %.4f s, exposed %.4f s, comm %.4f s, %zu done before wait\n",
                    what.c_str(), gr.num_buckets(), gr.last_step().compute_s,
                    gr.last_step().exposed_comm_s, gr.last_step().total_comm_s,
                    gr.last_step().buckets_done_before_wait);
    }
  }
}

// What this MPI says about device pointers, the same on every rank, and comm.device_path's
// choice from it.
void check_cuda_awareness(MpiTest& t) {
  const CudaAwareness a = mpi_cuda_awareness();
  if (t.rank() == 0) std::printf("CUDA-aware MPI: %s (%s)\n", a.aware ? "yes" : "no", a.detail.c_str());
  MPI_EXPECT(t, test::same_on_all_ranks(a.aware), "ranks disagree on CUDA awareness");
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  if (!MPIX_CUDA_AWARE_SUPPORT) MPI_EXPECT(t, !a.aware, "built without CUDA support, yet aware: ", a.detail);
  MPI_EXPECT(t, a.detail.find("MPIX_CUDA_AWARE_SUPPORT") != std::string::npos, a.detail);
#else
  MPI_EXPECT(t, !a.aware, "no CUDA extension, yet aware: ", a.detail);
#endif
  MPI_EXPECT(t, resolve_device_path(CommConfig{}, a) == (a.aware ? DevicePath::direct : DevicePath::staged),
             "auto resolved wrongly");
  bool threw = false;
  try {
    CommConfig cfg;
    cfg.device_path = "direct";
    MPI_EXPECT(t, comm_device_path(cfg) == DevicePath::direct, "direct resolved wrongly");
  } catch (const CommError& e) {
    threw = true;
    MPI_EXPECT(t, std::string(e.what()).find("comm.device_path") != std::string::npos, e.what());
  }
  MPI_EXPECT(t, threw == !a.aware, "direct on ", a.aware ? "a" : "no", " CUDA-aware MPI: threw ", threw);
}

// One rank's device fails in step 1 (a copy on the staged path, a fence on the direct one): that
// rank's wait() throws, and main's abort path must end every rank.
int run_fault(MpiTest& t, DevicePath path) {
  Communicator comm;
  CommConfig cfg;
  cfg.bucket_bytes = 100000;
  std::vector<float> buf(kCount);
  auto owned = std::make_unique<FakeDeviceGrads>(path);
  FakeDeviceGrads& dev = *owned;
  GradientReducer gr(comm, cfg, std::move(owned), buf.data(), kCount, DType::f32,
                     buffer_fingerprint(kCount, DType::f32));
  for (int step = 0; step < 3; ++step) {
    if (step == 1 && t.rank() == t.size() - 1) {
      if (path == DevicePath::staged) dev.fail_next_download_wait();
      else dev.fail_next_wait();
    }
    dev.new_step();
    device_backward(t, gr, dev, step);
  }
  return 0;  // not reached with more than one rank
}

int run(const std::string& mode) {
  MpiTest t;
  if (mode == "fail-staged") return run_fault(t, DevicePath::staged);
  if (mode == "fail-direct") return run_fault(t, DevicePath::direct);
  check_cuda_awareness(t);
  check_paths(t);
  return t.finish("test_mpi_device_grads");
}

}  // namespace
}  // namespace rt::comm

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  const std::string mode = argc > 1 ? argv[1] : "";
  const int rc = rt::comm::comm_run_or_abort([&] { return rt::comm::run(mode); });
  MPI_Finalize();
  return rc;
}

// The trainer's device-gradient wiring without a GPU: a backend that says it runs on a queue
// (Backend::stream()) and a registered DeviceGrads factory (the fake of fake_device_grads.h, a
// host stand-in for a GPU) make the trainer reduce through the hooks' staged path, with backward
// reporting in queue order; training must match the plain host path bit for bit. With input
// staging (Backend::stage_input) the trainer also prefetches each next batch during backward:
// still bit for bit, and resume stays exact; the loader's batches then live in the backend's
// input_memory(), allocated once. Step records take the backend's device timing.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi_check.h"
#include "tests/counting_memory.h"
#include "tests/forwarding_backend.h"
#include "tests/mpi/fake_device_grads.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/trainer_test_util.h"
#include "trainer/trainer.h"

namespace rt::trainer {
namespace {

using namespace test_trainer;

std::atomic<int> stagings{0}, staged_imports{0}, staged_in_memory{0};

test::CountingMemory counting_memory;

// The reference backend, claiming a queue: the trainer then asks for device hooks. With `stage`,
// it takes staged inputs as a device would, at the latest legal moment: the bytes are copied at
// the next sync() (or an import of them, if first), and the host buffer is then poisoned with
// NaN. So a trainer that reused the buffer before that sync, or an import that read the host
// instead of the staged copy, shows in the losses. With `mem`, that is its input_memory().
class QueuedReference final : public test::ForwardingBackend<float> {
 public:
  explicit QueuedReference(bool stage = false, HostMemory* mem = nullptr) : stage_(stage), mem_(mem) {}
  std::string name() const override { return "queued-reference"; }
  bool can_stage_input() const override { return stage_; }
  HostMemory* input_memory() const override { return mem_; }
  void stage_input(const void* host, size_t bytes) override {
    finish_copy();
    pending_ = host;
    pending_bytes_ = bytes;
    staged_host_ = nullptr;
    ++stagings;
    if (mem_ == &counting_memory && counting_memory.owns(host, bytes)) ++staged_in_memory;
  }
  void sync() const override {
    finish_copy();
    for (auto& [d, v] : exports_) std::copy(v.begin(), v.end(), d);
    exports_.clear();
    inner().sync();
    synced_ = true;
  }
  // Device timing: always kDeviceCompute, but NaN (which fails the checks) when read without a
  // sync() after both marks.
  void mark_compute(int which) override {
    marked_[which] = true;
    if (which == 0) marked_[1] = false;
    synced_ = false;
  }
  double compute_seconds() const override {
    return marked_[0] && marked_[1] && synced_ ? kDeviceCompute : std::numeric_limits<double>::quiet_NaN();
  }
  static constexpr double kDeviceCompute = 0.125;
  void act_import(const float* x, const Shape& s, float* d) const override {
    if (pending_ && x == pending_) finish_copy();
    if (staged_host_ && x == staged_host_) {
      staged_host_ = nullptr;
      ++staged_imports;
      inner().act_import(staged_.data(), s, d);
      return;
    }
    inner().act_import(x, s, d);
  }
  // A queued export lands at the next sync(), as a device's would; until then the host buffer
  // holds NaN, which a trainer reading it early would count as correct predictions.
  void act_export_queued(const float* x, const Shape& s, float* d) const override {
    std::vector<float> v(size_t(s.numel()));
    inner().act_export(x, s, v.data());
    std::fill_n(d, v.size(), std::numeric_limits<float>::quiet_NaN());
    exports_.emplace_back(d, std::move(v));
  }
  void* stream() const override { return const_cast<QueuedReference*>(this); }

 private:
  // The "device copy" of a pending staging, then the host buffer poisoned.
  void finish_copy() const {
    if (!pending_) return;
    const auto* x = static_cast<const float*>(pending_);
    const size_t n = pending_bytes_ / sizeof(float);
    staged_.assign(x, x + n);
    std::fill_n(const_cast<float*>(x), n, std::numeric_limits<float>::quiet_NaN());
    staged_host_ = pending_;
    pending_ = nullptr;
  }

  bool stage_;
  HostMemory* mem_;
  mutable std::vector<float> staged_;
  mutable const void* staged_host_ = nullptr;
  mutable const void* pending_ = nullptr;
  mutable size_t pending_bytes_ = 0;
  mutable std::vector<std::pair<float*, std::vector<float>>> exports_;  // queued, not yet landed
  bool marked_[2] = {};
  mutable bool synced_ = false;
};

std::atomic<int> made{0};
std::atomic<test::FakeDeviceGrads*> last{nullptr};

std::unique_ptr<comm::DeviceGrads> fake_factory(void* stream, comm::DevicePath path) {
  if (!stream) throw Error("device grads asked for without a stream");
  auto f = std::make_unique<test::FakeDeviceGrads>(path);
  last = f.get();
  ++made;
  return f;
}

// fixed_data() unless real_loader (the synthetic data::make_loader, which honours input_memory).
TrainerHooks hooks(bool queued, bool stage, HostMemory* mem = nullptr, bool real_loader = false) {
  TrainerHooks h = real_loader ? TrainerHooks{} : fixed_data();
  if (queued)
    h.make_net = [stage, mem](const Config& cfg) {
      return build_resnet<float>(config_resnet(cfg), std::make_unique<QueuedReference>(stage, mem));
    };
  else
    h.make_net = [](const Config& cfg) { return build_resnet<float>(config_resnet(cfg), make_backend<float>("reference")); };
  return h;
}

void check_staged_equals_host(MpiTest& t, const std::string& dir) {
  auto run = [&](bool queued, const std::string& sub) {
    Config c = tiny(dir + sub);
    c.train.steps = 4;
    c.comm.bucket_bytes = 4096;  // many buckets: many fences, downloads and uploads
    auto tr = std::make_unique<Trainer>(c, MPI_COMM_WORLD, hooks(queued, false));
    tr->train();
    return tr;
  };
  auto host = run(false, "/host");
  MPI_EXPECT(t, made == 0, "device hooks made for a backend without a queue");
  auto staged = run(true, "/staged");
  MPI_EXPECT(t, made == 1, made.load(), " device hooks made for one queued run");
  test::FakeDeviceGrads* f = last;
  size_t downloads = 0, uploads = 0;
  for (const auto& e : f->take_log()) {
    downloads += e.kind == test::FakeDeviceGrads::Event::download;
    uploads += e.kind == test::FakeDeviceGrads::Event::upload;
  }
  if (t.size() == 1)  // one rank averages nothing: no copies, and nothing set up for them
    MPI_EXPECT(t, downloads == 0 && uploads == 0 && f->setups == 0, downloads, " downloads, ", uploads,
               " uploads and ", f->setups, " set-ups with one rank");
  else
    MPI_EXPECT(t, downloads > 4 && uploads == downloads, downloads, " downloads, ", uploads, " uploads");
  MPI_EXPECT(t, staged->losses() == host->losses(), "losses differ from the host path");
  auto a = host->net().arena().params(), b = staged->net().arena().params();
  MPI_EXPECT(t, std::memcmp(a.data(), b.data(), a.size_bytes()) == 0, "parameters differ from the host path");
  MPI_EXPECT(t, test::same_on_all_ranks(params_hash(*staged)), "parameters differ across ranks");
  MPI_EXPECT(t, stagings == 0, "inputs staged for a backend that does not stage");
}

// Prefetching the next batch during backward: bit for bit the host path, every step after the
// first of each epoch run from the staged copy; stopped mid-epoch and resumed, still exact.
void check_prefetch(MpiTest& t, const std::string& dir) {
  auto train = [&](bool queued, const std::string& sub, int64_t steps, bool resume) {
    Config c = tiny(dir + sub);
    c.train.steps = steps;
    auto tr = std::make_unique<Trainer>(c, MPI_COMM_WORLD, hooks(queued, queued));
    if (resume) tr->resume("auto");
    tr->train();
    return tr;
  };
  auto host = train(false, "/pf-host", 0, false);
  const int64_t spe = host->steps_per_epoch(), total = host->step();
  stagings = staged_imports = 0;
  auto pre = train(true, "/pf", 0, false);
  int64_t want = 0;  // steps 2.. of each epoch (0-based k with k % spe != 0)
  for (int64_t k = 1; k < total; ++k) want += k % spe != 0;
  MPI_EXPECT(t, stagings == want && staged_imports == want, stagings.load(), " staged and ", staged_imports.load(),
             " used of ", want, " prefetched steps");
  MPI_EXPECT(t, pre->losses() == host->losses(), "losses with prefetch differ from the host path");
  auto a = host->net().arena().params(), b = pre->net().arena().params();
  MPI_EXPECT(t, std::memcmp(a.data(), b.data(), a.size_bytes()) == 0, "parameters with prefetch differ");
  // Stopped one step into the second epoch, then resumed.
  train(true, "/pf-resumed", spe + 1, false);
  auto resumed = train(true, "/pf-resumed", 0, true);
  auto r = resumed->net().arena().params();
  MPI_EXPECT(t, std::memcmp(a.data(), r.data(), a.size_bytes()) == 0, "resume with prefetch is not exact");
}

// Batches in the backend's input_memory(): the data loader allocates there and every staged
// batch lies in it; a lap of buffers allocated once (as many after five epochs as after two,
// evaluation included), all freed there; training bit for bit as with heap batches.
void check_input_memory(MpiTest& t, const std::string& dir) {
  auto train = [&](HostMemory* mem, const std::string& sub, int64_t epochs) {
    Config c = tiny(dir + sub);
    c.train.epochs = epochs;
    c.eval.every_epochs = 1;
    auto tr = std::make_unique<Trainer>(c, MPI_COMM_WORLD, hooks(true, true, mem, true));
    tr->train();
    return tr->losses();
  };
  const auto heap = train(nullptr, "/mem-heap", 2);
  stagings = staged_in_memory = 0;
  const int64_t before = counting_memory.allocs();
  const auto pinned = train(&counting_memory, "/mem", 2);
  const int64_t two = counting_memory.allocs() - before;
  MPI_EXPECT(t, pinned == heap, "losses with batches in input_memory differ from heap batches");
  MPI_EXPECT(t, stagings > 0 && staged_in_memory == stagings, staged_in_memory.load(), " of ", stagings.load(),
             " staged batches in input_memory");
  MPI_EXPECT(t, counting_memory.live() == 0, counting_memory.live(), " blocks of input_memory never freed");
  const int64_t mid = counting_memory.allocs();
  train(&counting_memory, "/mem5", 5);
  const int64_t five = counting_memory.allocs() - mid;
  MPI_EXPECT(t, two > 0 && five == two, two, " input_memory allocations in 2 epochs, ", five, " in 5");
}

// The step records of a backend with device timing: compute_s is the device's figure, read after
// the step's sync, and exposed_comm_s counts only what the reducer took past the device's
// compute (here never more than the step's time beyond it). A host backend keeps host times.
// The training accuracy comes from logits exported queued, read only after the step's sync: the
// same as the host path's.
void check_device_times(MpiTest& t, const std::string& dir) {
  std::string accuracy[2];  // the epoch records' "train_top1":...,"train_top5":... of each run
  auto records = [&](bool queued, const std::string& sub) {
    Config c = tiny(dir + sub);
    c.train.steps = 5;
    c.log.jsonl = "";  // rank 0's, in the run folder
    Trainer(c, MPI_COMM_WORLD, hooks(queued, queued)).train();
    std::vector<std::array<double, 3>> r;  // compute_s, exposed_comm_s, step_s
    std::ifstream f(c.run_dir + "/metrics.jsonl");
    const std::regex re("\"type\":\"step\".*\"step_s\":([-0-9.eE+a-z]+),\"compute_s\":([-0-9.eE+a-z]+),.*"
                        "\"exposed_comm_s\":([-0-9.eE+a-z]+),");
    const std::regex acc("\"type\":\"epoch\".*(\"train_top1\":[^,]+,\"train_top5\":[^,]+)");
    for (std::string line; std::getline(f, line);) {
      std::smatch m;
      if (std::regex_search(line, m, re)) r.push_back({std::stod(m[2]), std::stod(m[3]), std::stod(m[1])});
      if (std::regex_search(line, m, acc)) accuracy[queued] += m[1].str() + ";";
    }
    return r;
  };
  const auto dev = records(true, "/times"), host = records(false, "/times-host");
  if (t.rank() != 0) return;
  MPI_EXPECT(t, dev.size() == 5 && host.size() == 5, dev.size(), " and ", host.size(), " step records");
  MPI_EXPECT(t, !accuracy[0].empty() && accuracy[1] == accuracy[0], "training accuracy ", accuracy[1],
             " differs from the host path's ", accuracy[0]);
  for (const auto& [compute, exposed, step] : dev) {
    MPI_EXPECT(t, compute == QueuedReference::kDeviceCompute, "compute_s ", compute, " is not the device's time");
    MPI_EXPECT(t, exposed >= 0 && exposed <= std::max(0.0, step - compute) + 1e-6, "exposed_comm_s ", exposed,
               " with step_s ", step, " and device compute ", compute);
  }
  for (const auto& rec : host) MPI_EXPECT(t, rec[0] != QueuedReference::kDeviceCompute, "host compute_s is the fake's");
}

}  // namespace
}  // namespace rt::trainer

int main(int argc, char** argv) {
  rt::trainer::register_device_grads(&rt::trainer::fake_factory);
  using namespace rt::trainer;
  return test_trainer::run_trainer_test(argc, argv, "test_mpi_trainer_device", [](rt::test::MpiTest& t, const std::string& dir) {
    check_staged_equals_host(t, dir);
    check_prefetch(t, dir);
    check_input_memory(t, dir);
    check_device_times(t, dir);
  });
}

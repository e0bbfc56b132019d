// Helpers shared by the trainer tests under mpirun: fixed learnable data, a model without batch
// norm, a tiny ResNet configuration and a temporary folder every rank agrees on.
#pragma once
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_check.h"
#include "nn/resnet.h"
#include "tests/mpi/mpi_test_util.h"
#include "trainer/trainer.h"

namespace rt::trainer::test_trainer {

using test::MpiTest;

// Fixed, learnable data: sample i has label i % classes and an image that is a class-dependent
// pattern plus hash noise. Training: the epoch's permutation cut into global batches, rank r
// taking the r-th slice of each (so N ranks x b see exactly what 1 rank x N*b sees). Validation:
// rank r takes samples r, r+N, ... with a short last batch.
class FixedLoader final : public data::Loader {
 public:
  FixedLoader(const data::DataConfig& cfg, data::Split split, int rank, int world, int batch)
      : cfg_(cfg), split_(split), rank_(rank), world_(world), batch_(batch) {
    size_ = cfg.synthetic_samples;
    for (int c = 0; c < cfg.synthetic_classes; ++c) names_.push_back(std::to_string(c));
  }
  int64_t size() const override { return size_; }
  int num_classes() const override { return cfg_.synthetic_classes; }
  int64_t steps_per_epoch() const override {
    if (split_ == data::Split::train) return size_ / (int64_t(world_) * batch_);
    return (share() + batch_ - 1) / batch_;
  }
  void start_epoch(data::Position pos) override {
    pos_ = pos;
    perm_.resize(size_t(size_));
    for (int64_t i = 0; i < size_; ++i) perm_[size_t(i)] = i;
    uint64_t s = mix(cfg_.seed * 1000003 + uint64_t(pos.epoch) + 17);
    for (int64_t i = size_ - 1; i > 0; --i) {  // Fisher-Yates with our own generator: portable
      s = mix(s);
      std::swap(perm_[size_t(i)], perm_[size_t(s % uint64_t(i + 1))]);
    }
  }
  bool next(data::Batch& out) override {
    if (pos_.step >= steps_per_epoch()) return false;
    const int s = cfg_.image_size;
    const size_t per = size_t(3 * s * s);
    int n = batch_;
    if (split_ == data::Split::val) n = int(std::min<int64_t>(batch_, share() - pos_.step * batch_));
    out.n = n;
    out.images.resize(size_t(n) * per);
    out.labels.resize(size_t(n));
    for (int j = 0; j < n; ++j) {
      const int64_t idx = split_ == data::Split::train
                              ? perm_[size_t((pos_.step * world_ + rank_) * batch_ + j)]
                              : rank_ + (pos_.step * batch_ + j) * world_;
      const int label = int(idx % cfg_.synthetic_classes);
      out.labels[size_t(j)] = label;
      for (size_t k = 0; k < per; ++k) {
        const float pattern = ((k * 7 + size_t(label) * 13) % 11 < 5) ? 1.f : -1.f;
        const float noise = float(mix(uint64_t(idx) * 65537 + k) % 1000) / 1000.f - 0.5f;
        out.images[size_t(j) * per + k] = 0.5f * pattern + noise;
      }
    }
    ++pos_.step;
    return true;
  }
  data::Position position() const override { return pos_; }
  double last_wait_s() const override { return 0; }
  int64_t skipped() const override { return 0; }
  const std::vector<std::string>& class_names() const override { return names_; }

 private:
  static uint64_t mix(uint64_t x) {  // splitmix64
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  int64_t share() const { return (size_ - rank_ + world_ - 1) / world_; }
  data::DataConfig cfg_;
  data::Split split_;
  int rank_, world_, batch_;
  int64_t size_ = 0;
  std::vector<std::string> names_;
  std::vector<int64_t> perm_;
  data::Position pos_;
};

inline TrainerHooks fixed_data() {
  TrainerHooks h;
  h.make_loader = [](const data::DataConfig& c, data::Split s, int r, int w, int b) {
    return std::make_unique<FixedLoader>(c, s, r, w, b);
  };
  return h;
}

// conv-relu-conv-relu-pool-linear: no batch norm, so per-rank batches cannot change the result.
inline std::unique_ptr<Net<float>> plain_net(const Config& c) {
  auto net = std::make_unique<Net<float>>(make_backend<float>(c.backend),
                                          Shape{c.train.batch, 3, c.data.image_size, c.data.image_size});
  int x = net->conv(net->input(), "conv1", 8, 3, 1, 1, true);
  x = net->relu(x, "relu1");
  x = net->conv(x, "conv2", 8, 3, 2, 1, true);
  x = net->relu(x, "relu2");
  x = net->global_avgpool(x, "pool");
  x = net->linear(x, "fc", c.model.classes);
  net->loss(x, {c.train.loss, c.train.label_smoothing, c.train.bce_threshold});
  net->finalize();
  init_resnet(*net, c.seed, false);
  return net;
}

inline Config tiny(const std::string& run_dir) {
  Config c;
  c.source = "test";
  c.model.name = "resnet20";
  c.model.classes = 4;
  c.model.width = 0.25;
  c.data.synthetic = true;
  c.data.synthetic_samples = 48;
  c.data.synthetic_classes = 4;
  c.data.image_size = 8;
  c.data.threads = 1;
  c.train.epochs = 2;
  c.train.batch = 4;
  c.optimizer.lr = 6.4;  // per 256 images: base lr 0.1 per 4 images of global batch
  c.optimizer.sgd.weight_decay = 1e-4;
  c.schedule.kind = ScheduleKind::cosine;
  c.schedule.warmup_epochs = 0.5;
  c.schedule.warmup_start_factor = 0.1;
  c.log.jsonl = "none";
  c.log.progress = false;
  c.log.print_config = false;
  c.check.every = 2;
  c.threads = 1;
  c.run_dir = run_dir;
  return c;
}

inline std::string shared_tmpdir(MpiTest& t) {
  char buf[256] = {};
  if (t.rank() == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "rt_trainer_XXXXXX").string();
    std::strncpy(buf, tmpl.c_str(), sizeof buf - 1);
    if (!mkdtemp(buf)) throw Error("mkdtemp failed");
  }
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

inline uint64_t params_hash(Trainer& tr) {
  auto p = tr.net().arena().params();
  return test::hash_bytes(p.data(), p.size_bytes());
}

// A trainer test program's main: MPI with the trainer's thread level, a shared temporary folder
// for checks(t, dir), removed at the end; a failing rank stops the job. Returns main's status.
template <class Checks>
int run_trainer_test(int argc, char** argv, const char* name, Checks checks) {
  int provided = 0;  // as the trainer's main: model.bn_group sums during backward
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MpiTest t;
  const int rc = comm::comm_run_or_abort([&] {
    const std::string dir = shared_tmpdir(t);
    checks(t, dir);
    MPI_Barrier(MPI_COMM_WORLD);
    if (t.rank() == 0) std::filesystem::remove_all(dir);
    return t.finish(name);
  });
  MPI_Finalize();
  return rc;
}

}  // namespace rt::trainer::test_trainer

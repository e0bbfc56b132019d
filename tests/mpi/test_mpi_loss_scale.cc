// Loss scaling in the trainer under mpirun. A power-of-two scale is exact in binary floating
// point, so a scaled run must match an unscaled one bit for bit; an overflow must skip exactly
// the update (parameters and momentum untouched) and halve the scale on every rank alike; and a
// resume must continue with the saved scale.
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "comm/mpi_check.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/trainer_test_util.h"
#include "trainer/trainer.h"

namespace rt::trainer {
namespace {

using namespace test_trainer;

// The same global batch at every step: samples = ranks x batch, one step per epoch, and every
// epoch starts from the first epoch's order. A skipped step then leaves the next step's loss
// equal to its own, and a run shifted by the skipped steps sees the same data.
class SameBatchLoader final : public data::Loader {
 public:
  explicit SameBatchLoader(std::unique_ptr<data::Loader> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  int num_classes() const override { return inner_->num_classes(); }
  int64_t steps_per_epoch() const override { return inner_->steps_per_epoch(); }
  void start_epoch(data::Position) override { inner_->start_epoch({0, 0}); }
  bool next(data::Batch& out) override { return inner_->next(out); }
  data::Position position() const override { return inner_->position(); }
  double last_wait_s() const override { return 0; }
  int64_t skipped() const override { return 0; }
  const std::vector<std::string>& class_names() const override { return inner_->class_names(); }

 private:
  std::unique_ptr<data::Loader> inner_;
};

TrainerHooks same_batch() {
  TrainerHooks h;
  h.make_loader = [](const data::DataConfig& c, data::Split s, int r, int w, int b) -> std::unique_ptr<data::Loader> {
    return std::make_unique<SameBatchLoader>(fixed_data().make_loader(c, s, r, w, b));
  };
  return h;
}

Config same_batch_config(const std::string& dir, int world) {
  Config c = tiny(dir);
  c.data.synthetic_samples = 4 * world;  // one global batch
  c.schedule.kind = ScheduleKind::constant;  // a shifted run gets the same learning rates
  c.schedule.warmup_epochs = 0;
  c.train.epochs = 1000;
  return c;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// Static 2^10 and dynamic scaling that never overflows: the same losses, parameters and momentum
// as no scaling, bit for bit.
void check_exact(MpiTest& t, const std::string& dir) {
  auto run = [&](const std::string& mode, double init, const std::string& sub) {
    Config c = tiny(dir + sub);
    c.train.epochs = 6;  // at least 6 steps on any rank count (train.steps stops within the epochs)
    c.train.steps = 6;
    c.loss_scale.mode = mode;
    c.loss_scale.init = init;
    c.loss_scale.growth_interval = 2;  // dynamic: 2^4 -> 2^5 -> 2^6 -> 2^7 over the run
    auto tr = std::make_unique<Trainer>(c, MPI_COMM_WORLD, fixed_data());
    tr->train();
    return tr;
  };
  auto none = run("none", 1, "/none");
  auto fixed = run("static", 1024, "/static");
  auto dyn = run("dynamic", 16, "/dynamic");
  MPI_EXPECT(t, dyn->loss_scaler().scale() == 128, "dynamic scale after 6 good steps: ", dyn->loss_scaler().scale());
  MPI_EXPECT(t, dyn->loss_scaler().skipped_steps() == 0, "dynamic run skipped ", dyn->loss_scaler().skipped_steps());
  for (auto* other : {fixed.get(), dyn.get()}) {
    MPI_EXPECT(t, other->losses() == none->losses(), "losses differ from the unscaled run");
    MPI_EXPECT(t, same_bits(other->net().arena().params(), none->net().arena().params()),
               "parameters differ from the unscaled run");
    MPI_EXPECT(t, same_bits(other->optimizer().momentum(), none->optimizer().momentum()),
               "momentum differs from the unscaled run");
  }
}

// Dynamic scaling from 2^140, beyond fp32's range, on the same batch every step: the first
// steps overflow, and later ones may again as the gradients grow. Each overflow skips the update
// with the parameters untouched (the next step's loss equals its own) and halves the scale; the
// applied steps are exactly an unscaled run's steps.
void check_overflow_skips(MpiTest& t, const std::string& dir) {
  const int n = 24;
  Config b = same_batch_config(dir + "/overflow", t.size());
  b.train.steps = n;
  b.loss_scale.mode = "dynamic";
  b.loss_scale.init = 0x1p140;
  b.log.grad_norm = true;  // a skipped step's record says its norm is not finite: -1
  b.log.jsonl = b.run_dir + "/metrics-{rank}.jsonl";
  Trainer tb(b, MPI_COMM_WORLD, same_batch());
  tb.train();
  const auto& skipped = tb.skipped_steps();
  const int64_t m = int64_t(skipped.size());
  {
    std::ifstream f(b.run_dir + "/metrics-" + std::to_string(t.rank()) + ".jsonl");
    int64_t records = 0, with_norm = 0;
    for (std::string line; std::getline(f, line);)
      if (line.find("\"type\":\"step\"") != std::string::npos && line.find("\"skipped\":1") != std::string::npos) {
        ++records;
        with_norm += line.find("\"grad_norm\":-1,\"clipped\":0") != std::string::npos;
      }
    MPI_EXPECT(t, records == m && with_norm == m, records, " skipped steps' records, ", with_norm,
               " with grad_norm -1, of ", m, " skipped steps");
  }
  MPI_EXPECT(t, m == tb.loss_scaler().skipped_steps(), m, " skipped steps listed, the scaler counts ",
             tb.loss_scaler().skipped_steps());
  MPI_EXPECT(t, m >= 1 && m < n && skipped[0] == 1, "skipped ", m, " of ", n, " steps from scale 2^140");
  MPI_EXPECT(t, tb.loss_scaler().scale() == std::ldexp(1.0, 140 - int(m)), "scale ", tb.loss_scaler().scale(),
             " after ", m, " overflows");
  MPI_EXPECT(t, tb.optimizer().steps() == n - m, "optimizer ran ", tb.optimizer().steps(), " updates");
  MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(skipped.data(), skipped.size() * 8)),
             "ranks skipped different steps");
  MPI_EXPECT(t, test::same_on_all_ranks(params_hash(tb)), "parameters differ across ranks");
  if (m < 1 || m >= n) return;

  Config a = same_batch_config(dir + "/overflow_ref", t.size());
  a.train.steps = n - m;
  Trainer ta(a, MPI_COMM_WORLD, same_batch());
  ta.train();
  // Step j of the scaled run sees the parameters after its applied steps so far.
  size_t applied = 0, next_skip = 0;
  for (int64_t j = 1; j <= n; ++j) {
    const double want = ta.losses()[std::min(applied, ta.losses().size() - 1)];
    MPI_EXPECT(t, tb.losses()[size_t(j - 1)] == want, "step ", j, " loss ", tb.losses()[size_t(j - 1)],
               ", the unscaled run's loss after ", applied, " updates is ", want);
    if (next_skip < skipped.size() && skipped[next_skip] == j) ++next_skip;
    else ++applied;
  }
  MPI_EXPECT(t, same_bits(tb.net().arena().params(), ta.net().arena().params()),
             "parameters differ from an unscaled run without the skipped steps");
  MPI_EXPECT(t, same_bits(tb.optimizer().momentum(), ta.optimizer().momentum()), "momentum differs");
}

// Stopped mid-run and resumed: the saved scale and good-step count carry on (a fresh scale would
// overflow again and skip different steps).
void check_resume(MpiTest& t, const std::string& dir) {
  auto config = [&](const std::string& sub) {
    Config c = tiny(dir + sub);
    c.data.synthetic_samples = 4 * t.size() * 3;  // 3 steps per epoch: step 5 is mid-epoch
    c.train.epochs = 4;
    c.loss_scale.mode = "dynamic";
    c.loss_scale.init = 0x1p140;
    c.loss_scale.growth_interval = 3;  // grows back into overflow: skips all through the run
    c.checkpoint.every_steps = 5;
    return c;
  };
  Config a = config("/straight");
  Trainer ta(a, MPI_COMM_WORLD, fixed_data());
  ta.train();
  Config b = config("/resumed");
  b.train.steps = 5;
  {
    Trainer tb(b, MPI_COMM_WORLD, fixed_data());
    tb.train();
  }
  b.train.steps = 0;
  Trainer tb(b, MPI_COMM_WORLD, fixed_data());
  tb.resume("auto");
  MPI_EXPECT(t, tb.step() == 5, "resumed at step ", tb.step());
  tb.train();
  MPI_EXPECT(t, ta.loss_scaler().skipped_steps() >= 2, "the straight run skipped only ",
             ta.loss_scaler().skipped_steps(), " step(s)");
  MPI_EXPECT(t, tb.loss_scaler().scale() == ta.loss_scaler().scale(), "scale ", tb.loss_scaler().scale(),
             " after resume, ", ta.loss_scaler().scale(), " straight");
  MPI_EXPECT(t, same_bits(ta.net().arena().params(), tb.net().arena().params()), "resume is not bitwise exact");
  MPI_EXPECT(t, ta.optimizer().steps() == tb.optimizer().steps(), "optimizer step counts differ");
}

}  // namespace
}  // namespace rt::trainer

int main(int argc, char** argv) {
  using namespace rt::trainer;
  return test_trainer::run_trainer_test(argc, argv, "test_mpi_loss_scale", [](rt::test::MpiTest& t, const std::string& dir) {
    check_exact(t, dir);
    check_overflow_skips(t, dir);
    check_resume(t, dir);
  });
}

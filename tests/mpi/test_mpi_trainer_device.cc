// The trainer's device-gradient wiring without a GPU: a backend that says it runs on a queue
// (Backend::stream()) and a registered DeviceGrads factory (the fake of fake_device_grads.h, a
// host stand-in for a GPU) make the trainer reduce through the hooks' staged path, with backward
// reporting in queue order; training must match the plain host path bit for bit.
#include <mpi.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "comm/mpi_check.h"
#include "tests/mpi/fake_device_grads.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/trainer_test_util.h"
#include "trainer/trainer.h"

namespace rt::trainer {
namespace {

using namespace test_trainer;

// The reference backend, claiming a queue: the trainer then asks for device hooks.
class QueuedReference final : public Backend<float> {
 public:
  QueuedReference() : in_(make_backend<float>("reference")) {}
  std::string name() const override { return "queued-reference"; }
  size_t act_size(const Shape& s) const override { return in_->act_size(s); }
  void act_import(const float* x, const Shape& s, float* d) const override { in_->act_import(x, s, d); }
  void act_export(const float* x, const Shape& s, float* d) const override { in_->act_export(x, s, d); }
  void accumulate(float* y, const float* x, size_t n) const override { in_->accumulate(y, x, n); }
  void* stream() const override { return const_cast<QueuedReference*>(this); }
  std::unique_ptr<ConvOp<float>> make_conv(const ConvDesc& d) override { return in_->make_conv(d); }
  std::unique_ptr<BatchNormOp<float>> make_batchnorm(const BatchNormDesc& d) override {
    return in_->make_batchnorm(d);
  }
  std::unique_ptr<ReluOp<float>> make_relu(const ReluDesc& d) override { return in_->make_relu(d); }
  std::unique_ptr<MaxPoolOp<float>> make_maxpool(const MaxPoolDesc& d) override { return in_->make_maxpool(d); }
  std::unique_ptr<GlobalAvgPoolOp<float>> make_global_avgpool(const GlobalAvgPoolDesc& d) override {
    return in_->make_global_avgpool(d);
  }
  std::unique_ptr<LinearOp<float>> make_linear(const LinearDesc& d) override { return in_->make_linear(d); }
  std::unique_ptr<AddOp<float>> make_add(const AddDesc& d) override { return in_->make_add(d); }
  std::unique_ptr<PadShortcutOp<float>> make_pad_shortcut(const PadShortcutDesc& d) override {
    return in_->make_pad_shortcut(d);
  }
  std::unique_ptr<SoftmaxXentOp<float>> make_softmax_xent(const SoftmaxXentDesc& d) override {
    return in_->make_softmax_xent(d);
  }

 private:
  std::unique_ptr<Backend<float>> in_;
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

void check_staged_equals_host(MpiTest& t, const std::string& dir) {
  auto run = [&](bool queued, const std::string& sub) {
    Config c = tiny(dir + sub);
    c.train.steps = 4;
    c.comm.bucket_bytes = 4096;  // many buckets: many fences, downloads and uploads
    TrainerHooks h = fixed_data();
    if (queued)
      h.make_net = [](const Config& cfg) {
        return build_resnet<float>(config_resnet(cfg), std::make_unique<QueuedReference>());
      };
    else
      h.make_net = [](const Config& cfg) { return build_resnet<float>(config_resnet(cfg), make_backend<float>("reference")); };
    auto tr = std::make_unique<Trainer>(c, MPI_COMM_WORLD, h);
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
  MPI_EXPECT(t, downloads > 4 && uploads == downloads, downloads, " downloads, ", uploads, " uploads");
  MPI_EXPECT(t, staged->losses() == host->losses(), "losses differ from the host path");
  auto a = host->net().arena().params(), b = staged->net().arena().params();
  MPI_EXPECT(t, std::memcmp(a.data(), b.data(), a.size_bytes()) == 0, "parameters differ from the host path");
  MPI_EXPECT(t, test::same_on_all_ranks(params_hash(*staged)), "parameters differ across ranks");
}

}  // namespace
}  // namespace rt::trainer

int main(int argc, char** argv) {
  rt::trainer::register_device_grads(&rt::trainer::fake_factory);
  using namespace rt::trainer;
  return test_trainer::run_trainer_test(argc, argv, "test_mpi_trainer_device", [](rt::test::MpiTest& t, const std::string& dir) {
    check_staged_equals_host(t, dir);
  });
}

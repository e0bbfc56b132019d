// The trainer over an arena the host cannot touch (tests/sealed_backend.h, a stand-in for a GPU's
// device memory): the initial broadcast, training with gradients reduced through staged device
// hooks (also with accumulated passes), consistency checks, BN statistics averaging, evaluation,
// emulated compute, the weights' moving average (Backend::ema_update's path through host copies),
// gradient clipping (Backend::sum_squares' too), frozen tensors (gradients zeroed in the arena's space),
// a checkpoint and its load must all reach the arena through copies (a host dereference kills the
// rank), and match the reference backend on host memory bit for bit.
#include <mpi.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/reduce.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/trainer_test_util.h"
#include "tests/sealed_backend.h"
#include "trainer/trainer.h"

namespace rt::trainer {
namespace {

using namespace test_trainer;

// Staged hooks whose copies go through the sealed space, synchronously: the fake backend has
// finished a gradient when it reports it, so the fences have nothing to wait for.
class SealedStagedGrads final : public comm::DeviceGrads {
 public:
  explicit SealedStagedGrads(const MemorySpace& space) : space_(space) {}
  comm::DevicePath path() const override { return comm::DevicePath::staged; }
  void setup(void* device, size_t bytes, size_t) override {
    device_ = static_cast<char*>(device);
    mirror_.assign(bytes, 0);
  }
  uint64_t record() override { return fences_++; }
  void wait(uint64_t) override {}
  const comm::ReduceKernels& kernels() const override { return comm::cpu_reduce_kernels(); }
  const MemorySpace* scratch_space() const override { return nullptr; }
  char* host() override { return mirror_.data(); }
  uint64_t download(size_t offset, size_t bytes, uint64_t) override {
    space_.to_host(mirror_.data() + offset, device_ + offset, bytes);
    return downloads_++;
  }
  void download_wait(uint64_t) override {}
  void upload(size_t offset, size_t bytes) override {
    space_.from_host(device_ + offset, mirror_.data() + offset, bytes);
  }
  void upload_wait() override {}

 private:
  const MemorySpace& space_;
  char* device_ = nullptr;
  std::vector<char> mirror_;
  uint64_t fences_ = 0, downloads_ = 0;
};

std::unique_ptr<comm::DeviceGrads> sealed_grads(void* stream, comm::DevicePath path) {
  if (path != comm::DevicePath::staged) throw Error("the sealed test device has only the staged path");
  // The backend passes itself as its stream.
  return std::make_unique<SealedStagedGrads>(static_cast<test::SealedBackend*>(stream)->space());
}

std::vector<float> params_of(Trainer& tr) {
  std::vector<float> v(tr.net().arena().size());
  tr.net().arena().params_to_host(v);
  return v;
}

Config sealed_config(const std::string& dir, bool emulate, int64_t passes) {
  Config c = tiny(dir);
  c.train.steps = 5;
  c.train.accumulate = passes;
  c.comm.overlap = false;  // everything on this thread: a stray access faults deterministically
  c.comm.device_path = "staged";
  c.comm.bucket_bytes = 4096;
  c.check.every = 2;
  c.check.finite = true;
  c.eval.at_end = true;  // the model and its moving average
  c.train.ema = 0.9;
  c.train.clip_grad_norm = 0.05;  // Backend::sum_squares and the scaling through host copies too
  c.optimizer.sgd.freeze = {"layer1.1"};  // their gradients zeroed in the sealed space
  c.checkpoint.at_epoch_end = true;
  if (emulate) c.emulate.compute_ms = 2;
  return c;
}

std::unique_ptr<Trainer> make(const Config& c, bool sealed) {
  TrainerHooks h = fixed_data();
  h.make_net = [sealed](const Config& cfg) {
    if (sealed) return build_resnet<float>(config_resnet(cfg), std::make_unique<test::SealedBackend>(true));
    return build_resnet<float>(config_resnet(cfg), make_backend<float>("reference"));
  };
  return std::make_unique<Trainer>(c, MPI_COMM_WORLD, h);
}

void check_sealed_equals_host(MpiTest& t, const std::string& dir, bool emulate, int64_t passes = 1) {
  const std::string tag = emulate ? "/emulated" : passes > 1 ? "/accumulated" : "/computed";
  auto host = make(sealed_config(dir + tag + "_host", emulate, passes), false);
  host->train();
  auto sealed = make(sealed_config(dir + tag + "_sealed", emulate, passes), true);
  MPI_EXPECT(t, !sealed->net().arena().host_accessible(), "the sealed arena claims host access");
  MPI_EXPECT(t, std::string(sealed->net().backend().name()) == "sealed-reference", "not the sealed backend");
  sealed->train();
  MPI_EXPECT(t, sealed->losses() == host->losses(), tag, ": losses differ from the host arena's");
  const std::vector<float> p = params_of(*sealed);
  MPI_EXPECT(t, p == params_of(*host), tag, ": parameters differ from the host arena's");
  MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(p.data(), p.size() * sizeof(float))),
             tag, ": parameters differ across ranks");
  const EvalResult a = sealed->evaluate(), b = host->evaluate();
  MPI_EXPECT(t, a.top1 == b.top1 && a.loss == b.loss, tag, ": evaluation differs from the host arena's");
  std::vector<float> ep, es, hp, hs;
  sealed->ema_to_host(ep, es);
  host->ema_to_host(hp, hs);
  MPI_EXPECT(t, !ep.empty() && ep == hp && es == hs, tag, ": the moving average differs from the host arena's");

  // The checkpoint the sealed run wrote, loaded into a fresh sealed trainer: the evaluations
  // since have left each rank's BN statistics as the file holds them.
  MPI_EXPECT(t, !sealed->last_checkpoint().empty(), tag, ": no checkpoint written");
  auto again = make(sealed_config(dir + tag + "_again", emulate, passes), true);
  again->load_checkpoint(sealed->last_checkpoint());
  MPI_EXPECT(t, params_of(*again) == p, tag, ": parameters after a checkpoint round trip differ");
  std::vector<float> s1(sealed->net().arena().state().size()), s2(s1.size());
  sealed->net().arena().state_to_host(s1);
  again->net().arena().state_to_host(s2);
  MPI_EXPECT(t, s1 == s2, tag, ": BN statistics after a checkpoint round trip differ");
  std::vector<float> gp, gs;
  again->ema_to_host(gp, gs);
  MPI_EXPECT(t, gp == ep && gs == es, tag, ": the moving average after a checkpoint round trip differs");
  again->check_consistency();
}

}  // namespace
}  // namespace rt::trainer

int main(int argc, char** argv) {
  rt::trainer::register_device_grads(&rt::trainer::sealed_grads);
  using namespace rt::trainer;
  return test_trainer::run_trainer_test(argc, argv, "test_mpi_trainer_sealed", [](rt::test::MpiTest& t,
                                                                                 const std::string& dir) {
    check_sealed_equals_host(t, dir, false);
    check_sealed_equals_host(t, dir, true);
    check_sealed_equals_host(t, dir, false, 2);  // train.accumulate: the sum kept in the sealed space
  });
}

// How often a training step makes the host wait for the device, counted on the emulator, whose
// streams run queued work only when waited for (streams.h). Each wait stalls the host until the
// device catches up, so the host cannot queue the next work while the device is busy; a step
// should wait only where it must read a result, and then only once the device is past it: the
// overflow check that decides whether the update runs. Forward, the logits' export and backward
// are queued back to back; the loss, read after the overflow check, is long done by then.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "cuda/backend.h"
#include "cuda/lowp_backend.h"
#include "nn/resnet.h"
#include "tests/cuda_emu/streams.h"

namespace rt::cuda {
namespace {

struct Waits {
  uint64_t forward = 0, backward = 0, unscale = 0, loss = 0, sgd = 0, sync = 0;
};

Waits count_step_waits(std::unique_ptr<Backend<float>> backend) {
  ResNetConfig cfg;
  cfg.name = "resnet20";  // every kind of layer but max pooling and projections
  cfg.num_classes = 10;
  cfg.image_size = 8;
  cfg.batch = 4;
  cfg.width = 0.25;
  auto net = build_resnet<float>(cfg, std::move(backend));
  auto sgd = net->backend().make_sgd(net->arena().layout(), SgdConfig{});
  net->set_ready_sync(false);
  const std::vector<float> input(size_t(net->shape(0).numel()), 0.5f);
  const std::vector<int32_t> labels(size_t(cfg.batch), 1);
  HostVector<float> logits(size_t(cfg.batch * cfg.num_classes), HostAllocator<float>(net->backend().input_memory()));
  Waits w;
  auto step = [&] {
    uint64_t at = rt_emu::host_waits();
    auto since = [&](uint64_t* out) {
      const uint64_t now = rt_emu::host_waits();
      *out = now - at;
      at = now;
    };
    net->queue_forward(input.data(), labels.data(), true);
    net->export_tensor_queued(net->logits(), logits.data());
    since(&w.forward);
    // As the trainer: each gradient reported in queue order, for a reducer that fences itself.
    net->backward([](size_t) {}, 128.0);
    since(&w.backward);
    net->backend().scale_count_nonfinite(net->arena().grads().data(), net->arena().size(),
                                         1.0f / 128.0f, true);
    since(&w.unscale);
    EXPECT_TRUE(std::isfinite(net->last_loss()));
    since(&w.loss);
    sgd->step(net->arena().params().data(), net->arena().grads().data(), 0.01);
    since(&w.sgd);
    net->backend().sync();
    since(&w.sync);
  };
  for (int i = 0; i < 3; ++i) step();  // the last, steady-state step's counts stay in w
  std::printf("host waits: forward %llu, backward %llu, unscale %llu, loss %llu, sgd %llu, sync %llu\n",
              (unsigned long long)w.forward, (unsigned long long)w.backward,
              (unsigned long long)w.unscale, (unsigned long long)w.loss, (unsigned long long)w.sgd,
              (unsigned long long)w.sync);
  return w;
}

void expect_waits_only_to_read(const Waits& w) {
  EXPECT_EQ(w.forward, 0u) << "forward and the logits' export queued";
  EXPECT_EQ(w.backward, 0u);
  EXPECT_EQ(w.unscale, 1u) << "the count of non-finite gradients";
  EXPECT_EQ(w.loss, 0u) << "the loss, computed before the gradients just waited for";
  EXPECT_EQ(w.sgd, 0u);
  EXPECT_EQ(w.sync, 1u);
}

TEST(emu_step_waits, Fp32) { expect_waits_only_to_read(count_step_waits(make_cuda_backend())); }
TEST(emu_step_waits, Bf16) {
  expect_waits_only_to_read(count_step_waits(make_cuda_lowp_backend(DType::bf16)));
}

}  // namespace
}  // namespace rt::cuda

// Distributed evaluation: each rank runs its share of the validation split (the loader gives
// every sample to exactly one rank, and a short last batch), then the counts are summed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "comm/mpi_check.h"
#include "data/dataset.h"
#include "nn/clock.h"
#include "nn/console.h"
#include "nn/resnet.h"
#include "trainer/stop_signal.h"
#include "trainer/trainer.h"

namespace rt::trainer {

void count_correct(const float* logits, const int32_t* labels, int n, int64_t classes, int64_t& top1,
                   int64_t& top5, double& loss) {
  for (int i = 0; i < n; ++i) {
    const float* z = logits + int64_t(i) * classes;
    const float zl = z[labels[i]];
    // The label's rank: how many classes score strictly higher (ties count against the label
    // only when they come first, as a stable top-k would order them).
    int64_t above = 0;
    float zmax = z[0];
    bool finite = true;  // a NaN compares false with everything: it would rank the label first
    for (int64_t k = 0; k < classes; ++k) {
      above += z[k] > zl || (z[k] == zl && k < labels[i]);
      zmax = std::max(zmax, z[k]);
      finite = finite && std::isfinite(z[k]);
    }
    top1 += finite && above == 0;
    top5 += finite && above < 5;
    double sum = 0;
    for (int64_t k = 0; k < classes; ++k) sum += std::exp(double(z[k]) - double(zmax));
    loss += std::log(sum) - (double(zl) - double(zmax));
  }
}

EvalResult Trainer::evaluate() {
  const double t0 = now_s();
  // Evaluation uses the ranks' average of the BN statistics; each rank's own set is put back
  // afterwards, so that evaluating leaves training as it was (and a resumed run, which evaluates
  // at other steps, still matches). An evaluation network of its own gets the weights and the
  // average instead, and the training network is left alone.
  auto& arena = net_->arena();
  Net<float>& net = eval_net();
  const bool separate = &net != net_.get();
  if (separate) {
    net_->backend().sync();  // the last update done before its copy on the other network's queue
    net.arena().copy_from(arena);
  }
  std::vector<float> own;  // this rank's statistics, put back into training's network afterwards
  if (world_ > 1 && !arena.state().empty()) net.arena().state_from_host(averaged_bn_state(own));
  if (separate) own.clear();  // training's network was not touched
  std::vector<float>& pad_images = separate ? eval_pad_images_ : pad_images_;
  std::vector<uint8_t>& pad_pixels = separate ? eval_pad_pixels_ : pad_pixels_;
  data::Loader& loader = val_loader();
  // skipped() counts every pass's bad images; this evaluation's are the difference. Read before
  // the decode threads start: a known bad image is counted at once.
  const int64_t skipped_before = loader.skipped();
  loader.start_epoch({0, 0});
  const int batch = int(config_eval_batch(cfg_));
  const int64_t classes = classes_;
  const size_t per_image = pad_images.size() / size_t(batch);
  int64_t counts[5] = {0, 0, 0, 0, 0};  // samples, top1, top5, skipped (undecodable), interrupted
  double loss = 0;
  // A stop asked during a training run's evaluation (minutes on real data, past a batch system's
  // grace period) is taken at once: the figures are dropped and the evaluation left pending, for
  // the resume to make first. Each rank looks for itself; the sums below tell every rank.
  const bool interruptible = use_ == Use::train && stop_handlers_installed();
  inject_eval_fault();
  while (loader.next(batch_)) {
    if (interruptible && stop_signal() != 0) {
      counts[4] = 1;
      break;
    }
    const int n = batch_.n;
    if (n == 0) continue;
    if (n > batch) throw Error(str_cat("data: an evaluation batch of ", n, " images (at most ", batch, ")"));
    const bool u8 = cfg_.data.output == data::Output::u8;
    if ((u8 ? batch_.pixels.size() : batch_.images.size()) != size_t(n) * per_image)
      throw Error(str_cat("data: an evaluation batch of ", n, " images holds ",
                          u8 ? batch_.pixels.size() : batch_.images.size(), u8 ? " pixel bytes" : " floats",
                          " (expected ", size_t(n) * per_image, ")"));
    const float* x = batch_.images.data();
    const uint8_t* px = batch_.pixels.data();
    const int32_t* y = batch_.labels.data();
    if (n < batch) {
      // The network is set up for a fixed batch: pad with copies of nothing in particular (BN is
      // in inference mode, so padding cannot affect the real samples) and count only n.
      if (u8) std::memcpy(pad_pixels.data(), px, size_t(n) * per_image);
      else std::memcpy(pad_images.data(), x, size_t(n) * per_image * sizeof(float));
      std::copy(y, y + n, pad_labels_.begin());
      std::fill(pad_labels_.begin() + n, pad_labels_.end(), 0);
      x = pad_images.data();
      px = pad_pixels.data();
      y = pad_labels_.data();
    }
    if (u8) net.forward_u8(px, norm_, y, false);
    else net.forward(x, y, false);
    net.export_tensor(net.logits(), logits_.data());
    counts[0] += n;
    count_correct(logits_.data(), batch_.labels.data(), n, classes, counts[1], counts[2], loss);
  }
  counts[3] = loader.skipped() - skipped_before;
  {
    const CtlWatch w = watch_ctl(comm::StallLabel("the end of an evaluation (its sums)"));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, counts, 5, MPI_INT64_T, MPI_SUM, ctl_comm_->mpi()));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, ctl_comm_->mpi()));
  }
  EvalResult r;
  if (counts[4] > 0) {
    if (!own.empty()) arena.state_from_host(own);
    r.interrupted = true;
    r.seconds = now_s() - t0;
    return r;
  }
  r.samples = counts[0];
  r.top1 = counts[1];
  r.top5 = counts[2];
  r.skipped = counts[3];
  r.loss = counts[0] ? loss / double(counts[0]) : 0;
  r.seconds = now_s() - t0;
  // Undecodable images are left out (each warned about by the loader); every other one counts once.
  if (r.samples + r.skipped != loader.size())
    throw Error(str_cat("evaluation saw ", r.samples, " samples and skipped ", r.skipped,
                        " but the validation split has ", loader.size(),
                        " (the loader's shares must cover each sample exactly once)"));
  if (!own.empty()) arena.state_from_host(own);
  // No figure at all is not a figure of 0 %: it would be logged, compared and kept as a "best".
  if (r.samples == 0)
    throw Error(str_cat("data: no image of the validation split (", data::split_source(cfg_.data, data::Split::val),
                        ") could be read or decoded (", r.skipped, " left out, each named above)"));
  return r;
}

Net<float>& Trainer::eval_net() {
  // Evaluation at another side than training's (data.eval_image_size: FixRes's train-small,
  // test-large effect) or at another batch (eval.batch: forward only needs no activations kept
  // for backward, so a larger batch fits) runs the same model set up once more for that input,
  // forward only, with the weights copied in before each evaluation. Built on first use, kept for
  // the run.
  const int64_t side = data::eval_image_size(cfg_.data);
  const int64_t batch = config_eval_batch(cfg_);
  // (--eval's one network is evaluation's already.)
  if (use_ == Use::evaluate || (side == cfg_.data.image_size && batch == cfg_.train.batch)) return *net_;
  if (!eval_net_) {
    Config c = cfg_;
    c.data.image_size = int(side);
    c.train.batch = batch;
    eval_net_ = build_net(c, true);
    eval_pad_images_.resize(size_t(eval_net_->shape(0).numel()));
    if (cfg_.data.output == data::Output::u8) eval_pad_pixels_.resize(eval_pad_images_.size());
  }
  return *eval_net_;
}

data::Loader& Trainer::val_loader() {
  if (!val_loader_) {
    auto loader = open_loader(data::Split::val);
    if (train_loader_) {
      data::check_split_classes(cfg_.data, train_loader_->class_names(), loader->class_names());
      // Two lists share one class count, so a list numbered from 1 beside one from 0 passes the
      // check: said, as a training list without the top classes (a subset) is fine.
      if (rank_ == 0 && !cfg_.data.val_list.empty() && loader->max_label() > train_loader_->max_label())
        stderr_line(str_cat("ringtrain: warning: validation labels reach ", loader->max_label(), ", training's only ",
                            train_loader_->max_label(), " (", data::split_source(cfg_.data, data::Split::val), ", ",
                            data::split_source(cfg_.data, data::Split::train),
                             "): classes never trained on are evaluated; are both lists numbered from 0?"));
    }
    if (loader->num_classes() > cfg_.model.classes)
      throw ConfigError(str_cat(config_origin(cfg_, "model.classes"), ": model.classes is ", cfg_.model.classes, " but the validation data (",
                                data::split_source(cfg_.data, data::Split::val), ") has ", loader->num_classes(),
                                " classes"));
    val_loader_ = std::move(loader);
    val_loader_->set_batch_memory(eval_net().backend().input_memory());
  }
  return *val_loader_;
}

}  // namespace rt::trainer

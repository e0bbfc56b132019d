// The trainer's checkpoints under mpirun: resume is exact (bitwise) at an epoch boundary and
// mid-epoch (also with accumulated passes, mixup and CutMix with the weights' moving average,
// decoded images through RandAugment and random erasing, AdamW and LAMB, stochastic depth), and
// on another rank count at the same global batch, and refused over other data or optimizers; --weights starts
// from a checkpoint's parameters; checkpoint.keep_best,
// train.target_top1 and checkpoint.every_minutes, each also across a resume.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "comm/mpi_check.h"
#include "tests/error_of.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/trainer_test_util.h"
#include "data/dataset.h"
#include "data/shard.h"
#include "trainer/checkpoint.h"
#include "trainer/trainer.h"

namespace rt::trainer {
namespace {

using test::MpiTest;
using namespace test_trainer;

// A folder of 16x16 PNGs (4 classes x 12 training + 2 validation images, noise over a class
// colour) at root, written by rank 0, with data.auto_augment (RandAugment) and data.random_erasing
// on: the tiny run on decoded, augmented images instead of synthetic tensors.
void use_augmented_images(Config& c, const std::string& root, int rank) {
  if (rank == 0 && !std::filesystem::exists(root)) {
    data::Rng rng(7);
    for (const char* split : {"train", "val"})
      for (int k = 0; k < 4; ++k) {
        const std::string folder = str_cat(root, "/", split, "/c", k);
        std::filesystem::create_directories(folder);
        for (int i = 0; i < (split[0] == 't' ? 12 : 2); ++i) {
          cv::Mat m(16, 16, CV_8UC3);
          for (int j = 0; j < 16 * 16 * 3; ++j) m.data[j] = uint8_t(60 * k * (j % 3 == k % 3) + rng.below(120));
          cv::imwrite(str_cat(folder, "/", i, ".png"), m);
        }
      }
  }
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  c.data.synthetic = false;
  c.data.root = root;
  c.data.auto_augment.policy = data::AutoAugment::randaugment;
  c.data.random_erasing = 0.5f;
}

// Straight through vs stopped at the first epoch's end (or one step later: mid-epoch) and
// resumed with --resume auto.
// mix: train.mixup and train.cutmix both (each batch draws one of them).
// images: decoded and augmented images (use_augmented_images), whose draws must be made again too.
// kind: AdamW and LAMB keep a second moment, which the checkpoint carries too (and a run of
// another optimizer.kind refuses to resume from it).
// drop_path: stochastic depth's masks, drawn again from the step, pass and rank.
void check_exact_resume(MpiTest& t, const std::string& dir, bool mid_epoch, int64_t passes = 1, double mix = 0,
                        double ema = 0, bool images = false, OptimizerKind kind = OptimizerKind::sgd,
                        double drop_path = 0) {
  const std::string tag =
      str_cat(mid_epoch, "_", passes, "_", mix, "_", ema, "_", images, "_", int(kind), "_", drop_path);
  // Every run of the comparison: the same settings, its own folder.
  auto config = [&](const std::string& run) {
    Config c = tiny(dir + "/" + run + tag);
    c.optimizer.sgd.kind = kind;
    if (kind != OptimizerKind::sgd) c.optimizer.lr = 0.256;  // base lr 0.004 at 4 images a step
    c.model.drop_path = drop_path;
    c.train.accumulate = passes;
    c.train.mixup = c.train.cutmix = mix;
    c.train.ema = ema;
    if (images) use_augmented_images(c, dir + "/images", t.rank());
    return c;
  };
  Config a = config("straight");
  Trainer ta(a);
  ta.train();
  const int64_t stop = ta.steps_per_epoch() + (mid_epoch ? 1 : 0);
  Config b = config("resumed");
  b.train.steps = stop;
  {
    Trainer tb(b);
    tb.train();
  }
  b.train.steps = 0;
  if (kind != OptimizerKind::sgd && t.rank() == 0) {
    // The file's optimizer state is Adam's: plain SGD refuses it. One rank alone (the error is
    // rank 0's, before any collective), at the same global batch.
    Config other = b;
    other.optimizer.sgd.kind = OptimizerKind::sgd;
    other.optimizer.lr = 6.4;
    other.train.batch *= t.size();
    const std::string e = rt_test::error_of([&] { Trainer(other, MPI_COMM_SELF).resume("auto"); });
    MPI_EXPECT(t, e.find("kept a second moment (adamw or lamb); this run's optimizer.kind is sgd") != std::string::npos,
               "resuming an Adam checkpoint with SGD: '", e, "'");
  }
  Trainer tb(b);
  const std::string loaded = tb.resume("auto");
  MPI_EXPECT(t, tb.step() == stop, "resumed at step ", tb.step(), " from '", loaded, "'");
  tb.train();
  auto pa = ta.net().arena().params(), pb = tb.net().arena().params();
  MPI_EXPECT(t, std::memcmp(pa.data(), pb.data(), pa.size_bytes()) == 0,
             "resume after step ", stop, " is not bitwise exact");
  auto ma = ta.optimizer().momentum(), mb = tb.optimizer().momentum();
  MPI_EXPECT(t, std::memcmp(ma.data(), mb.data(), ma.size_bytes()) == 0, "momentum differs after resume");
  auto va = ta.optimizer().second_moment(), vb = tb.optimizer().second_moment();
  MPI_EXPECT(t, va.size() == vb.size() && (kind == OptimizerKind::sgd) == va.empty() &&
                    (va.empty() || std::memcmp(va.data(), vb.data(), va.size_bytes()) == 0),
             "second moment differs after resume (", va.size(), " and ", vb.size(), " values)");
  // Each rank's own BN statistics too, though the resumed run checkpointed (and so averaged them
  // over the ranks for the file) at a step where the straight run did not.
  auto sa = ta.net().arena().state(), sb = tb.net().arena().state();
  MPI_EXPECT(t, std::memcmp(sa.data(), sb.data(), sa.size_bytes()) == 0, "BN statistics differ after resume");
  MPI_EXPECT(t, ta.optimizer().steps() == tb.optimizer().steps(), "optimizer step counts differ");
  MPI_EXPECT(t, ta.has_ema() == (ema > 0) && tb.has_ema() == (ema > 0), "moving average kept: ", ta.has_ema(), ", ",
             tb.has_ema());
  if (ema > 0) {  // this rank's own statistics' average included
    std::vector<float> epa, esa, epb, esb;
    ta.ema_to_host(epa, esa);
    tb.ema_to_host(epb, esb);
    MPI_EXPECT(t, epa == epb && esa == esb, "the moving average of the weights differs after resume");
  }
  if (images) {  // the augmentation reached the training: no step's loss is the plain images' one
    Config c = config("plain");
    c.data.auto_augment.policy = data::AutoAugment::none;
    c.data.random_erasing = 0;
    Trainer tc(c);
    tc.train();
    MPI_EXPECT(t, tc.losses().size() == ta.losses().size() && !ta.losses().empty(), "steps run: ",
               ta.losses().size(), " and ", tc.losses().size());
    for (size_t i = 0; i < ta.losses().size() && i < tc.losses().size(); ++i)
      MPI_EXPECT(t, ta.losses()[i] != tc.losses()[i], "step ", i + 1, " loss ", ta.losses()[i],
                 " augmented equals the plain images' ", tc.losses()[i]);
  }
}

// A resume that would go on from other state than the file's is refused, naming what differs:
// another optimizer of Adam's family (whose moments the file holds); mid-epoch, other training
// data (one image more, repeated augmentation, a file renamed: the rest of the epoch would be
// another order's) or, at any step, other class names (the labels would mean other classes).
void check_resume_refusals(MpiTest& t, const std::string& dir) {
  const std::string images = dir + "/images";
  Config b = tiny(dir + "/refusals");
  b.optimizer.sgd.kind = OptimizerKind::adamw;
  b.optimizer.lr = 0.256;
  use_augmented_images(b, images, t.rank());
  b.train.steps = 48 / (b.train.batch * t.size()) + 1;  // one step into the second epoch
  {
    Trainer tb(b);
    tb.train();
  }
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  if (t.rank() != 0) return;
  namespace fs = std::filesystem;
  // Rank 0 alone at the same global batch: the errors are its own, before any collective.
  const auto refused = [&](Config other, const std::string& want, const char* what) {
    other.train.batch *= t.size();
    const std::string e = rt_test::error_of([&] { Trainer(other, MPI_COMM_SELF).resume("auto"); });
    MPI_EXPECT(t, e.find(want) != std::string::npos, what, ": '", e, "' (expected '", want, "')");
  };
  const auto copy = [&](const std::string& name) {
    const std::string to = dir + "/" + name;
    fs::remove_all(to);
    fs::copy(images, to, fs::copy_options::recursive);
    Config c = b;
    c.data.root = to;
    return c;
  };
  Config o = b;
  o.optimizer.sgd.kind = OptimizerKind::lamb;
  refused(o, "another optimizer (optimizer.kind: adamw in the file, lamb here)", "AdamW's file, LAMB's run");
  o = b;
  o.data.repeated_augment = 2;
  refused(o, "data.repeated_augment 1 in the file, 2 here", "mid-epoch, repeated augmentation");
  o = copy("images_more");  // 49 images: as many steps per epoch
  fs::copy_file(o.data.root + "/train/c0/0.png", o.data.root + "/train/c0/extra.png");
  refused(o, "48 training samples in the file, 49 here", "mid-epoch, one image more");
  o = copy("images_renamed_file");
  fs::rename(o.data.root + "/train/c0/0.png", o.data.root + "/train/c0/z.png");
  refused(o, "as many samples, with other labels or file names in sample order", "mid-epoch, a file renamed");
  // The same data elsewhere, or packed into shard sets, goes on.
  const auto accepted = [&](Config other, const char* what) {
    other.train.batch *= t.size();
    const std::string e = rt_test::error_of([&] { Trainer(other, MPI_COMM_SELF).resume("auto"); });
    MPI_EXPECT(t, e.empty(), what, ": '", e, "'");
  };
  accepted(copy("images_same"), "mid-epoch, the same images under another root");
  o = b;
  o.data.root.clear();
  for (const auto split : {data::Split::train, data::Split::val}) {
    const std::string name = split == data::Split::train ? "train" : "val";
    data::pack_shards(*data::open_folder(images, split), name, dir + "/shards/" + name, 1 << 20, images);
    (split == data::Split::train ? o.data.train_shards : o.data.val_shards) = dir + "/shards/" + name + ".index";
  }
  accepted(o, "mid-epoch, the same images packed into shard sets");
  o = copy("images_renamed_class");
  for (const char* split : {"/train/", "/val/"}) fs::rename(o.data.root + split + "c3", o.data.root + split + "d3");
  refused(o, "names (4 and 4; label 3 is 'c3' in the file, 'd3' here): the same label would mean another class",
          "other class names");
}

// Resuming on another rank count at the same global batch. With one sample per rank and pass,
// N ranks x batch 1 and 1 rank x batch 1 x N passes put the same samples into the same batch norm
// groups in the same order, so a run that goes from N ranks to rank 0 alone mid-epoch and back to
// N ranks in the next epoch must end where the straight N-rank run does: bit for bit on 2 ranks
// (halving is exact, and the accumulation's g0/2 + g1/2 is the ring's (g0 + g1)/2), within
// rounding on 3 (thirds are not exact).
void check_elastic_resume(MpiTest& t, const std::string& dir) {
  const int n = t.size();
  if (n == 1) return;
  auto config = [&](const std::string& sub, int64_t passes, int64_t steps) {
    Config c = tiny(dir + sub);
    c.train.batch = 1;
    c.train.accumulate = passes;
    c.train.steps = steps;
    return c;
  };
  Trainer ta(config("/elastic_straight", 1, 0));
  ta.train();
  const int64_t per_epoch = ta.steps_per_epoch(), first = per_epoch / 2, second = per_epoch + per_epoch / 2;
  {
    Trainer tb(config("/elastic", 1, first));
    tb.train();
  }
  int64_t alone_at = -1;
  if (t.rank() == 0) {
    Trainer tc(config("/elastic", n, second), MPI_COMM_SELF);
    tc.resume("auto");
    alone_at = tc.step();
    tc.train();
  }
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  Trainer td(config("/elastic", 1, 0));
  td.resume("auto");
  const int64_t back_at = td.step();
  td.train();
  if (t.rank() == 0)
    MPI_EXPECT(t, alone_at == first && back_at == second, "resumed alone at step ", alone_at, " (expected ", first,
               "), back on ", n, " ranks at ", back_at, " (expected ", second, ")");
  MPI_EXPECT(t, td.step() == ta.step() && td.optimizer().steps() == ta.optimizer().steps(), "ended at step ",
             td.step(), ", the straight run at ", ta.step());
  auto pa = ta.net().arena().params(), pd = td.net().arena().params();
  auto ma = ta.optimizer().momentum(), md = td.optimizer().momentum();
  if (n == 2) {
    MPI_EXPECT(t, std::memcmp(pa.data(), pd.data(), pa.size_bytes()) == 0,
               "2 ranks -> 1 rank x 2 passes -> 2 ranks: parameters differ from the straight run");
    MPI_EXPECT(t, std::memcmp(ma.data(), md.data(), ma.size_bytes()) == 0, "momentum differs");
    return;
  }
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i)
    worst = std::max(worst, std::abs(double(pd[i]) - pa[i]) / (1e-3 + std::abs(double(pa[i]))));
  MPI_EXPECT(t, worst < 1e-4, n, " ranks -> 1 rank x ", n, " passes -> ", n,
             " ranks: worst relative parameter difference ", worst);
}

// --weights: every rank starts from the checkpoint's parameters and averaged BN statistics (all
// of them for the same model; all but the classifier for one with another class count, whose
// fc keeps its initialisation), at step 0 with no momentum, and trains on from there.
void check_weights(MpiTest& t, const std::string& dir) {
  Config a = tiny(dir + "/weights_source");
  a.train.epochs = 1;
  Trainer ta(a);
  ta.train();
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // rank 0 may still be writing the checkpoint
  const std::string path = checkpoint_list(dir + "/weights_source/checkpoints").front();
  const Checkpoint ck = checkpoint_read(path);  // every rank reads it here, for the comparison
  for (int classes : {4, 3}) {
    Config c = tiny(str_cat(dir, "/weights_", classes));
    c.model.classes = classes;
    c.data.synthetic_classes = classes;
    c.train.steps = 2;
    Trainer tc(c);
    auto& arena = tc.net().arena();
    const std::vector<float> init(arena.params().begin(), arena.params().end());
    tc.load_weights(path);
    MPI_EXPECT(t, tc.step() == 0 && tc.optimizer().steps() == 0, classes, " classes: not a fresh start");
    auto p = arena.params();
    std::map<std::string, const CheckpointTensor*> theirs;
    for (const auto& tensor : ck.layout) theirs[tensor.name] = &tensor;
    size_t from_file = 0, as_init = 0;
    for (const ParamInfo& info : arena.layout()) {
      const bool fc = info.name.rfind("fc.", 0) == 0 && classes != 4;
      const float* want = fc ? init.data() + info.offset : ck.params.data() + theirs.at(info.name)->offset;
      MPI_EXPECT(t, std::memcmp(p.data() + info.offset, want, info.count * sizeof(float)) == 0, classes,
                 " classes: ", info.name, fc ? " is not as initialised" : " is not the checkpoint's");
      ++(fc ? as_init : from_file);
    }
    MPI_EXPECT(t, as_init == (classes == 4 ? 0u : 2u) && from_file + as_init == arena.layout().size(), classes,
               " classes: ", from_file, " tensors from the file, ", as_init, " as initialised");
    auto st = arena.state();
    MPI_EXPECT(t, std::memcmp(st.data(), ck.state.data(), st.size_bytes()) == 0, classes,
               " classes: BN statistics are not the checkpoint's average");
    tc.train();
    MPI_EXPECT(t, tc.step() == 2, classes, " classes: trained to step ", tc.step());
  }
}

// checkpoint.keep_best over 4 epochs, evaluated after each, keeping 1 checkpoint: best.rtck is
// the checkpoint of the first evaluation with the run's highest top-1 (from the epoch records),
// its record in its meta, and outlives pruning; the same run stopped after 2 epochs and resumed
// goes on from the record its checkpoint holds, to the same best.rtck (at 2 and 3 ranks the first
// epoch's is the best: a resumed run that forgot it would pick its own first evaluation's).
void check_keep_best(MpiTest& t, const std::string& dir) {
  auto config = [&](const std::string& tag) {
    Config c = tiny(dir + "/best_" + tag);
    c.train.epochs = 4;
    c.checkpoint.keep = 1;
    c.checkpoint.keep_best = true;
    c.log.jsonl = "";  // rank 0's, in the run folder
    return c;
  };
  const Config straight = config("straight");
  Trainer ts(straight);
  ts.train();
  Config resumed = config("resumed");
  resumed.train.steps = 2 * ts.steps_per_epoch();
  Trainer(resumed).train();
  resumed.train.steps = 0;
  {
    Trainer tr(resumed);
    tr.resume("auto");
    tr.train();
  }
  if (t.rank() != 0) return;
  for (const Config* c : {&straight, static_cast<const Config*>(&resumed)}) {
    std::ifstream f(c->run_dir + "/metrics.jsonl");
    const std::regex re(R"re("type":"epoch".*"step":(\d+).*"val_top1":([0-9.eE+-]+))re");
    int64_t best_step = 0, evals = 0;
    double best = -1;
    std::string scores;
    for (std::string line; std::getline(f, line);) {
      std::smatch m;
      if (!std::regex_search(line, m, re)) continue;
      ++evals;
      scores += str_cat(" ", m[2].str());
      if (std::stod(m[2]) > best) best = std::stod(m[2]), best_step = std::stoll(m[1]);
    }
    const std::string ckdir = c->run_dir + "/checkpoints";
    const Checkpoint b = checkpoint_read(checkpoint_best_path(ckdir));
    MPI_EXPECT(t, evals == 4 && b.meta.step == best_step && b.meta.best_step == best_step &&
                      std::abs(b.meta.best_top1 - best) < 1e-4,
               c->run_dir, ": evaluations' top-1", scores, ", best.rtck of step ", b.meta.step, " (its record: ",
               b.meta.best_top1, "% at step ", b.meta.best_step, ")");
    MPI_EXPECT(t, checkpoint_list(ckdir) == std::vector<std::string>{checkpoint_path(ckdir, 4 * ts.steps_per_epoch())},
               ckdir, ": not the last checkpoint alone");
  }
}

// A resumed run whose best checkpoint is not best.rtck (keep_best turned on now; or best.rtck set
// aside with a later history's files) makes it so from the record in the file it resumes from,
// before pruning could take that checkpoint (the resumed run stops before it evaluates again).
void check_keep_best_from_the_record(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/best_later");
  const int64_t per_epoch = 48 / (c.train.batch * t.size());
  c.train.epochs = 3;
  c.train.steps = 2 * per_epoch;
  c.checkpoint.keep = 10;
  c.log.jsonl = "";
  Trainer(c).train();
  c.train.steps = 2 * per_epoch + 1;
  c.eval.at_end = false;  // no third evaluation: best.rtck can only be the record's
  c.checkpoint.keep = 1;
  c.checkpoint.keep_best = true;
  int64_t record = 0;
  {
    Trainer tr(c);
    tr.resume("auto");
    record = tr.best_step();
    tr.train();
  }
  if (t.rank() != 0) return;
  std::ifstream f(c.run_dir + "/metrics.jsonl");
  const std::regex re(R"re("type":"epoch".*"step":(\d+).*"val_top1":([0-9.eE+-]+))re");
  int64_t best_step = 0;
  double best = -1;
  for (std::string line; std::getline(f, line);)
    if (std::smatch m; std::regex_search(line, m, re) && std::stod(m[2]) > best)
      best = std::stod(m[2]), best_step = std::stoll(m[1]);
  const std::string ckdir = c.run_dir + "/checkpoints";
  const std::string path = checkpoint_best_path(ckdir);
  MPI_EXPECT(t, record > 0 && record == best_step && std::filesystem::exists(path) &&
                    checkpoint_read(path).meta.step == best_step &&
                    checkpoint_list(ckdir) == std::vector<std::string>{checkpoint_path(ckdir, c.train.steps)},
             "best.rtck after turning keep_best on at a resume: the record was step ", record,
             ", the best evaluation step ", best_step, ", best.rtck ",
             std::filesystem::exists(path) ? str_cat("of step ", checkpoint_read(path).meta.step) : "missing");
}

// Marks the checkpoint at `path` as a stopped run's whose evaluation at its step was skipped
// (rank 0 rewrites it; every rank waits).
void mark_eval_pending(MpiTest& t, const std::string& path) {
  if (t.rank() == 0) {
    Checkpoint ck = checkpoint_read(path);
    ck.meta.eval_pending = true;
    checkpoint_write(path, ck.meta, ck.config_yaml, ck.params, ck.state, ck.momentum, ck.rank_state, ck.layout,
                     ck.ema, ck.ema_rank_state, ck.moment2, ck.classes, ck.tensor_steps);
  }
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

// A stop at the end of an epoch skips its evaluation (a preemption's notice is short), and the
// checkpoint says so: the resume makes it first, to the figures the run would have had there
// (here the file of a run that did evaluate, marked as a stopped one's), in a "validation" record.
void check_pending_evaluation(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/pending");
  c.log.jsonl = "";
  const int64_t per_epoch = 48 / (c.train.batch * t.size());
  c.train.steps = per_epoch;
  Trainer(c).train();
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  mark_eval_pending(t, checkpoint_path(c.run_dir + "/checkpoints", per_epoch));
  c.train.steps = per_epoch + 1;
  {
    Trainer tr(c);
    tr.resume("auto");
    tr.train();
  }
  if (t.rank() != 0) return;
  std::ifstream f(c.run_dir + "/metrics.jsonl");
  const std::regex re(R"re("type":"(epoch|validation)".*"step":(\d+).*"val_top1":([0-9.eE+-]+))re");
  std::vector<std::string> found;
  for (std::string line; std::getline(f, line);)
    if (std::smatch m; std::regex_search(line, m, re) && std::stoll(m[2]) == per_epoch)
      found.push_back(m[1].str() + " " + m[3].str());
  MPI_EXPECT(t, found.size() == 2 && found[0].rfind("epoch ", 0) == 0 && found[1].rfind("validation ", 0) == 0 &&
                    found[0].substr(6) == found[1].substr(11),
             "the evaluation at step ", per_epoch, " made again by the resume: ", found.size(), " records",
             found.size() == 2 ? str_cat(" (", found[0], "; ", found[1], ")") : std::string());
}

// eval.every_steps 2: a "validation" record after every second step within the epochs, the epoch
// records at their ends as ever, each with what --eval scores on the checkpoint saved at its step
// (checkpoint.every_steps 2); such a validation that a stop skipped (marked so in the checkpoint,
// as check_pending_evaluation does) is made first by the resume, to the same figures.
void check_eval_every_steps(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/every_steps");
  c.log.jsonl = "";
  c.eval.every_steps = 2;
  c.checkpoint.every_steps = 2;
  c.checkpoint.keep = 100;
  const int64_t per_epoch = 48 / (c.train.batch * t.size()), total = 2 * per_epoch;  // 12, 6, 4 a epoch
  Trainer(c).train();
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  const std::string ckdir = c.run_dir + "/checkpoints";
  // {step: (record type, val_loss, val_top1)} from rank 0's file, known to every rank.
  std::map<int64_t, std::tuple<std::string, double, double>> got;
  const std::regex re(R"re("type":"(epoch|validation)".*"step":(\d+).*"val_loss":([0-9.eE+-]+),"val_top1":([0-9.eE+-]+))re");
  {
    std::ifstream f(c.run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);)
      if (std::smatch m; std::regex_search(line, m, re))
        got[std::stoll(m[2])] = {m[1].str(), std::stod(m[3]), std::stod(m[4])};
  }
  std::string want, seen;
  for (int64_t s = 1; s <= total; ++s)
    if (s % 2 == 0 || s % per_epoch == 0) want += str_cat(" ", s, s % per_epoch ? "v" : "e");
  for (const auto& [s, r] : got) seen += str_cat(" ", s, std::get<0>(r) == "epoch" ? "e" : "v");
  MPI_EXPECT(t, seen == want, "evaluations at steps (e: epoch, v: validation)", seen, ", expected", want);
  Config e = c;
  e.run_dir = dir + "/every_steps_eval";
  e.log.jsonl = "none";
  for (const auto& [s, r] : got) {
    if (std::get<0>(r) != "validation") continue;
    Trainer te(e, MPI_COMM_WORLD, {}, Trainer::Use::evaluate);
    te.load_checkpoint(checkpoint_path(ckdir, s), false);
    const EvalResult v = te.evaluate();
    MPI_EXPECT(t, std::abs(v.loss - std::get<1>(r)) <= 1e-7 * std::abs(v.loss) &&
                      std::abs(v.top1_pct() - std::get<2>(r)) < 1e-6,  // the file's 9 digits
               "step ", s, ": the run's validation loss ", std::get<1>(r), " top-1 ", std::get<2>(r),
               ", --eval of its checkpoint ", v.loss, " top-1 ", v.top1_pct());
  }
  // The first mid-epoch validation, skipped by a stop: made first by the resume.
  Config p = c;
  p.run_dir = dir + "/every_steps_pending";
  p.train.steps = 2;
  p.eval.at_end = false;  // the run's end is mid-epoch: only the step rule evaluates there
  Trainer(p).train();
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  mark_eval_pending(t, checkpoint_path(p.run_dir + "/checkpoints", 2));
  p.train.steps = 3;
  {
    Trainer tr(p);
    tr.resume("auto");
    tr.train();
  }
  if (t.rank() != 0) return;
  std::ifstream f(p.run_dir + "/metrics.jsonl");
  std::vector<std::string> at2;
  for (std::string line; std::getline(f, line);)
    if (std::smatch m; std::regex_search(line, m, re) && m[2] == "2") at2.push_back(str_cat(m[1].str(), " ", m[3].str()));
  MPI_EXPECT(t, at2.size() == 2 && at2[0].rfind("epoch ", 0) == 0 && at2[1].rfind("validation ", 0) == 0 &&
                    at2[0].substr(6) == at2[1].substr(11),
             "step 2's evaluation, made again by the resume: ", at2.size(), " records",
             at2.size() == 2 ? str_cat(" (", at2[0], "; ", at2[1], ")") : std::string());
}

// train.target_top1: a target the first evaluation reaches ends a 4-epoch run after epoch 1, with
// a checkpoint of that step and a "target" record; resumed, the record in the checkpoint says the
// target is reached (nothing to train); with a target no evaluation reaches, the resumed run goes
// on to its end.
void check_target_top1(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/target");
  c.train.epochs = 4;
  c.train.target_top1 = 1;  // 4 learnable classes: the first evaluation is far above 1%
  c.log.jsonl = "";
  int64_t spe = 0;
  {
    Trainer tr(c);
    spe = tr.steps_per_epoch();
    tr.train();
    MPI_EXPECT(t, tr.step() == spe && tr.last_checkpoint() == checkpoint_path(c.run_dir + "/checkpoints", spe),
               "target reached: stopped at step ", tr.step(), " (", spe, " per epoch), checkpoint '",
               tr.last_checkpoint(), "'");
  }
  {
    Trainer tr(c);
    tr.resume("auto");
    tr.train();
    MPI_EXPECT(t, tr.step() == spe, "resumed after reaching the target: trained on to step ", tr.step());
  }
  // Reached by the evaluation at a run's end in the middle of epoch 2 (train.steps): the record
  // names epoch 2, as that step's epoch record does.
  Config mid = tiny(dir + "/target_mid");
  mid.train.epochs = 4;
  mid.train.steps = spe + 1;
  mid.eval.every_epochs = 2;
  mid.eval.at_end = true;
  mid.train.target_top1 = 1;
  mid.log.jsonl = "";
  Trainer(mid).train();
  c.train.target_top1 = 100;  // every validation image right: not after these few steps (else a record says so)
  Trainer tr(c);
  tr.resume("auto");
  tr.train();
  if (t.rank() != 0) return;
  std::ifstream f(c.run_dir + "/metrics.jsonl");
  const std::string log((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string target = str_cat("{\"type\":\"target\",\"step\":", spe, ",\"epoch\":1,");
  MPI_EXPECT(t, log.find(target) != std::string::npos && log.find("\"target_top1\":1,") != std::string::npos,
             "no target record '", target, "...' in the metrics");
  MPI_EXPECT(t, tr.step() == 4 * spe || log.find("\"target_top1\":100,") != std::string::npos,
             "with an unreached target the resumed run ended at step ", tr.step());
  std::ifstream fm(mid.run_dir + "/metrics.jsonl");
  const std::string mlog((std::istreambuf_iterator<char>(fm)), std::istreambuf_iterator<char>());
  const std::string want = str_cat("{\"type\":\"target\",\"step\":", spe + 1, ",\"epoch\":2,");
  MPI_EXPECT(t, mlog.find(want) != std::string::npos, "no target record '", want, "...' in ", mlog);
}

// checkpoint.every_minutes, decided by rank 0's clock and agreed by every rank (a rank left out
// of the collective save would hang the test): a period shorter than any step saves after every
// step; a long one adds nothing to the epoch's own checkpoint.
void check_timed_checkpoints(MpiTest& t, const std::string& dir) {
  for (const double minutes : {1e-7, 1000.0}) {
    Config c = tiny(dir + (minutes < 1 ? "/timed_short" : "/timed_long"));
    c.train.epochs = 1;
    c.checkpoint.every_minutes = minutes;
    c.checkpoint.keep = 100;
    Trainer tr(c);
    tr.train();
    MPI_Barrier(MPI_COMM_WORLD);  // rank 0 writes the files after the collective part of a save
    const size_t files = checkpoint_list(c.run_dir + "/checkpoints").size();
    const size_t want = minutes < 1 ? size_t(tr.steps_per_epoch()) : 1;
    MPI_EXPECT(t, files == want, "checkpoint.every_minutes ", minutes, ": ", files, " checkpoints, expected ", want);
  }
  // Periodic saves without the epoch's: the run's last step is saved too (5 steps, every 3).
  Config c = tiny(dir + "/every3");
  c.train.steps = 5;
  c.checkpoint.at_epoch_end = false;
  c.checkpoint.every_steps = 3;
  c.checkpoint.keep = 100;
  Trainer tr(c);
  tr.train();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto list = checkpoint_list(c.run_dir + "/checkpoints");
  MPI_EXPECT(t, list.size() == 2 && tr.last_checkpoint() == checkpoint_path(c.run_dir + "/checkpoints", 5),
             "every_steps 3 over 5 steps: ", list.size(), " checkpoints, the last '", tr.last_checkpoint(), "'");
}

}  // namespace
}  // namespace rt::trainer

int main(int argc, char** argv) {
  using namespace rt::trainer;
  return test_trainer::run_trainer_test(argc, argv, "test_mpi_trainer_resume", [](rt::test::MpiTest& t, const std::string& dir) {
    check_keep_best(t, dir);
    check_keep_best_from_the_record(t, dir);
    check_pending_evaluation(t, dir);
    check_eval_every_steps(t, dir);
    check_target_top1(t, dir);
    check_timed_checkpoints(t, dir);
    check_exact_resume(t, dir, false);
    check_exact_resume(t, dir, true);
    check_exact_resume(t, dir, true, 2);
    check_exact_resume(t, dir, true, 2, 0.4, 0.9);  // mixup's and CutMix's draws made again, the average kept
    check_exact_resume(t, dir, true, 1, 0, 0, true);  // RandAugment's and random erasing's draws made again
    check_exact_resume(t, dir, true, 1, 0, 0, false, rt::OptimizerKind::adamw);
    check_exact_resume(t, dir, true, 2, 0, 0, false, rt::OptimizerKind::lamb);
    check_exact_resume(t, dir, true, 2, 0, 0, false, rt::OptimizerKind::sgd, 0.3);
    check_elastic_resume(t, dir);
    check_resume_refusals(t, dir);
    check_weights(t, dir);
  });
}

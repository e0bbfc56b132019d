// The trainer under mpirun: replicas stay bitwise identical and a diverged rank is named; resume
// is exact (bitwise) at an epoch boundary and mid-epoch (also with accumulated passes, and on
// decoded images through RandAugment and random erasing); N ranks x
// batch b, or x batch b/2 x 2 accumulated passes, equal 1 rank x batch N*b (a model without batch
// norm); evaluation counts every sample once; data.output u8 trains and
// evaluates exactly as float; golden losses.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "comm/mpi_check.h"
#include "data/mixup.h"
#include "tests/error_of.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/trainer_test_util.h"
#include "trainer/checkpoint.h"
#include "trainer/emulate.h"
#include "trainer/trainer.h"

namespace rt::trainer {
namespace {

using test::MpiTest;
using namespace test_trainer;

void check_identical_and_divergence(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/ident");
  c.train.steps = 3;
  Trainer tr(c);
  tr.train();
  MPI_EXPECT(t, test::same_on_all_ranks(params_hash(tr)), "parameters differ across ranks");
  MPI_EXPECT(t, tr.step() == 3, "step ", tr.step());
  if (t.size() < 2) return;
  if (t.rank() == t.size() - 1) tr.net().arena().params()[0] += 1.0f;
  std::string msg;
  try {
    tr.check_consistency();
  } catch (const CommError& e) {
    msg = e.what();
  }
  MPI_EXPECT(t, msg.find(str_cat("rank(s) ", t.size() - 1, " differ from rank 0")) != std::string::npos,
             "divergence not named: '", msg, "'");
}

// comm.compression bf16: the replicas stay bitwise identical, the metrics say what went on the
// wire, and three steps land near the uncompressed run's parameters but (with several ranks) not
// on them.
void check_compressed_gradients(MpiTest& t, const std::string& dir) {
  Config plain = tiny(dir + "/plain"), comp = tiny(dir + "/bf16");
  plain.train.steps = comp.train.steps = 3;
  comp.comm.compression = "bf16";
  comp.log.jsonl = "";  // rank 0's, in the run folder
  Trainer tp(plain), tc(comp);
  tp.train();
  tc.train();
  MPI_EXPECT(t, test::same_on_all_ranks(params_hash(tc)), "compressed: parameters differ across ranks");
  auto a = tp.net().arena().params(), b = tc.net().arena().params();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(a[i])));
  }
  MPI_EXPECT(t, worst <= 1e-2 * scale, "compressed parameters off by ", worst, " (max |p| ", scale, ")");
  if (t.size() > 1) MPI_EXPECT(t, worst > 0, "compressed run equals the plain one: not compressed?");
  if (t.rank() != 0) return;
  std::ifstream f(comp.run_dir + "/metrics.jsonl");
  const std::string log((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  MPI_EXPECT(t, log.find("\"comm_wire\":\"bf16\"") != std::string::npos, "metrics: no comm_wire bf16");
}

// comm.algorithm hierarchical in the trainer: with one rank per node its cross-node ring is the
// whole ring, and with one node its node's ring is, so both runs end bitwise where the flat
// ring's does (the trainer, the agreement check and the bucketed reducer all take it).
void check_hierarchical(MpiTest& t, const std::string& dir) {
  Config ring = tiny(dir + "/hier-ring");
  ring.train.steps = 3;
  Trainer tr(ring);
  tr.train();
  const uint64_t want = params_hash(tr);
  for (int per_node : {1, t.size()}) {
    Config c = tiny(dir + "/hier-" + std::to_string(per_node));
    c.train.steps = 3;
    c.comm.algorithm = "hierarchical";
    c.comm.ranks_per_node = per_node;
    Trainer th(c);
    th.train();
    MPI_EXPECT(t, test::same_on_all_ranks(params_hash(th)), "hierarchical: parameters differ across ranks");
    MPI_EXPECT(t, params_hash(th) == want, "hierarchical, ", per_node,
               " ranks per node: parameters differ from the ring's");
  }
}

// train.clip_grad_norm, one step from the same start (momentum and weight decay 0, so the update
// is lr times the gradient), with static loss scaling and two accumulated passes: a limit above
// the norm changes nothing, bit for bit (nor does log.grad_norm, which reports the same norm
// without clipping); the norm reported is that of the step's whole unscaled
// gradient (the update's length over lr), the same on every rank; a limit of a quarter of it
// scales the whole update by limit / (norm + 1e-6), and the epoch says so.
void check_clip_grad_norm(MpiTest& t, const std::string& dir) {
  auto config = [&](const std::string& tag, double limit) {
    Config c = tiny(dir + "/clip_" + tag);
    c.train.steps = 1;
    c.train.batch = 2;
    c.train.accumulate = 2;
    c.optimizer.sgd.momentum = 0;
    c.optimizer.sgd.weight_decay = 0;
    c.loss_scale.mode = "static";
    c.loss_scale.init = 1024;
    c.train.clip_grad_norm = limit;
    c.log.jsonl = c.run_dir + "/metrics-{rank}.jsonl";
    return c;
  };
  // The step record's grad_norm and lr, and the epoch record's clipped_steps, from this rank's file.
  auto read = [&](const Config& c, double& norm, double& lr, int64_t& clipped) {
    std::ifstream f(c.run_dir + "/metrics-" + std::to_string(t.rank()) + ".jsonl");
    norm = lr = -2;
    clipped = -2;
    std::smatch m;
    for (std::string line; std::getline(f, line);) {
      if (std::regex_search(line, m, std::regex(R"("grad_norm":([-0-9.eE+]+))"))) norm = std::stod(m[1]);
      if (std::regex_search(line, m, std::regex(R"("type":"step".*"lr":([-0-9.eE+]+))"))) lr = std::stod(m[1]);
      if (std::regex_search(line, m, std::regex(R"("clipped_steps":(\d+))"))) clipped = std::stoll(m[1]);
    }
  };
  auto run = [&](const Config& c, std::vector<float>& start) {
    Trainer tr(c);
    auto p = tr.net().arena().params();
    start.assign(p.begin(), p.end());
    tr.train();
    p = tr.net().arena().params();
    return std::vector<float>(p.begin(), p.end());
  };
  std::vector<float> p0, p0b, p0c;
  Config off = config("off", 0);
  off.log.grad_norm = true;  // the norm reported, nothing clipped
  const Config high = config("high", 1e30);
  const std::vector<float> a = run(off, p0), b = run(high, p0b);
  MPI_EXPECT(t, p0 == p0b && a == b, "a limit above the norm changed the update");
  double norm = 0, lr = 0, norm_off = 0;
  int64_t clipped = 0;
  read(off, norm_off, lr, clipped);
  read(high, norm, lr, clipped);
  MPI_EXPECT(t, norm_off == norm, "log.grad_norm without clipping reports ", norm_off, ", clipping ", norm);
  MPI_EXPECT(t, norm > 0 && lr > 0 && clipped == 0, "no grad_norm (", norm, "), lr (", lr, ") or clipped_steps (",
             clipped, ") reported");
  MPI_EXPECT(t, test::same_on_all_ranks(std::hash<double>{}(norm)), "the gradient's norm differs across ranks");
  double len2 = 0, biggest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    len2 += (double(p0[i]) - a[i]) * (double(p0[i]) - a[i]);
    biggest = std::max(biggest, std::abs(double(p0[i]) - a[i]));
  }
  MPI_EXPECT(t, std::abs(std::sqrt(len2) / lr - norm) <= 1e-3 * norm, "reported norm ", norm,
             ", but the update's length over lr is ", std::sqrt(len2) / lr);

  const Config low = config("low", norm / 4);
  const std::vector<float> c = run(low, p0c);
  double norm_c = 0, lr_c = 0;
  read(low, norm_c, lr_c, clipped);
  MPI_EXPECT(t, norm_c == norm && clipped == 1, "clipped run: norm ", norm_c, " (",
             norm, " unclipped), clipped_steps ", clipped);
  const double coef = (norm / 4) / (norm + 1e-6);
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    bad += std::abs((double(p0c[i]) - c[i]) - coef * (double(p0[i]) - a[i])) > 1e-3 * biggest;
  MPI_EXPECT(t, p0c == p0 && bad == 0, bad, " parameters not moved by ", coef, " of the unclipped update");
  MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(c.data(), c.size() * sizeof(float))),
             "clipped parameters differ across ranks");
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
}

// After a run with frozen conv1, bn1 and layer1: the running statistics of bn1 and layer1's
// batch norms are where they started exactly when `kept` (optimizer.freeze_bn_stats), and moved
// otherwise; the later layers' always moved.
void check_frozen_statistics(MpiTest& t, Trainer& tr, const std::vector<float>& start, bool kept) {
  const auto st = tr.net().arena().state();
  size_t stem = 0, stem_kept = 0, later = 0, later_moved = 0;
  for (const StateInfo& s : tr.net().arena().state_layout()) {
    const bool in_stem = s.name.rfind("bn1.", 0) == 0 || s.name.rfind("layer1.", 0) == 0;
    const bool same = std::equal(st.begin() + long(s.offset), st.begin() + long(s.offset + s.count),
                                 start.begin() + long(s.offset));
    (in_stem ? stem : later) += 1;
    stem_kept += in_stem && same;
    later_moved += !in_stem && !same;
  }
  MPI_EXPECT(t, stem > 0 && later > 0 && stem_kept == (kept ? stem : 0) && later_moved == later, kept ? "with" : "without",
             " optimizer.freeze_bn_stats: ", stem_kept, " of the stem's ", stem, " statistics kept, ", later_moved,
             " of the other ", later, " moved");
}

// optimizer.freeze: the named tensors end the run as they began, bit for bit on every rank, their
// gradients zeroed after the allreduce (so no norm counts them); every other tensor trains. A name
// that matches no tensor, and a freeze of everything, are refused by every rank, naming the key.
void check_freeze(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/freeze");
  c.train.steps = 3;
  c.optimizer.sgd.freeze = {"conv1", "layer1"};
  Trainer tr(c);
  auto p = tr.net().arena().params();
  const std::vector<float> start(p.begin(), p.end());
  tr.train();
  p = tr.net().arena().params();
  const auto g = tr.net().arena().grads();
  size_t frozen = 0, moved = 0, bad = 0;
  for (const ParamInfo& info : tr.net().arena().layout()) {
    const bool f = info.name.rfind("conv1.", 0) == 0 || info.name.rfind("layer1.", 0) == 0;
    bool changed = false;
    for (size_t i = info.offset; i < info.offset + info.count; ++i) {
      changed = changed || p[i] != start[i];
      bad += f && g[i] != 0.0f;
    }
    frozen += f;
    moved += !f && changed;
    if (f && changed) t.fail(str_cat(info.name, " is frozen but changed"));
  }
  MPI_EXPECT(t, frozen == 19 && moved + frozen == tr.net().arena().layout().size() && bad == 0, frozen,
             " tensors frozen (19 expected), ", moved, " trained of ", tr.net().arena().layout().size(), ", ", bad,
             " frozen gradients not zero");
  MPI_EXPECT(t, test::same_on_all_ranks(params_hash(tr)), "frozen run: parameters differ across ranks");
  // bn1 trains, so only conv1 (the first node) skips backward.
  MPI_EXPECT(t, tr.net().backward_from() == 1, "backward starts at node ", tr.net().backward_from(), ", not 1");

  // A frozen stem: backward stops at layer2's first block and the stem's gradients (the end of the
  // buffer) are neither computed nor averaged; the trained tensors are still averaged (the ranks'
  // data differ, so replicas would drift apart otherwise) and the stem stays as it was.
  Config s = tiny(dir + "/freeze_stem");
  s.train.steps = 3;
  s.optimizer.sgd.freeze = {"conv1", "bn1", "layer1"};
  Trainer ts(s);
  const std::string from = ts.net().node(ts.net().backward_from()).name;
  MPI_EXPECT(t, from.rfind("layer2.0.", 0) == 0, "frozen stem: backward starts at ", from);
  p = ts.net().arena().params();
  const std::vector<float> stem_start(p.begin(), p.end());
  auto st = ts.net().arena().state();
  const std::vector<float> stats_start(st.begin(), st.end());
  ts.train();
  check_frozen_statistics(t, ts, stats_start, false);
  p = ts.net().arena().params();
  const auto gs = ts.net().arena().grads();
  size_t stem_bad = 0;
  for (const ParamInfo& info : ts.net().arena().layout()) {
    const bool f = info.name.rfind("conv1.", 0) == 0 || info.name.rfind("bn1.", 0) == 0 ||
                   info.name.rfind("layer1.", 0) == 0;
    for (size_t i = info.offset; f && i < info.offset + info.count; ++i) stem_bad += p[i] != stem_start[i] || gs[i] != 0.0f;
  }
  MPI_EXPECT(t, stem_bad == 0, "frozen stem: ", stem_bad, " values changed or gradients not zero");
  MPI_EXPECT(t, test::same_on_all_ranks(params_hash(ts)), "frozen stem: parameters differ across ranks");
  // optimizer.freeze_bn_stats: the same stem's batch norms keep their running statistics, bit for
  // bit, while layer2's and layer3's move as before; only a frozen stem may keep them.
  s.run_dir = dir + "/freeze_stats";
  s.optimizer.freeze_bn_stats = true;
  Trainer tf(s);
  st = tf.net().arena().state();
  const std::vector<float> kept_start(st.begin(), st.end());
  tf.train();
  check_frozen_statistics(t, tf, kept_start, true);
  auto refused = [&](std::vector<std::string> freeze) {
    Config b = tiny(dir + "/freeze_bad");
    b.optimizer.sgd.freeze = std::move(freeze);
    try {
      Trainer bt(b);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = refused({"layer1", "layer9"});
  Config bs = tiny(dir + "/freeze_stats_bad");
  bs.optimizer.sgd.freeze = {"layer1"};
  bs.optimizer.freeze_bn_stats = true;
  const std::string stats_error = rt_test::error_of([&] { Trainer bt(bs); });
  MPI_EXPECT(t, stats_error.find("key 'optimizer.freeze_bn_stats': the frozen batch norm layer1.0.bn1 comes after "
                                 "the trained conv1") != std::string::npos,
             "frozen statistics after a trained layer: '", stats_error, "'");
  MPI_EXPECT(t, e.find("test: key 'optimizer.freeze': 'layer9' names no tensor of resnet20") != std::string::npos &&
                    e.find("its parts: conv1, bn1, layer1, layer2, layer3, fc)") != std::string::npos,
             "an unknown name: '", e, "'");
  e = refused({"conv1", "bn1", "layer1", "layer2", "layer3", "fc"});
  MPI_EXPECT(t, e.find("freezes every tensor of resnet20: nothing left to train") != std::string::npos,
             "everything frozen: '", e, "'");
  Config m = tiny(dir + "/lr_mult_bad");  // optimizer.lr_mult's names are checked the same way
  m.optimizer.sgd.lr_mult = {{"fc", 10}, {"fc.weights", 2}};
  e.clear();
  try {
    Trainer mt(m);
  } catch (const ConfigError& x) {
    e = x.what();
  }
  MPI_EXPECT(t, e.find("test: key 'optimizer.lr_mult': 'fc.weights' names no tensor of resnet20") != std::string::npos,
             "an unknown lr_mult name: '", e, "'");
}

// log.timeline: every rank's file holds the window's steps (skip 1, then 3), each with its
// phases in order inside the step, every bucket's ready instant and its allreduce on the
// communication track, which starts no earlier than the bucket was ready and ends before the
// main thread stopped waiting for gradients; and Python's json module reads the file.
void check_timeline(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/timeline");
  c.train.steps = 5;
  c.comm.bucket_bytes = 16 << 10;  // several buckets for this model
  c.log.timeline = dir + "/timeline/trace-{rank}.json";
  c.log.timeline_skip = 1;
  c.log.timeline_steps = 3;
  Trainer(c).train();
  const std::string path = dir + "/timeline/trace-" + std::to_string(t.rank()) + ".json";
  const std::string cmd = "/usr/bin/python3 -c \"import json,sys; json.load(open(sys.argv[1]))\" " + path;
  MPI_EXPECT(t, std::system(cmd.c_str()) == 0, path, " is not JSON");
  struct Ev {
    std::string name;
    int pid = -1, tid = -1;
    double ts = 0, dur = 0;
    int64_t step = -1, bucket = -1;
  };
  std::map<int64_t, std::vector<Ev>> steps;
  std::ifstream f(path);
  const std::regex re(R"re("name":"([^"]+)","ph":"[Xi]","pid":(\d+),"tid":(\d+),"ts":([-0-9.]+)(?:,"dur":([0-9.]+))?.*"step":(\d+)(?:,"bucket":(\d+))?)re");
  for (std::string line; std::getline(f, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, re)) continue;
    Ev e{m[1], std::stoi(m[2]), std::stoi(m[3]), std::stod(m[4]), m[5].matched ? std::stod(m[5]) : 0,
         std::stoll(m[6]), m[7].matched ? std::stoll(m[7]) : -1};
    steps[e.step].push_back(e);
  }
  MPI_EXPECT(t, steps.size() == 3 && steps.begin()->first == 2 && steps.rbegin()->first == 4, path,
             ": ", steps.size(), " steps recorded, from ", steps.empty() ? -1 : steps.begin()->first);
  const double eps = 0.002;  // the file's microseconds have three decimals
  for (const auto& [step, evs] : steps) {
    std::map<std::string, Ev> phase;
    std::map<int64_t, Ev> ready, reduce;
    for (const Ev& e : evs) {
      MPI_EXPECT(t, e.pid == t.rank(), "step ", step, ": pid ", e.pid);
      if (e.name == "bucket ready") ready[e.bucket] = e;
      else if (e.name == "allreduce") reduce[e.bucket] = e;
      else phase[e.name] = e;
    }
    const std::string at = str_cat(path, " step ", step);
    // The CPU backend loads each batch in the step (a "data" span), prefetching none.
    bool ok = phase.size() == 6;
    for (const char* name : {"step", "data", "forward", "backward", "wait for gradients", "optimizer"})
      ok = ok && phase.count(name);
    MPI_EXPECT(t, ok, at, ": phases missing (", phase.size(), " found)");
    if (!ok) continue;
    const Ev &st = phase["step"], &da = phase["data"], &fw = phase["forward"], &bw = phase["backward"],
             &wt = phase["wait for gradients"], &op = phase["optimizer"];
    MPI_EXPECT(t, st.ts <= da.ts + eps && da.ts <= fw.ts + eps && fw.ts <= bw.ts + eps && bw.ts <= wt.ts + eps &&
                      wt.ts <= op.ts + eps && op.ts + op.dur <= st.ts + st.dur + eps,
               at, ": phases out of order");
    MPI_EXPECT(t, ready.size() > 2 && reduce.size() == ready.size() && ready.rbegin()->first + 1 == int64_t(ready.size()),
               at, ": ", ready.size(), " ready, ", reduce.size(), " allreduce events");
    for (const auto& [b, r] : reduce) {
      const Ev& rd = ready[b];
      MPI_EXPECT(t, r.tid == 1 && rd.tid == 0, at, " bucket ", b, ": wrong tracks");
      MPI_EXPECT(t, rd.ts + eps >= fw.ts && r.ts + eps >= rd.ts && r.ts + r.dur <= wt.ts + wt.dur + eps, at,
                 " bucket ", b, ": ready ", rd.ts, ", allreduce ", r.ts, "+", r.dur, ", wait ends ",
                 wt.ts + wt.dur);
    }
  }
}

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
  auto optimizer = [&](Config& c) {
    c.optimizer.sgd.kind = kind;
    if (kind != OptimizerKind::sgd) c.optimizer.lr = 0.256;  // base lr 0.004 at 4 images a step
    c.model.drop_path = drop_path;
  };
  Config a = tiny(dir + "/straight" + tag);
  optimizer(a);
  a.train.accumulate = passes;
  a.train.mixup = a.train.cutmix = mix;
  a.train.ema = ema;
  if (images) use_augmented_images(a, dir + "/images", t.rank());
  Trainer ta(a);
  ta.train();
  const int64_t stop = ta.steps_per_epoch() + (mid_epoch ? 1 : 0);
  Config b = tiny(dir + "/resumed" + tag);
  optimizer(b);
  b.train.accumulate = passes;
  b.train.mixup = b.train.cutmix = mix;
  b.train.ema = ema;
  if (images) use_augmented_images(b, dir + "/images", t.rank());
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
    Config c = tiny(dir + "/plain" + tag);
    c.train.accumulate = passes;
    c.train.mixup = c.train.cutmix = mix;
    c.train.ema = ema;
    use_augmented_images(c, dir + "/images", t.rank());
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

// train.ema: the moving average is exactly the fused update of each step's weights (read back
// from a checkpoint written after every step), this rank's own BN statistics included; the
// checkpoint holds it; evaluating it leaves the model as it was and scores the averaged weights.
// With train.ema_every = k, only after every k-th step: the n-th such update decays by n.
void check_ema(MpiTest& t, const std::string& dir, int64_t every = 1) {
  Config c = tiny(dir + "/ema" + std::to_string(every));
  c.train.steps = 5;
  c.train.ema = 0.9;  // with warm-up: decays 0.1, 0.18, 0.25, ... 0.9
  c.train.ema_every = every;
  c.checkpoint.every_steps = 1;
  c.checkpoint.keep = 10;
  Trainer tr(c);
  auto& arena = tr.net().arena();
  std::vector<float> p(arena.params().begin(), arena.params().end());
  std::vector<float> s(arena.state().begin(), arena.state().end());
  tr.train();
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // rank 0 has written the last checkpoint
  const size_t ns = s.size();
  for (int64_t step = 1; step <= 5; ++step) {
    const Checkpoint ck = checkpoint_read(checkpoint_path(tr.config().run_dir + "/checkpoints", step));
    const float w = float(1.0 - ema_decay(0.9, true, step / every - 1));
    const float* own = t.size() > 1 ? ck.rank_state.data() + size_t(t.rank()) * ns : ck.state.data();
    if (step % every == 0) {
      for (size_t i = 0; i < p.size(); ++i) p[i] = std::fma(w, ck.params[i] - p[i], p[i]);
      for (size_t i = 0; i < ns; ++i) s[i] = std::fma(w, own[i] - s[i], s[i]);
    }
    if (step < 5) continue;
    MPI_EXPECT(t, ck.ema.size() == p.size() + ns && std::equal(p.begin(), p.end(), ck.ema.begin()),
               "the checkpoint's moving average is not the weights' (", ck.ema.size(), " values)");
    MPI_EXPECT(t, t.size() == 1 || (ck.ema_rank_state.size() == size_t(t.size()) * ns &&
                                    std::equal(s.begin(), s.end(), ck.ema_rank_state.begin() + t.rank() * ns)),
               "the checkpoint's 'ema_bnr' does not hold this rank's average");
    MPI_EXPECT(t, !std::equal(p.begin(), p.end(), ck.params.begin()), "the average equals the weights");
  }
  std::vector<float> ep, es;
  tr.ema_to_host(ep, es);
  MPI_EXPECT(t, ep == p, "the moving average of the parameters is not the fused update of each step's");
  MPI_EXPECT(t, es == s, "the moving average of this rank's BN statistics is not the fused update of each step's");

  const std::vector<float> before(arena.params().begin(), arena.params().end());
  const EvalResult model = tr.evaluate(), averaged = tr.evaluate_ema();
  MPI_EXPECT(t, std::equal(before.begin(), before.end(), arena.params().begin()) && tr.evaluate().loss == model.loss,
             "evaluating the average changed the model");
  // The same figures from a run of the averaged weights themselves (another run's arena).
  if (every > 1) return;
  Trainer other(tiny(dir + "/ema_other"));
  auto& oa = other.net().arena();
  std::copy(ep.begin(), ep.end(), oa.params().begin());
  std::copy(es.begin(), es.end(), oa.state().begin());
  const EvalResult direct = other.evaluate();
  MPI_EXPECT(t, averaged.loss == direct.loss && averaged.top1 == direct.top1 && averaged.loss != model.loss,
             "the average's evaluation: loss ", averaged.loss, ", the same weights' ", direct.loss, ", the model's ",
             model.loss);
}

// Mixup and CutMix change what is trained from the first step on: every step's loss differs from
// the unmixed run's and from the other's (the replicas stay identical, each rank drawing its own
// weights: the runs' consistency checks compare them). A CutMix box can be empty in these 8x8
// images (a side under 1 pixel): then this rank's first loss is the plain one, exactly.
void check_mixup(MpiTest& t, const std::string& dir) {
  Config a = tiny(dir + "/mix_off"), b = tiny(dir + "/mixup"), c = tiny(dir + "/cutmix");
  a.train.steps = b.train.steps = c.train.steps = 4;
  b.train.mixup = 0.4;
  c.train.cutmix = 1.0;
  Trainer ta(a), tb(b), tc(c);
  ta.train();
  tb.train();
  tc.train();
  MPI_EXPECT(t, ta.losses().size() == 4 && tb.losses().size() == 4 && tc.losses().size() == 4, "steps run");
  const bool empty_box = data::draw_mix(0, 1.0, c.data.image_size, c.seed, 0, 0, t.rank()).mix == 1;
  for (size_t i = 0; i < 4 && i < tb.losses().size() && i < tc.losses().size(); ++i) {
    const double off = ta.losses()[i], mixup = tb.losses()[i], cutmix = tc.losses()[i];
    MPI_EXPECT(t, std::isfinite(mixup) && std::isfinite(cutmix) && mixup != off && mixup != cutmix, "step ", i + 1,
               " loss ", off, " plain, ", mixup, " with mixup, ", cutmix, " with CutMix");
    MPI_EXPECT(t, (cutmix == off) == (i == 0 && empty_box), "step ", i + 1, " loss ", off, " plain, ", cutmix,
               " with CutMix", empty_box ? " (an empty first box)" : "");
  }
}

// model.drop_path: every step's loss differs from the run without (the masks reach training).
void check_drop_path(MpiTest& t, const std::string& dir) {
  Config a = tiny(dir + "/no_drop"), b = tiny(dir + "/drop");
  a.train.steps = b.train.steps = 4;
  b.model.drop_path = 0.5;
  TrainerHooks h = fixed_data();
  Trainer ta(a, MPI_COMM_WORLD, h), tb(b, MPI_COMM_WORLD, h);
  ta.train();
  tb.train();
  MPI_EXPECT(t, ta.losses().size() == 4 && tb.losses().size() == 4, "steps run");
  for (size_t i = 0; i < 4 && i < ta.losses().size() && i < tb.losses().size(); ++i)
    MPI_EXPECT(t, std::isfinite(tb.losses()[i]) && tb.losses()[i] != ta.losses()[i], "step ", i + 1, " loss ",
               tb.losses()[i], " with drop path, ", ta.losses()[i], " without");
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

// N ranks x batch 4 against rank 0 alone with batch 4N, on a model without batch norm; and N
// ranks x batch 2 x 2 accumulated passes against the same. With BCE (a mean over batch and
// classes) as with softmax cross-entropy (a mean over the batch).
void check_data_parallel_equivalence(MpiTest& t, const std::string& dir, LossKind loss = LossKind::softmax) {
  const std::string tag = loss == LossKind::bce ? "_bce" : "";
  auto run = [&](MPI_Comm comm, int64_t batch, const std::string& sub, int64_t passes = 1) {
    Config c = tiny(dir + sub + tag);
    c.train.loss = loss;
    c.train.label_smoothing = loss == LossKind::bce ? 0.1 : 0.0;
    c.train.batch = batch;
    c.train.accumulate = passes;
    c.train.steps = 4;
    c.optimizer.sgd.nesterov = true;
    TrainerHooks h = fixed_data();
    h.make_net = plain_net;
    Trainer tr(c, comm, h);
    tr.train();
    auto p = tr.net().arena().params();
    return std::vector<float>(p.begin(), p.end());
  };
  const auto many = run(MPI_COMM_WORLD, 4, "/dp_many");
  const auto accumulated = run(MPI_COMM_WORLD, 2, "/dp_accumulated", 2);
  if (t.rank() != 0) return;
  const auto one = run(MPI_COMM_SELF, 4 * t.size(), "/dp_one");
  auto worst = [&](const std::vector<float>& v) {
    double w = 0;
    for (size_t i = 0; i < one.size(); ++i)
      w = std::max(w, std::abs(double(v[i]) - one[i]) / (1e-3 + std::abs(double(one[i]))));
    return w;
  };
  MPI_EXPECT(t, worst(many) < 2e-5, "N x b and 1 x Nb differ: worst relative difference ", worst(many));
  MPI_EXPECT(t, worst(accumulated) < 2e-5, "N x b/2 x 2 passes and 1 x Nb differ: worst relative difference ",
             worst(accumulated));
  // Not trivially equal: the passes must have been summed, not the last one taken.
  const auto halves = run(MPI_COMM_SELF, 2 * t.size(), "/dp_half");
  MPI_EXPECT(t, worst(halves) > 1e-3, "a batch half as large gives the same parameters: the test cannot tell");
}

// model.bn_group 0 (all ranks): N ranks x batch 4 train as rank 0 alone with batch 4N on a model
// with batch norm: parameters and running statistics after 4 steps, the statistics the same bits
// on every rank; without groups (1) the result differs for N > 1, so the test can tell. A group
// that does not divide the ranks is refused, naming the key.
void check_bn_group(MpiTest& t, const std::string& dir) {
  using Result = std::pair<std::vector<float>, std::vector<float>>;
  auto run = [&](MPI_Comm comm, int64_t batch, const std::string& sub, int group) {
    Config c = tiny(dir + sub);
    c.train.batch = batch;
    c.train.steps = 4;
    c.model.bn_group = group;
    Trainer tr(c, comm, fixed_data());
    tr.train();
    auto p = tr.net().arena().params();
    auto s = tr.net().arena().state();
    if (group != 1)  // a collective over the world: the grouped run is on every rank
      MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(s.data(), s.size_bytes())),
                 "bn_group ", group, ": running statistics differ across ranks");
    return Result{{p.begin(), p.end()}, {s.begin(), s.end()}};
  };
  const Result grouped = run(MPI_COMM_WORLD, 4, "/bn_group", 0);
  const Result alone = run(MPI_COMM_WORLD, 4, "/bn_alone", 1);
  Config bad = tiny(dir + "/bn_bad");
  bad.model.bn_group = t.size() + 1;
  const std::string e = rt_test::error_of([&] { Trainer tr(bad, MPI_COMM_WORLD, fixed_data()); });
  MPI_EXPECT(t, e.find("'model.bn_group'") != std::string::npos && e.find("does not divide the job's") != std::string::npos,
             "bn_group ", bad.model.bn_group, " on ", t.size(), " ranks: '", e, "'");
  if (t.rank() != 0) return;
  const Result one = run(MPI_COMM_SELF, 4 * t.size(), "/bn_one", 1);
  auto worst = [](const std::vector<float>& v, const std::vector<float>& ref) {
    double w = 0;
    for (size_t i = 0; i < ref.size(); ++i)
      w = std::max(w, std::abs(double(v[i]) - ref[i]) / (1e-3 + std::abs(double(ref[i]))));
    return w;
  };
  MPI_EXPECT(t, worst(grouped.first, one.first) < 1e-4, "bn_group 0: N x b and 1 x Nb parameters differ by ",
             worst(grouped.first, one.first));
  MPI_EXPECT(t, worst(grouped.second, one.second) < 1e-4, "bn_group 0: N x b and 1 x Nb statistics differ by ",
             worst(grouped.second, one.second));
  if (t.size() > 1)
    MPI_EXPECT(t, worst(alone.first, one.first) > 1e-3,
               "per-rank batch norms give 1 x Nb's parameters: the test cannot tell");
}

// Every validation sample counted once, for any rank count: the same totals as rank 0 alone.
void check_eval_counts(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/eval");
  c.data.synthetic_samples = 37;  // not a multiple of ranks x batch: short last batches
  c.backend = "reference";        // per-sample results independent of the batch position
  EvalResult all = Trainer(c).evaluate();
  MPI_EXPECT(t, all.samples == 37, "evaluated ", all.samples, " samples of 37");
  if (t.rank() != 0) return;
  EvalResult one = Trainer(c, MPI_COMM_SELF).evaluate();
  MPI_EXPECT(t, one.samples == 37 && one.top1 == all.top1 && one.top5 == all.top5,
             "N ranks: ", all.top1, "/", all.top5, " correct, 1 rank: ", one.top1, "/", one.top5);
}

// data.eval_image_size: evaluation at another side than training's scores exactly what a run set
// up at that side scores with the same weights and statistics, not the training side's figure,
// and leaves training's network as it was.
void check_eval_size(MpiTest& t, const std::string& dir) {
  Config a = tiny(dir + "/eval_size");
  a.train.steps = 3;
  a.data.eval_image_size = 12;
  a.data.synthetic_samples = 37;  // short last evaluation batches
  Trainer ta(a);
  ta.train();
  auto& arena = ta.net().arena();
  const std::vector<float> p(arena.params().begin(), arena.params().end());
  const std::vector<float> s(arena.state().begin(), arena.state().end());
  const EvalResult ra = ta.evaluate();
  MPI_EXPECT(t, std::equal(p.begin(), p.end(), arena.params().begin()) &&
                    std::equal(s.begin(), s.end(), arena.state().begin()),
             "evaluating at another side changed the training network");
  MPI_EXPECT(t, ta.evaluate().loss == ra.loss, "a second evaluation at side 12 scores differently");
  auto same_weights = [&](Config c) {
    Trainer tb(c);
    std::copy(p.begin(), p.end(), tb.net().arena().params().begin());
    std::copy(s.begin(), s.end(), tb.net().arena().state().begin());
    return tb.evaluate();
  };
  Config b = tiny(dir + "/eval_size_b");
  b.data.image_size = 12;
  b.data.synthetic_samples = 37;
  const EvalResult rb = same_weights(b);
  MPI_EXPECT(t, ra.samples == 37 && rb.samples == 37 && ra.loss == rb.loss && ra.top1 == rb.top1 && ra.top5 == rb.top5,
             "side 12 from a side-8 run: loss ", ra.loss, " top-1 ", ra.top1, "; a side-12 run: loss ", rb.loss,
             " top-1 ", rb.top1);
  Config c = a;
  c.run_dir = dir + "/eval_size_c";
  c.data.eval_image_size = 0;
  const EvalResult rc = same_weights(c);
  MPI_EXPECT(t, rc.loss != ra.loss, "side 8 and side 12 score the same loss ", ra.loss);
}

// The loader's 8-bit pixels normalized by the backend (data.output u8) against its float output:
// bitwise the same losses, parameters and evaluation (37 samples: short evaluation batches).
void check_u8_input(MpiTest& t, const std::string& dir) {
  struct Run {
    std::vector<double> losses;
    std::vector<float> params;
    EvalResult eval;
  };
  auto run = [&](data::Output out, const std::string& sub) {
    Config c = tiny(dir + sub);
    c.data.output = out;
    c.data.synthetic_samples = 37;
    c.train.epochs = 1;
    Trainer tr(c);
    tr.train();
    auto p = tr.net().arena().params();
    return Run{tr.losses(), std::vector<float>(p.begin(), p.end()), tr.evaluate()};
  };
  const Run f = run(data::Output::f32, "/in_float"), u = run(data::Output::u8, "/in_u8");
  MPI_EXPECT(t, !f.losses.empty() && f.losses.size() == u.losses.size(), f.losses.size(), " vs ", u.losses.size(),
             " losses");
  for (size_t i = 0; i < std::min(f.losses.size(), u.losses.size()); ++i)
    if (std::memcmp(&f.losses[i], &u.losses[i], sizeof(double)) != 0) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.17g (u8) vs %.17g (float)", u.losses[i], f.losses[i]);
      t.fail(str_cat("data.output u8 gives another loss than float at step ", i + 1, ": ", buf));
      break;
    }
  MPI_EXPECT(t, std::memcmp(f.params.data(), u.params.data(), f.params.size() * sizeof(float)) == 0,
             "data.output u8 gives other parameters than float");
  MPI_EXPECT(t, f.eval.samples == 37 && u.eval.samples == 37 && f.eval.top1 == u.eval.top1 &&
                    f.eval.top5 == u.eval.top5 && std::memcmp(&f.eval.loss, &u.eval.loss, sizeof(double)) == 0,
             "evaluation: float ", f.eval.samples, " samples, loss ", f.eval.loss, "; u8 ", u.eval.samples,
             " samples, loss ", u.eval.loss);
}

// A few steps on fixed data, losses against values recorded from a checked run (rank 0 alone).
void check_golden_losses(MpiTest& t, const std::string& dir) {
  if (t.rank() != 0) return;
  Config c = tiny(dir + "/golden");
  c.train.batch = 8;
  c.train.epochs = 3;
  c.data.synthetic_samples = 64;
  Trainer tr(c, MPI_COMM_SELF, fixed_data());
  tr.train();
  // Recorded 2026-11-29 (oneDNN backend, 1 thread, AVX2); the loss falls from ln 4 to ~0.4.
  const std::vector<double> golden = {
      1.405183, 1.345977, 1.395031, 1.337595, 1.312437, 1.349819, 1.498757,  1.266147,
      1.222182, 1.064892, 1.062493, 1.04518,  0.8546474, 0.6572716, 0.6892473, 0.6668891,
      0.6994028, 0.3632861, 0.3302272, 0.312612, 0.3891552, 0.4071659, 0.38357, 0.4704442};
  MPI_EXPECT(t, tr.losses().size() == golden.size(), tr.losses().size(), " steps");
  if (tr.losses().size() != golden.size()) return;
  std::string got;
  for (double l : tr.losses()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.7g, ", l);
    got += buf;
  }
  std::printf("golden losses: %s\n", got.c_str());
  for (size_t i = 0; i < golden.size(); ++i)
    // Tolerance for other CPUs' oneDNN kernels (other summation orders), which drift over steps.
    MPI_EXPECT(t, std::abs(tr.losses()[i] - golden[i]) <= 2e-3 * (1 + double(i)) * golden[i], "step ", i + 1, " loss ",
               tr.losses()[i], " (recorded ", golden[i], ")");
}

// Emulated compute: a step lasts at least emulate.compute_ms, and every chunk of the gradient
// buffer ends as the average over ranks of what each rank's emulated backward wrote there (a
// bucket not reduced, reduced twice or misplaced keeps a rank's own value or another chunk's).
void check_emulated_compute(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/emulate");
  c.train.steps = 3;
  c.emulate.compute_ms = 40;
  c.comm.bucket_bytes = 4096;  // many buckets, released one by one over the backward share
  Trainer tr(c);
  const auto start = std::chrono::steady_clock::now();
  tr.train();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MPI_EXPECT(t, secs >= 3 * 0.040, "3 emulated steps of 40 ms took ", secs, " s");
  for (double l : tr.losses()) MPI_EXPECT(t, l == 0, "emulated step with loss ", l);
  auto g = tr.net().arena().grads();
  std::vector<size_t> offsets;
  for (const auto& p : tr.net().arena().layout()) offsets.push_back(p.offset);
  const auto points = emulate_ready_points(offsets, g.size());
  MPI_EXPECT(t, points.size() > 10 && points.back() == g.size(), points.size(), " ready points");
  size_t begin = 0, bad = 0;
  for (size_t k = 0; k < points.size(); ++k) {
    double sum = 0;
    for (int r = 0; r < t.size(); ++r) sum += emulated_grad(r, 3, k);
    const double want = sum / t.size();
    for (size_t i = begin; i < points[k]; ++i)
      if (std::abs(g[i] - want) > 1e-6 * want && bad++ < 3)
        t.fail(str_cat("grads[", i, "] (chunk ", k, ") = ", g[i], ", expected the average ", want));
    begin = points[k];
  }
  MPI_EXPECT(t, bad == 0, bad, " gradient elements are not the average over ranks");
  MPI_EXPECT(t, test::same_on_all_ranks(test::hash_bytes(g.data(), g.size_bytes())), "gradients differ across ranks");
}

}  // namespace
}  // namespace rt::trainer

int main(int argc, char** argv) {
  using namespace rt::trainer;
  return test_trainer::run_trainer_test(argc, argv, "test_mpi_trainer", [](rt::test::MpiTest& t, const std::string& dir) {
    check_identical_and_divergence(t, dir);
    check_compressed_gradients(t, dir);
    check_hierarchical(t, dir);
    check_clip_grad_norm(t, dir);
    check_keep_best(t, dir);
    check_target_top1(t, dir);
    check_timed_checkpoints(t, dir);
    check_freeze(t, dir);
    check_timeline(t, dir);
    check_exact_resume(t, dir, false);
    check_exact_resume(t, dir, true);
    check_exact_resume(t, dir, true, 2);
    check_exact_resume(t, dir, true, 2, 0.4, 0.9);  // mixup's and CutMix's draws made again, the average kept
    check_exact_resume(t, dir, true, 1, 0, 0, true);  // RandAugment's and random erasing's draws made again
    check_exact_resume(t, dir, true, 1, 0, 0, false, rt::OptimizerKind::adamw);
    check_exact_resume(t, dir, true, 2, 0, 0, false, rt::OptimizerKind::lamb);
    check_exact_resume(t, dir, true, 2, 0, 0, false, rt::OptimizerKind::sgd, 0.3);
    check_drop_path(t, dir);
    check_ema(t, dir);
    check_ema(t, dir, 2);
    check_eval_size(t, dir);
    check_mixup(t, dir);
    check_elastic_resume(t, dir);
    check_weights(t, dir);
    check_data_parallel_equivalence(t, dir);
    check_data_parallel_equivalence(t, dir, rt::LossKind::bce);
    check_bn_group(t, dir);
    check_eval_counts(t, dir);
    check_u8_input(t, dir);
    check_golden_losses(t, dir);
    check_emulated_compute(t, dir);
  });
}

// Training options under mpirun, each held to what it promises: train.clip_grad_norm,
// optimizer.freeze (and freeze_bn_stats), log.timeline, train.ema (and ema_every, ema_copy_epochs), mixup and
// CutMix, model.drop_path.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "comm/mpi_check.h"
#include "data/mixup.h"
#include "tests/error_of.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/trainer_test_util.h"
#include "trainer/checkpoint.h"
#include "trainer/trainer.h"

namespace rt::trainer {
namespace {

using test::MpiTest;
using namespace test_trainer;

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
  bs.optimizer.sgd.freeze = {"conv1.weight", "bn1.weight"};  // no batch norm frozen whole: the key does nothing
  const std::string none_error = rt_test::error_of([&] { Trainer bt(bs); });
  MPI_EXPECT(t, none_error.find("key 'optimizer.freeze_bn_stats': no batch norm is frozen whole") != std::string::npos,
             "freeze_bn_stats without a whole frozen batch norm: '", none_error, "'");
  MPI_EXPECT(t, e.find("test (default): key 'optimizer.freeze': 'layer9' names no tensor of resnet20") != std::string::npos &&
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
  MPI_EXPECT(t, e.find("test (default): key 'optimizer.lr_mult': 'fc.weights' names no tensor of resnet20") != std::string::npos,
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

// AdamW after a resume that unfreezes conv1: conv1's first update is a first update (±lr with
// no weight decay, torch.optim's per-parameter step count 1), not one corrected as the run's
// eighth; the same from a file written before checkpoints kept the counts (inferred from its
// all-zero moments).
void check_unfreeze_adam(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/unfreeze");
  c.optimizer.sgd.kind = OptimizerKind::adamw;
  c.optimizer.sgd.weight_decay = 0;
  c.optimizer.lr = 0.256;
  c.schedule.kind = ScheduleKind::constant;
  c.schedule.warmup_epochs = 0;
  c.train.steps = 7;
  c.checkpoint.every_steps = 7;
  c.optimizer.sgd.freeze = {"conv1"};
  {
    Trainer tr(c);
    tr.train();
  }
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  const std::string saved = checkpoint_path(c.run_dir + "/checkpoints", 7);
  std::string old = dir + "/unfreeze-old.rtck";
  if (t.rank() == 0) {  // the same file without "tsteps"
    const Checkpoint ck = checkpoint_read(saved);
    MPI_EXPECT(t, !ck.tensor_steps.empty(), "an AdamW checkpoint without per-tensor step counts");
    checkpoint_write(old, ck.meta, ck.config_yaml, ck.params, ck.state, ck.momentum, ck.rank_state, ck.layout, {},
                     {}, ck.moment2);
  }
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  std::vector<float> moved[2];
  for (int k = 0; k < 2; ++k) {
    Config open = c;
    open.optimizer.sgd.freeze.clear();
    open.train.steps = 8;
    open.run_dir = dir + "/unfreeze-" + std::to_string(k);
    Trainer tr(open);
    tr.load_checkpoint(k == 0 ? saved : old);
    const ParamInfo* conv1 = nullptr;
    for (const ParamInfo& p : tr.net().arena().layout())
      if (p.name == "conv1.weight") conv1 = &p;
    auto p = tr.net().arena().params();
    const std::vector<float> before(p.begin() + conv1->offset, p.begin() + conv1->offset + conv1->count);
    tr.train();
    p = tr.net().arena().params();
    for (size_t i = 0; i < before.size(); ++i) moved[k].push_back(p[conv1->offset + i] - before[i]);
  }
  const double lr = config_base_lr(c, t.size());
  double most = 0;
  for (float d : moved[0]) most = std::max(most, double(std::abs(d)));
  MPI_EXPECT(t, most > 0.99 * lr && most < 1.0001 * lr, "conv1's first update after unfreezing: |step| up to ", most,
             ", not lr ", lr);
  MPI_EXPECT(t, moved[0] == moved[1], "a file without per-tensor counts resumed otherwise");
}

// train.ema_copy_epochs: every update of the first epoch, and the first update after it, copies
// the weights (torchvision's reset of its average through the warm-up); later ones average.
void check_ema_copy(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/ema_copy");
  c.train.epochs = 3;
  c.train.ema = 0.9;
  c.train.ema_warmup = false;
  c.train.ema_every = 2;
  c.train.ema_copy_epochs = 1;
  c.checkpoint.every_steps = 1;
  c.checkpoint.keep = 1000;
  Trainer tr(c);
  auto& arena = tr.net().arena();
  std::vector<float> p(arena.params().begin(), arena.params().end());
  std::vector<float> s(arena.state().begin(), arena.state().end());
  tr.train();
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  const int64_t spe = tr.steps_per_epoch(), ns = int64_t(s.size());
  int copies = 0, averages = 0;
  for (int64_t step = 2; step <= 3 * spe; step += 2) {
    const Checkpoint ck = checkpoint_read(checkpoint_path(tr.config().run_dir + "/checkpoints", step));
    const float* own = t.size() > 1 ? ck.rank_state.data() + t.rank() * ns : ck.state.data();
    if ((step - 1) / spe < 1 || std::max<int64_t>(step - 3, 0) / spe < 1) {
      p = ck.params;
      s.assign(own, own + ns);
      ++copies;
    } else {
      for (size_t i = 0; i < p.size(); ++i) p[i] = std::fma(0.1f, ck.params[i] - p[i], p[i]);
      for (int64_t i = 0; i < ns; ++i) s[size_t(i)] = std::fma(0.1f, own[i] - s[size_t(i)], s[size_t(i)]);
      ++averages;
    }
  }
  std::vector<float> ep, es;
  tr.ema_to_host(ep, es);
  MPI_EXPECT(t, copies > 0 && averages > 0 && ep == p && es == s,
             "train.ema_copy_epochs: the average is not the copies, then the averages, of the steps' weights (",
             copies, " copies, ", averages, " averages)");
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
  // Branches whose last BN starts at zero add nothing in step 1, dropped or not.
  a.model.zero_init_residual = b.model.zero_init_residual = false;
  TrainerHooks h = fixed_data();
  Trainer ta(a, MPI_COMM_WORLD, h), tb(b, MPI_COMM_WORLD, h);
  ta.train();
  tb.train();
  MPI_EXPECT(t, ta.losses().size() == 4 && tb.losses().size() == 4, "steps run");
  for (size_t i = 0; i < 4 && i < ta.losses().size() && i < tb.losses().size(); ++i)
    MPI_EXPECT(t, std::isfinite(tb.losses()[i]) && tb.losses()[i] != ta.losses()[i], "step ", i + 1, " loss ",
               tb.losses()[i], " with drop path, ", ta.losses()[i], " without");
}

// Stochastic depth draws each rank's masks of its own (the key holds the rank, as each DDP
// process has its own generator): given the very same batch on every rank, the ranks' first
// losses differ with drop path and agree without it. Masks shared by all ranks would drop the
// same blocks for the whole global batch, a noise N times coarser than the configured one.
void check_drop_path_per_rank(MpiTest& t, const std::string& dir) {
  if (t.size() < 2) return;
  TrainerHooks same;  // every rank the batches of a one-rank run: the same images everywhere
  same.make_loader = [](const data::DataConfig& c, data::Split s, int r, int w, int b) {
    const bool train = s == data::Split::train;  // validation as usual: each sample once
    return std::make_unique<FixedLoader>(c, s, train ? 0 : r, train ? 1 : w, b);
  };
  for (double drop : {0.0, 0.5}) {
    Config c = tiny(str_cat(dir, "/drop_ranks_", drop));
    c.train.steps = 1;
    c.model.drop_path = drop;
    c.model.zero_init_residual = false;  // else the dropped branches add nothing in step 1
    Trainer tr(c, MPI_COMM_WORLD, same);
    tr.train();
    MPI_EXPECT(t, tr.losses().size() == 1, "drop_path ", drop, ": steps run");
    const double mine = tr.losses().empty() ? 0.0 : tr.losses()[0];
    std::vector<double> all(size_t(t.size()));
    MPI_Allgather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
    const bool differ = std::any_of(all.begin(), all.end(), [&](double l) { return l != all[0]; });
    MPI_EXPECT(t, differ == (drop > 0), "drop_path ", drop, ": the ranks' first losses on the same batch ",
               differ ? "differ" : "agree", " (rank 0 ", all[0], ", rank 1 ", all[1], ")");
  }
}

// Images whose colour is their class: class k lights channel k (constant planes), labels 0 and 1
// alternating, so the reversed partners of a mixed batch always hold two different classes.
// Validation as FixedLoader's.
class ColourLoader final : public data::Loader {
 public:
  ColourLoader(const data::DataConfig& cfg, int batch) : cfg_(cfg), batch_(batch) {
    for (int c = 0; c < cfg.synthetic_classes; ++c) names_.push_back(std::to_string(c));
  }
  int64_t size() const override { return cfg_.synthetic_samples; }
  int num_classes() const override { return cfg_.synthetic_classes; }
  int64_t steps_per_epoch() const override { return 4; }
  void start_epoch(data::Position pos) override { pos_ = pos; }
  bool next(data::Batch& out) override {
    if (pos_.step >= steps_per_epoch()) return false;
    const size_t plane = size_t(cfg_.image_size) * size_t(cfg_.image_size);
    out.n = batch_;
    out.mixed.clear();  // fresh images: not mixed (yet)
    out.mix = 1.0;
    out.images.assign(size_t(batch_) * 3 * plane, 0.f);
    out.labels.resize(size_t(batch_));
    for (int j = 0; j < batch_; ++j) {
      const int label = j % 2;
      out.labels[size_t(j)] = label;
      std::fill_n(out.images.begin() + std::ptrdiff_t((size_t(j) * 3 + size_t(label)) * plane), plane, 1.f);
    }
    ++pos_.step;
    return true;
  }
  data::Position position() const override { return pos_; }
  double last_wait_s() const override { return 0; }
  int64_t skipped() const override { return 0; }
  const std::vector<std::string>& class_names() const override { return names_; }

 private:
  data::DataConfig cfg_;
  int batch_;
  std::vector<std::string> names_;
  data::Position pos_;
};

// Training accuracy counts a mixed image as of the class it holds more of (the label when the
// mix weight is at least 1/2, its partner's otherwise). A model that sees colours (average pool,
// then fc = 10 I) predicts exactly that class for every blend of two colours, so the run's
// training top-1 is 100%; counting the other label, or always the image's own, would give about
// 0% or 50%.
void check_mixup_accuracy(MpiTest& t, const std::string& dir) {
  Config c = tiny(dir + "/mix_accuracy");
  c.model.classes = c.data.synthetic_classes = 3;
  c.train.mixup = 1.0;  // Beta(1, 1): weights on both sides of 1/2
  c.train.steps = 3;
  c.optimizer.lr = 1e-6;  // the colours stay what the model sees
  c.optimizer.sgd.weight_decay = 0;
  c.eval.every_epochs = 0;
  c.eval.at_end = false;
  c.log.jsonl = c.run_dir + "/metrics-{rank}.jsonl";
  TrainerHooks h = fixed_data();
  auto fixed = h.make_loader;
  h.make_loader = [fixed](const data::DataConfig& d, data::Split s, int r, int w, int b) -> std::unique_ptr<data::Loader> {
    if (s == data::Split::train) return std::make_unique<ColourLoader>(d, b);
    return fixed(d, s, r, w, b);
  };
  h.make_net = [](const Config& cfg) {
    auto net = std::make_unique<Net<float>>(make_backend<float>(cfg.backend),
                                            Shape{cfg.train.batch, 3, cfg.data.image_size, cfg.data.image_size});
    int x = net->global_avgpool(net->input(), "pool");
    x = net->linear(x, "fc", cfg.model.classes);
    net->loss(x, {cfg.train.loss, cfg.train.label_smoothing, cfg.train.bce_threshold});
    net->finalize();
    auto& a = net->arena();
    for (const ParamInfo& p : a.layout())  // fc.weight = 10 I (3 x 3: either layout), fc.bias = 0
      for (size_t i = 0; i < p.count; ++i) a.params()[p.offset + i] = p.name == "fc.weight" && i % 4 == 0 ? 10.f : 0.f;
    return net;
  };
  {
    Trainer tr(c, MPI_COMM_WORLD, h);
    tr.train();
  }
  std::ifstream f(c.run_dir + "/metrics-" + std::to_string(t.rank()) + ".jsonl");
  double top1 = -1;
  std::smatch m;
  for (std::string line; std::getline(f, line);)
    if (std::regex_search(line, m, std::regex(R"("train_top1":([-0-9.eE+]+))"))) top1 = std::stod(m[1]);
  MPI_EXPECT(t, top1 == 100, "training top-1 of mixed colours: ", top1, "%, want 100%");
}

}  // namespace
}  // namespace rt::trainer

int main(int argc, char** argv) {
  using namespace rt::trainer;
  return test_trainer::run_trainer_test(argc, argv, "test_mpi_trainer_options", [](rt::test::MpiTest& t, const std::string& dir) {
    check_clip_grad_norm(t, dir);
    check_freeze(t, dir);
    check_unfreeze_adam(t, dir);
    check_timeline(t, dir);
    check_drop_path(t, dir);
    check_drop_path_per_rank(t, dir);
    check_ema(t, dir);
    check_ema(t, dir, 2);
    check_ema_copy(t, dir);
    check_mixup(t, dir);
    check_mixup_accuracy(t, dir);
  });
}

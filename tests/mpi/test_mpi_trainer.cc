// The trainer under mpirun: replicas stay bitwise identical and a diverged rank is named (also
// with bf16-compressed gradients and the hierarchical allreduce); N ranks x batch b, or x batch
// b/2 x 2 accumulated passes, equal 1 rank x batch N*b (a model without batch norm, and one with
// it whose statistics are synchronised, model.bn_group); evaluation counts every sample once, and
// at its own side or batch scores what a run set up there does; data.output u8 trains and evaluates exactly
// as float; golden losses; emulated compute averages every gradient chunk.
// Checkpoints and resume: test_mpi_trainer_resume.cc; training options: test_mpi_trainer_options.cc.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/error_of.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/trainer_test_util.h"
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
  const std::string wire = t.size() > 1 ? "\"comm_wire\":\"bf16\"" : "\"comm_wire\":\"none\"";
  MPI_EXPECT(t, log.find(wire) != std::string::npos, "metrics: no ", wire);
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

// A short run's weights and statistics, and its evaluation (the training network left as it was,
// checked by the callers).
struct Trained {
  std::vector<float> p, s;
  EvalResult r;
};
Trained train_then_evaluate(Trainer& tr) {
  tr.train();
  auto& arena = tr.net().arena();
  Trained out{{arena.params().begin(), arena.params().end()}, {arena.state().begin(), arena.state().end()}, {}};
  out.r = tr.evaluate();
  return out;
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
  const auto [p, s, ra] = train_then_evaluate(ta);
  auto& arena = ta.net().arena();
  MPI_EXPECT(t, std::equal(p.begin(), p.end(), arena.params().begin()) &&
                    std::equal(s.begin(), s.end(), arena.state().begin()),
             "evaluating at another side changed the training network");
  MPI_EXPECT(t, ta.evaluate().loss == ra.loss, "a second evaluation at side 12 scores differently");
  auto same_weights = [&](Config c, Trainer::Use use = Trainer::Use::train) {
    Trainer tb(c, MPI_COMM_WORLD, {}, use);
    std::copy(p.begin(), p.end(), tb.net().arena().params().begin());
    std::copy(s.begin(), s.end(), tb.net().arena().state().begin());
    if (use == Trainer::Use::evaluate)  // --eval: its one network is set up at the evaluation side
      MPI_EXPECT(t, tb.net().shape(0).h == 12, "--eval's network takes side ", tb.net().shape(0).h, ", not 12");
    return tb.evaluate();
  };
  Config b = tiny(dir + "/eval_size_b");
  b.data.image_size = 12;
  b.data.synthetic_samples = 37;
  const EvalResult rb = same_weights(b);
  MPI_EXPECT(t, ra.samples == 37 && rb.samples == 37 && ra.loss == rb.loss && ra.top1 == rb.top1 && ra.top5 == rb.top5,
             "side 12 from a side-8 run: loss ", ra.loss, " top-1 ", ra.top1, "; a side-12 run: loss ", rb.loss,
             " top-1 ", rb.top1);
  Config e = a;
  e.run_dir = dir + "/eval_size_e";
  const EvalResult re = same_weights(e, Trainer::Use::evaluate);
  MPI_EXPECT(t, re.samples == 37 && re.loss == rb.loss && re.top1 == rb.top1 && re.top5 == rb.top5,
             "--eval at side 12 of a side-8 run: loss ", re.loss, " top-1 ", re.top1, "; a side-12 run: loss ", rb.loss,
             " top-1 ", rb.top1);
  Config c = a;
  c.run_dir = dir + "/eval_size_c";
  c.data.eval_image_size = 0;
  const EvalResult rc = same_weights(c);
  MPI_EXPECT(t, rc.loss != ra.loss, "side 8 and side 12 score the same loss ", ra.loss);
}

// eval.batch: evaluation at another batch than training's (larger, and one that leaves a short
// last batch) scores what evaluating at training's batch does, in a training run (a second
// network) as in --eval (its one network at that batch), and leaves training's network alone.
void check_eval_batch(MpiTest& t, const std::string& dir) {
  Config a = tiny(dir + "/eval_batch");
  a.backend = "reference";  // per-sample results independent of the batch
  a.train.steps = 3;
  a.data.synthetic_samples = 37;
  Trainer ta(a);
  const auto [p, s, ra] = train_then_evaluate(ta);
  auto same_weights = [&](const std::string& sub, int64_t eval_batch, Trainer::Use use, int64_t* net_batch) {
    Config c = a;
    c.run_dir = dir + sub;
    c.eval.batch = eval_batch;
    Trainer tb(c, MPI_COMM_WORLD, {}, use);
    std::copy(p.begin(), p.end(), tb.net().arena().params().begin());
    std::copy(s.begin(), s.end(), tb.net().arena().state().begin());
    *net_batch = tb.net().shape(0).n;
    const EvalResult r = tb.evaluate();
    MPI_EXPECT(t, std::equal(p.begin(), p.end(), tb.net().arena().params().begin()) &&
                      std::equal(s.begin(), s.end(), tb.net().arena().state().begin()),
               "evaluating at batch ", eval_batch, " changed the network's weights or statistics");
    return r;
  };
  int64_t train_net = 0, eval_net = 0;
  const EvalResult rb = same_weights("/eval_batch_b", 16, Trainer::Use::train, &train_net);
  const EvalResult rc = same_weights("/eval_batch_c", 7, Trainer::Use::evaluate, &eval_net);
  MPI_EXPECT(t, train_net == 4 && eval_net == 7, "networks at batch ", train_net, " (training, expected 4) and ",
             eval_net, " (--eval at eval.batch 7)");
  for (const EvalResult* r : {&rb, &rc})
    MPI_EXPECT(t, ra.samples == 37 && r->samples == 37 && r->top1 == ra.top1 && r->top5 == ra.top5 &&
                      std::abs(r->loss - ra.loss) <= 1e-12 * std::abs(ra.loss),
               "batch 4: ", ra.samples, " samples, top-1 ", ra.top1, ", top-5 ", ra.top5, ", loss ", ra.loss,
               "; eval.batch ", r == &rb ? 16 : 7, ": ", r->samples, ", ", r->top1, ", ", r->top5, ", ", r->loss);
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
    check_eval_size(t, dir);
    check_data_parallel_equivalence(t, dir);
    check_data_parallel_equivalence(t, dir, rt::LossKind::bce);
    check_bn_group(t, dir);
    check_eval_counts(t, dir);
    check_eval_batch(t, dir);
    check_u8_input(t, dir);
    check_golden_losses(t, dir);
    check_emulated_compute(t, dir);
  });
}

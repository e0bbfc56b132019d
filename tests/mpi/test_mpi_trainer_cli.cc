// The trainer program as users meet it, launched through mpirun: help, configuration errors
// (one line naming rank, file:line and key; non-zero exit; nothing hangs), a short run that
// checkpoints and logs, evaluation of a checkpoint on another rank count, resume, and damaged or
// foreign checkpoints. (Stopping a running job: test_mpi_trainer_stop.)
// Usage: test_mpi_trainer_cli MPIEXEC TRAINER [errors|resume|best]   (not itself under mpirun)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/mpi/cli_util.h"
#include "trainer/checkpoint.h"
#include "trainer/metrics.h"

namespace {

namespace fs = std::filesystem;
using namespace cli;

void check_errors() {
  Result r = run(1, "--help");
  expect(r.rc == 0 && r.out.find("usage: trainer --config FILE") != std::string::npos, "--help", r);

  const std::string bad = write("bad.yaml", "model: {name: resnet20, classes: 4}\ntrain:\n  bacth: 4\n");
  expect_error(run(2, "--config " + bad), "ringtrain: rank [01] of 2: " + bad + ":3: unknown key 'train.bacth'",
               "unknown key in the file");
  const std::string cfg = tiny_config("errors");
  expect_error(run(2, "--config " + cfg + " --set train.batch=four"),
               "ringtrain: rank [01] of 2: --set train.batch=four: key 'train.batch' expects an integer",
               "wrong type in --set");
  expect_error(run(2, "--config " + dir + "/absent.yaml"), "absent.yaml: cannot read the config file",
               "missing config file");
  // The CPU trainer points to trainer_cuda (or says it was built without CUDA), on every rank.
  expect_error(run(2, "--config " + cfg + " --set backend=cuda"),
               "rank [01] of 2: backend 'cuda'.*(built without CUDA|build/bin/trainer_cuda)", "cuda backend");
  expect_error(run(2, "--config " + cfg + " --set data.synthetic=false --set data.root=" + dir + "/no-data"),
               "no-data", "missing data root");
  expect_error(run(2, "--config " + cfg + " --frobnicate"), "unknown argument '--frobnicate'", "bad argument");
  // Ranks launched with other options (an MPMD line) are refused before any collective: this
  // hung in different collectives until the stall check.
  const std::string each = " --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " + trainer + " --config " + cfg;
  expect_error(shell("timeout 120 " + mpiexec + " -np 1" + each + " : -np 1" + each + " --resume auto"),
               "rank [01] of 2: command line: rank 1 has --resume auto, rank 0 no --resume \\(every rank must",
               "--resume on one rank only");
  expect_error(shell("timeout 120 " + mpiexec + " -np 1" + each + " : -np 1" + each + " --eval --checkpoint x.rtck"),
               "command line: rank 1 has --eval, rank 0 training", "--eval on one rank only");
  // A job too large for the memory there is says which key to lower: ResNet-50's activations at
  // batch 512 need tens of GiB, and the ranks' address space is capped at 2 GB. (Not in sanitizer
  // builds: their shadow memory alone is terabytes of address space.)
#if defined(RT_SANITIZED)
  std::printf("note: the out-of-memory check is left out in sanitizer builds\n");
  return;
#endif
  const std::string big = write("big.yaml",
                                "model: {name: resnet50, classes: 4}\n"
                                "data: {synthetic: true, synthetic_samples: 1024, synthetic_classes: 4,"
                                " image_size: 224, threads: 1}\n"
                                "train: {epochs: 1, batch: 512}\n"
                                "log: {print_config: false}\n"
                                "threads: 1\n"
                                "run_dir: " + dir + "/big\n");
  expect_error(shell("ulimit -v 2000000 && " + mpiexec + " -np 1 --bind-to none " + trainer + " --config " + big),
               "ringtrain: rank 0 of 1: host memory exhausted \\(std::bad_alloc\\); resnet50 \\(model.width 1\\) "
               "with train.batch 512 per rank \\(" + big + ":[0-9]+; also the evaluation batch\\) at 224 px on "
               "backend onednn does not fit in memory: lower train.batch \\(train.accumulate keeps the global batch\\)",
               "out of memory");
}

void check_run_eval_resume() {
  const std::string cfg = tiny_config("run");
  // With a moving average of the weights, evaluated beside the model and kept in the checkpoints,
  // and a gradient norm limit that every step is above; with a loss scale (a power of two: exact).
  Result r = run(2, "--config " + cfg + " --set train.ema=0.99 --set train.clip_grad_norm=1e-4 "
                    "--set loss_scale.mode=dynamic --set loss_scale.init=1024");
  expect(r.rc == 0 && r.out.find("epoch 2/2: train loss") != std::string::npos &&
             r.out.find("val loss") != std::string::npos && r.out.find(", EMA loss ") != std::string::npos &&
             r.out.find(", gradients clipped in ") != std::string::npos,
         "a short 2-rank run", r);
  const auto ck = checkpoints("run");
  expect(ck.size() == 2, "a checkpoint per epoch", r);
  if (ck.size() != 2) return;
  std::ifstream m(dir + "/run/metrics.jsonl");
  const std::string metrics((std::istreambuf_iterator<char>(m)), std::istreambuf_iterator<char>());
  expect(metrics.find("\"type\":\"step\"") != std::string::npos &&
             metrics.find("\"exposed_comm_s\"") != std::string::npos &&
             metrics.find("\"val_top5\"") != std::string::npos && metrics.find("\"ema_val_top1\"") != std::string::npos &&
             metrics.find("\"clipped\":1") != std::string::npos && metrics.find("\"clipped_steps\":") != std::string::npos &&
             metrics.find("\"optimizer\":\"sgd\"") != std::string::npos,
         "metrics.jsonl has start, step and epoch records", {0, metrics});
  expect(r.out.find(" steps to go, sgd base lr ") != std::string::npos, "the start line names the optimizer", r);

  // Evaluation on 3 ranks with the configuration saved in the checkpoint: all 40 images once, the
  // figures printed even with the progress display off.
  r = run(3, "--eval --checkpoint " + ck.back() + " --set log.progress=false");
  expect(r.rc == 0 && r.out.find("over 40 images") != std::string::npos &&
             r.out.find("; its moving average of the weights: top1 ") != std::string::npos,
         "--eval on 3 ranks", r);
  // ... whatever the training split would give a global batch: evaluation opens no training data.
  r = run(2, "--eval --checkpoint " + ck.back() + " --set log.progress=false --set train.batch=32 "
             "--set train.accumulate=2");
  expect(r.rc == 0 && r.out.find("over 40 images") != std::string::npos,
         "--eval with a train.batch the training split could not fill", r);
  // A run's gradient exchange and BN groups were set for its own ranks: a group of 2, nodes of 2
  // and its trace must not stop (nor be touched by) an evaluation on 3 ranks; nor must a run
  // folder the evaluation cannot write in.
  r = run(2, "--config " + cfg + " --set run_dir=" + dir + "/topo --set model.bn_group=2 --set "
             "comm.algorithm=hierarchical --set comm.ranks_per_node=2 --set train.epochs=1 --set "
             "log.timeline=" + dir + "/topo/trace-{rank}.json --set log.timeline_steps=1");
  const auto topo = checkpoints("topo");
  const std::string trace = dir + "/topo/trace-0.json";
  const auto trace_bytes = [&] { return fs::exists(trace) ? fs::file_size(trace) : 0; };
  const uintmax_t traced = trace_bytes();
  expect(r.rc == 0 && topo.size() == 1 && traced > 0, "a run with BN groups of 2, nodes of 2 and a trace", r);
  if (!topo.empty()) {
    r = run(3, "--eval --checkpoint " + topo.back() + " --set log.progress=false --set log.jsonl=" + dir +
               "/topo/trace-0.json/metrics.jsonl");
    expect(r.rc == 0 && r.out.find("over 40 images") != std::string::npos &&
               r.out.find("the evaluation's record is not kept") != std::string::npos,
           "--eval on 3 ranks of a run with groups and nodes of 2, its metrics file unwritable", r);
    expect(trace_bytes() == traced, "--eval left the run's trace as it was (" + std::to_string(traced) + " bytes, now " +
                                        std::to_string(trace_bytes()) + ")", r);
  }
  r = run(2, "--config " + cfg + " --resume auto");
  expect(r.rc == 0 && r.out.find("nothing to train") != std::string::npos &&
             r.out.find("its moving average of the weights is not continued (train.ema is 0)") != std::string::npos &&
             r.out.find("its loss scale 1024 is not continued (loss_scale.mode none") != std::string::npos &&
             r.out.find(ck.back() + " resumed with other settings: train.ema: 0.99 before, 0 now; "
                        "train.clip_grad_norm: 0.0001 before, 0 now; loss_scale.mode: dynamic before, none now; "
                        "loss_scale.init: 1024 before, 65536 now (the learning-rate schedule follows this run's)") !=
                 std::string::npos,
         "--resume auto after the end, with the keys the run had set no longer set", r);
  // Another learning rate is allowed, and said; a per-node key such as run_dir is not listed.
  const std::string same = " --set train.ema=0.99 --set train.clip_grad_norm=1e-4 --set loss_scale.mode=dynamic "
                           "--set loss_scale.init=1024 --set run_dir=" + dir + "/relr --resume " + ck.front();
  r = run(2, "--config " + cfg + " --set optimizer.lr=0.123" + same);
  expect(r.rc == 0 && r.out.find(ck.front() + " resumed with other settings: optimizer.lr: ") != std::string::npos &&
             r.out.find(" before, 0.123 now (the learning-rate schedule follows this run's)") != std::string::npos,
         "resume with another optimizer.lr", r);
  r = run(2, "--config " + cfg + same);
  expect(r.rc == 0 && r.out.find("resumed with other settings") == std::string::npos, "resume with the same settings", r);
  r = run(2, "--config " + cfg + " --set run_dir=" + dir + "/fresh --resume auto");
  expect(r.rc == 0 && r.out.find("starting fresh") != std::string::npos, "--resume auto without checkpoints", r);

  // Damaged and foreign checkpoints.
  const std::string cut = dir + "/cut.rtck";
  fs::copy_file(ck.back(), cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  expect_error(run(2, "--eval --checkpoint " + cut + " --config " + cfg), cut + ": truncated",
               "truncated checkpoint");
  expect_error(run(2, "--eval --checkpoint " + ck.back() + " --config " + cfg + " --set model.width=0.5"),
               ck.back() + ": written for another model \\(resnet20", "checkpoint of another model");
  const auto starts = [&] {
    const std::string text = read_file(dir + "/run/metrics.jsonl");
    size_t n = 0;
    for (size_t at = text.find("{\"type\":\"start\""); at != std::string::npos; at = text.find("{\"type\":\"start\"", at + 1))
      ++n;
    return n;
  };
  const size_t started = starts();
  expect_error(run(2, "--config " + cfg + " --set train.batch=2 --resume " + ck.front()),
               "written by 2 rank\\(s\\) x batch 4 = 8 images a step; this run has 2 rank\\(s\\) x batch 2 = 4 "
               "\\(resume with the same global batch",
               "resume with another global batch");
  expect_error(run(2, "--config " + cfg + " --set train.accumulate=2 --resume " + ck.front()),
               "this run has 2 rank\\(s\\) x batch 4 x 2 accumulated = 16", "resume with passes accumulated");
  // A start that a refused resume ends writes no record of a run that never was.
  expect(starts() == started && started > 0,
         "refused resumes added start records (" + std::to_string(started) + " before, " + std::to_string(starts()) + ")",
         {0, ""});
  // Another rank count at the same global batch goes on (test_mpi_trainer_resume checks the arithmetic).
  r = run(1, "--config " + cfg + " --set train.accumulate=2 --set run_dir=" + dir + "/elastic --resume " + ck.front());
  expect(r.rc == 0 &&
             r.out.find("resuming on 1 rank(s) x batch 4 x 2 accumulated from a checkpoint of 2 rank(s) x batch 4") !=
                 std::string::npos &&
             r.out.find("epoch 2/2: train loss") != std::string::npos,
         "resume on 1 rank with 2 passes accumulated", r);
  // --weights: a 3-class model from the 4-class run's weights, all but the classifier's; with
  // --resume auto, only until the new run has checkpoints of its own.
  auto tune_from = [&](const std::string& weights, const std::string& run) {
    return " --config " + cfg + " --set model.classes=3 --set data.synthetic_classes=3 --set run_dir=" + dir + "/" +
           run + " --weights " + weights + " --resume auto";
  };
  const std::string tune = tune_from(ck.front(), "tune");
  r = run(2, tune + " --set train.steps=3");
  expect(r.rc == 0 && r.out.find("weights from " + ck.front() + ": ") != std::string::npos &&
             r.out.find("as initialised: fc.bias ([3]; the checkpoint's is [4]), fc.weight ([3, 16]; the "
                        "checkpoint's is [4, 16])\n") != std::string::npos,
         "--weights into a model with another classifier", r);
  r = run(2, tune);
  expect(r.rc == 0 && r.out.find("weights from") == std::string::npos &&
             r.out.find("3 steps done") != std::string::npos,
         "--weights with --resume auto continues the run's own checkpoint", r);
  expect_error(run(2, "--config " + cfg + " --set model.name=resnet18 --set run_dir=" + dir + "/other --weights " +
                          ck.front()),
               "only 1 of the 102 tensors of resnet18 are in it under the same name and shape \\(it holds resnet20; "
               "first left out: ", "--weights of an unrelated model");
  // A deeper model of the same family takes most tensors by name: the line says whose they are.
  r = run(1, "--config " + cfg + " --set model.name=resnet32 --set run_dir=" + dir + "/deeper --set train.steps=1 "
             "--weights " + ck.front());
  expect(r.rc == 0 && r.out.find("(the file holds resnet20, this model is resnet32); as initialised: ") !=
                          std::string::npos,
         "--weights of resnet20 into resnet32", r);
  expect_error(run(1, "--config " + cfg + " --weights " + ck.front() + " --resume " + ck.front()),
               "--weights goes with --resume auto only", "--weights with --resume PATH");
  // A GPU run's file in the CPU program: the way out is named (or, without CUDA, why not).
  {
    rt::trainer::Checkpoint g = rt::trainer::checkpoint_read(ck.front());
    const size_t at = g.config_yaml.find("backend: onednn");
    expect(at != std::string::npos, "the saved configuration names its backend", {0, g.config_yaml});
    if (at != std::string::npos) g.config_yaml.replace(at, 15, "backend: cuda-bf16");
    const std::string gpu = dir + "/gpu-run.rtck";
    rt::trainer::checkpoint_write(gpu, g.meta, g.config_yaml, g.params, g.state, g.momentum, g.rank_state, g.layout);
    expect_error(run(1, "--eval --checkpoint " + gpu),
                 "(backend cuda-bf16, the training run's, is not in this program: --set backend=onednn evaluates the "
                 "checkpoint on the CPU|built without CUDA)",
                 "--eval of a GPU run's checkpoint by the CPU program");
    r = run(1, "--eval --checkpoint " + gpu + " --set backend=onednn");
    expect(r.rc == 0 && r.out.find(": top1 ") != std::string::npos, "... with --set backend=onednn", r);
  }
  // A file from before checkpoints listed their tensors serves the same model only, and says why.
  const std::string old = dir + "/old.rtck";
  const rt::trainer::Checkpoint c = rt::trainer::checkpoint_read(ck.front());
  rt::trainer::checkpoint_write(old, c.meta, c.config_yaml, c.params, c.state, c.momentum, c.rank_state);
  expect_error(run(1, tune_from(old, "tune_old")), old + ": written for another model .*; the file predates the tensor list",
               "--weights of another model from a file without a layout");
  r = run(1, "--config " + cfg + " --set run_dir=" + dir + "/same --set train.steps=1 --weights " + old);
  expect(r.rc == 0 && r.out.find("weights from " + old + ": 97 of 97 tensors") != std::string::npos,
         "--weights of the same model from a file without a layout", r);
  expect_error(run(1, "--config " + cfg + " --weights " + ck.front()),
               "--weights " + ck.front() + " lies in this run's own checkpoint folder", "--weights from the run itself");
  // A newer checkpoint damaged after it was written is passed over by --resume auto.
  fs::resize_file(ck.back(), 100);
  r = run(2, "--config " + cfg + " --resume auto");
  expect(r.rc == 0 && r.out.find("skipping a damaged checkpoint") != std::string::npos &&
             r.out.find("loaded " + ck.front()) != std::string::npos,
         "--resume auto passes over a damaged newest checkpoint", r);
  // All of them damaged: refused, not a fresh start that would drop the run's progress.
  for (const auto& e : fs::directory_iterator(fs::path(ck.front()).parent_path()))
    if (e.path().extension() == ".rtck") fs::resize_file(e.path(), 100);
  expect_error(run(2, "--config " + cfg + " --resume auto"),
               "--resume auto: every checkpoint in .* is damaged \\(.*truncated.*\\); nothing to resume from",
               "--resume auto with every checkpoint damaged");
}

// checkpoint.keep_best from the command line: one rank, 3 epochs, every one evaluated; best.rtck
// named where it is made, evaluated by --eval to the top-1 its record holds, and named by the
// run's closing line; refused without evaluations, naming the key.
void check_keep_best() {
  const std::string cfg = tiny_config("best");
  Result r = run(1, "--config " + cfg + " --set train.epochs=3 --set checkpoint.keep_best=true --set checkpoint.keep=1");
  const std::string best = dir + "/best/checkpoints/best.rtck";
  expect(r.rc == 0 && r.out.find("epoch 1/3: train loss") != std::string::npos &&
             r.out.find("% top5 ") != std::string::npos && r.out.find(", the best so far") != std::string::npos &&
             r.out.find(", the best so far (validation top-1 ") != std::string::npos &&
             r.out.find("): " + best + "\n") != std::string::npos && fs::exists(best),
         "a run keeping its best checkpoint", r);
  if (!fs::exists(best)) return;
  const rt::trainer::Checkpoint c = rt::trainer::checkpoint_read(best);
  // The run's last line: its steps, time and rate, and the best it reached.
  const std::string end = "; best validation top-1 " + rt::trainer::fixed(c.meta.best_top1, 2) + "% at step " +
                          std::to_string(c.meta.best_step) + " (epoch ";
  expect(r.out.find("\nfinished: 30 steps in ") != std::string::npos &&
             std::regex_search(r.out, std::regex(" img/s in the [0-9:]+ not evaluating\\)" + std::regex_replace(
                                                     end, std::regex("[()]"), "\\$&"))),
         "the closing line with the rate while training and the best top-1, '" + end + "'", r);
  // The end record counts the evaluations apart: the rate is training's.
  const std::string metrics = read_file(dir + "/best/metrics.jsonl");
  std::smatch m;
  const bool parts = std::regex_search(metrics, m, std::regex("\"type\":\"end\".*\"steps_run\":([0-9]+),"
                                                               "\"train_s\":([0-9.e+-]+),\"eval_s\":([0-9.e+-]+),"
                                                               "\"img_s\":([0-9.e+-]+)"));
  // 30 steps of 1 rank x the checkpoint's batch
  expect(parts && std::stod(m[3]) > 0 && std::stod(m[3]) < std::stod(m[2]) &&
             std::abs(std::stod(m[4]) * (std::stod(m[2]) - std::stod(m[3])) / (30.0 * c.meta.batch) - 1) < 1e-3,
         "the end record's img_s: the images over train_s less eval_s", {0, metrics});
  r = run(1, "--eval --checkpoint " + best + " --set log.progress=false");
  expect(r.rc == 0 && r.out.find(rt::trainer::fixed(c.meta.best_top1, 2) + "%") != std::string::npos,
         "--eval of best.rtck: top-1 " + rt::trainer::fixed(c.meta.best_top1, 2) + "%", r);
  expect_error(run(1, "--config " + cfg + " --set checkpoint.keep_best=true --set eval.every_epochs=0 "
                      "--set eval.at_end=false"),
               "key 'checkpoint.keep_best' needs evaluations to choose by", "keep_best without evaluations");
}

// --predict on a folder dataset's validation images: each image is prepared and scored as --eval
// scores it, so the files whose best class is their own folder number exactly --eval's top-1 of
// the same checkpoint, and with --ema its moving average's top-1; on 2 ranks each file is
// answered once; unreadable and undecodable files are named and the exit status is 1; and the
// command line's rules.
void check_predict() {
  const std::string root = dir + "/predict-data";
  const std::string cfg = write("predict.yaml",
                                "model: {name: resnet20, classes: 3, width: 0.25}\n"
                                "data: {root: " + root + ", image_size: 8, threads: 1,\n"
                                "       generate: {classes: 3, train_per_class: 8, val_per_class: 5, size: 16}}\n"
                                "train: {epochs: 2, batch: 4, ema: 0.7}\n"
                                "optimizer: {lr: 3.2}\n"
                                "log: {print_config: false}\n"
                                "threads: 1\n"
                                "run_dir: " + dir + "/predict\n");
  Result r = run(1, "--config " + cfg);
  const auto ck = checkpoints("predict");
  expect(r.rc == 0 && !ck.empty(), "a short run on generated images", r);
  if (ck.empty()) return;
  r = run(1, "--eval --checkpoint " + ck.back() + " --set log.progress=false");
  std::smatch m;
  const bool evaluated =
      r.rc == 0 && std::regex_search(r.out, m,
                                     std::regex("top1 ([0-9.]+)% top5 .* over 15 images.*moving average of the "
                                                "weights: top1 ([0-9.]+)%"));
  expect(evaluated, "--eval over the 15 validation images, the moving average too", r);
  if (!evaluated) return;
  const long eval_right = std::lround(std::stod(m[1].str()) * 15 / 100);
  const long ema_right = std::lround(std::stod(m[2].str()) * 15 / 100);
  std::vector<std::string> images;
  for (const auto& e : fs::recursive_directory_iterator(root + "/val"))
    if (e.is_regular_file()) images.push_back(e.path().string());
  std::sort(images.begin(), images.end());
  std::string args;
  for (const std::string& f : images) args += " " + f;
  std::string model_lines;
  for (const bool ema : {false, true}) {
    r = run(1, "--predict --checkpoint " + ck.back() + (ema ? " --ema" : "") + args);
    long right = 0, answered = 0;
    for (const std::string& f : images) {
      const size_t at = r.out.find(f + ": ");
      if (at == std::string::npos) continue;
      ++answered;
      const size_t from = at + f.size() + 2, to = r.out.find(" (", from);
      right += r.out.substr(from, to - from) == fs::path(f).parent_path().filename().string();
    }
    const long want = ema ? ema_right : eval_right;
    expect(r.rc == 0 && images.size() == 15 && answered == 15 && right == want,
           std::string("--predict") + (ema ? " --ema" : "") + ": " + std::to_string(right) + " of " +
               std::to_string(answered) + " files best scored as their own class, --eval counted " +
               std::to_string(want) + " of 15",
           r);
    if (!ema) model_lines = r.out;
    else expect(r.out != model_lines, "--ema: the moving average's answers differ from the model's", r);
  }
  r = run(2, "--predict --checkpoint " + ck.back() + " " + images.front());
  expect(r.rc == 0 && r.out.find(images.front() + ": ") == r.out.rfind(images.front() + ": ") &&
             r.out.find(images.front() + ": ") != std::string::npos,
         "--predict on 2 ranks answers once", r);
  // A folder stands for its images, sorted; --topk; the answers as CSV and JSON lines.
  r = run(1, "--predict --checkpoint " + ck.back() + " --topk 2 --output " + dir + "/p.csv " + root + "/val");
  std::string in_order;
  for (const std::string& f : images) in_order += f + ": ";
  std::string printed;
  for (size_t at = r.out.find(root + "/val/"); at != std::string::npos; at = r.out.find(root + "/val/", at + 1)) {
    const size_t colon = r.out.find(": ", at);
    printed += r.out.substr(at, colon + 2 - at);
    const size_t end = r.out.find('\n', at);
    expect(std::count(r.out.begin() + long(at), r.out.begin() + long(end), '%') == 2, "--topk 2: two classes a line",
           r);
  }
  const std::string csv = read_file(dir + "/p.csv");
  expect(r.rc == 0 && printed == in_order && csv.rfind("file,class_1,prob_1,class_2,prob_2,error\n", 0) == 0 &&
             std::count(csv.begin(), csv.end(), '\n') == 16 &&
             std::regex_search(csv, std::regex("\n" + images.front() + ",[^,]+,0\\.[0-9]+,[^,]+,0\\.[0-9]+,\n")),
         "--predict FOLDER --topk 2 --output p.csv: the 15 images in order, a header and a line each", {r.rc, r.out + csv});
  r = run(1, "--predict --checkpoint " + ck.back() + " --output " + dir + "/p.jsonl " + images.front() + " " + dir +
                 "/absent.png");
  const std::string jsonl = read_file(dir + "/p.jsonl");
  expect(r.rc == 1 &&
             std::regex_search(jsonl, std::regex("^\\{\"type\":\"prediction\",\"file\":\"" + images.front() +
                                                 "\",\"classes\":\\[\"[^\"]+\",\"[^\"]+\",\"[^\"]+\"\\],"
                                                 "\"probs\":\\[[0-9.e-]+,[0-9.e-]+,[0-9.e-]+\\]\\}\n")) &&
             jsonl.find("{\"type\":\"prediction\",\"file\":\"" + dir + "/absent.png\",\"error\":\"cannot read the file\"}\n") !=
                 std::string::npos,
         "--output p.jsonl: the classes (3: the model's count, below --topk's 5) and the unread file's error",
         {r.rc, r.out + jsonl});
  fs::create_directories(dir + "/no-images/sub");
  expect_error(run(1, "--predict --checkpoint " + ck.back() + " " + dir + "/no-images"),
               "--predict: the folder " + dir + "/no-images holds no .jpg, .jpeg or .png file", "--predict on an empty folder");
  expect_error(run(1, "--predict --checkpoint " + ck.back() + " --topk 0 " + images.front()),
               "--topk takes a whole number of classes, 1 or more, not '0'", "--topk 0");
  expect_error(run(1, "--predict --checkpoint " + ck.back() + " --output p.txt " + images.front()),
               "--output p.txt: name a .csv or a .jsonl file", "--output of another kind");
  expect_error(run(1, "--eval --checkpoint " + ck.back() + " --topk 3"), "--topk goes with --predict", "--topk with --eval");
  const std::string text = write("not-an-image.jpg", "hello");
  r = run(1, "--predict --checkpoint " + ck.back() + " " + images.front() + " " + text + " " + dir + "/absent.png");
  expect(r.rc == 1 && r.out.find(text + ": not a JPEG or PNG image") != std::string::npos &&
             r.out.find(dir + "/absent.png: cannot read the file") != std::string::npos &&
             r.out.find("--predict: 2 of 3 files not classified") != std::string::npos &&
             r.out.find(images.front() + ": ") != std::string::npos,
         "--predict names the files it cannot classify", r);
  expect_error(run(1, "--predict --checkpoint " + ck.back()), "--predict needs image files", "--predict without files");
  expect_error(run(1, "--config " + cfg + " " + images.front()), "image files go with --predict",
               "an image file without --predict");
  expect_error(run(1, "--predict --eval --checkpoint " + ck.back() + " " + images.front()),
               "--eval and --predict exclude each other", "--predict with --eval");
  expect_error(run(1, "--eval --ema --checkpoint " + ck.back()), "--ema goes with --predict", "--ema with --eval");
  const auto plain = checkpoints("best");  // check_keep_best's run keeps no moving average
  if (!plain.empty())
    expect_error(run(1, "--predict --ema --checkpoint " + plain.front() + " " + images.front()),
                 "--ema: the file holds no moving average of the weights", "--ema without a moving average");
}

// Keys that may differ per rank take no collective of their own (one that only some ranks made
// hung the job before any check could see it): threads (0 asks the node's size), and
// data.generate (rank 0's decides). Ranks launched with their own command lines (MPMD).
void check_per_rank_settings() {
  const std::string cfg = tiny_config("per_rank");
  const auto mpmd = [&](const std::string& a, const std::string& b) {
    const std::string flags = " --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 ";
    return shell("env -u OMP_NUM_THREADS timeout -k 5 60 " + mpiexec + flags + "-np 1 " + trainer + " --config " + cfg + " " + a + " : " +
                 flags + "-np 1 " + trainer + " --config " + cfg + " " + b);
  };
  Result r = mpmd("--set threads=1 --set train.steps=1", "--set threads=0 --set train.steps=1");
  expect(r.rc == 0 && r.out.find("finished: 1 steps") != std::string::npos, "threads 1 on rank 0, 0 on rank 1", r);
  const std::string gen = " --set data.synthetic=false --set data.root=" + dir + "/per_rank_data --set train.steps=1 ";
  r = mpmd(gen + "--set data.generate.classes=4 --set data.generate.train_per_class=4 --set data.generate.size=12",
           gen + "--set data.generate.classes=0");
  expect(r.rc == 0 && r.out.find("generating " + dir + "/per_rank_data") != std::string::npos,
         "data.generate on rank 0 only: generated, trained", r);
  // A fault drill's checkpoint evaluated: the drill (a stall in the evaluation after step 2) is
  // not repeated by --eval.
  r = run(1, "--config " + cfg + " --set run_dir=" + dir + "/drill --set debug.fault=stall_eval --set debug.step=2 "
             "--set checkpoint.every_steps=1 --set train.steps=3");
  const std::string ck = dir + "/drill/checkpoints/ckpt-0000000002.rtck";
  r = shell("timeout -k 5 60 " + mpiexec + " -np 1 --oversubscribe " + trainer + " --eval --checkpoint " + ck);
  expect(r.rc == 0 && r.out.find("injecting fault") == std::string::npos, "--eval of a drill's checkpoint", r);
}

}  // namespace

int main(int argc, char** argv) {
  if (!start(argc, argv, "test_mpi_trainer_cli", {"errors", "resume", "best"})) return 2;
  if (wants("errors")) {
    check_errors();
    check_per_rank_settings();
  }
  if (wants("resume")) check_run_eval_resume();
  if (wants("best")) {  // --predict's last check takes keep_best's checkpoint
    check_keep_best();
    check_predict();
  }
  return finish("test_mpi_trainer_cli");
}

// The trainer program on a user's own data and run folders, launched through mpirun: undecodable
// validation images left out and counted, not fatal; validation data checked at start-up, before
// any training is lost; shard sets whose classes differ refused; --predict naming classes from the
// checkpoint; run folders reused by a new run or by a resume from an older checkpoint (the later
// files set aside, never deleted or taken for the new run's); a resume with another seed refused;
// train.steps past the epochs; a metrics file on a full disk or left with half a record; ranks
// launched with different settings or data refused at start-up.
// Usage: test_mpi_trainer_data MPIEXEC TRAINER [data|runs]   (not itself under mpirun)
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/shard.h"
#include "tests/mpi/cli_util.h"
#include "trainer/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using namespace cli;

// A 3-class ResNet-20 job on generated JPEGs under dir/<data> (made by the trainer on first use),
// its run folder dir/<run>; `extra` lines are added to the config.
std::string image_config(const std::string& name, const std::string& data, const std::string& run,
                         const std::string& extra = "", bool generate = true) {
  return write(name + ".yaml", "model: {name: resnet20, classes: 3, width: 0.25}\n"
                               "data: {root: " + dir + "/" + data + ", image_size: 8, threads: 1" +
                                   (generate ? ",\n       generate: {classes: 3, train_per_class: 8, val_per_class: "
                                               "5, size: 16}" : "") + "}\n"
                               "train: {epochs: 2, batch: 4}\n"
                               "optimizer: {lr: 0.4}\n"
                               "log: {print_config: false}\n"
                               "threads: 1\n"
                               "run_dir: " + dir + "/" + run + "\n" + extra);
}

bool has(const Result& r, const std::string& s) { return r.out.find(s) != std::string::npos; }

void check_data() {
  // Two undecodable validation images (an empty file, a cut JPEG) are left out, named, and
  // counted apart: 13 of the 15 evaluated, by training's evaluation and by --eval alike.
  const std::string cfg = image_config("bad-val", "imgs", "bad-val");
  Result r = run(1, "--config " + cfg + " --set train.steps=1");  // generates the images
  expect(r.rc == 0, "a first run on generated images", r);
  // A classifier wider than the data's classes (fine-tuning with model.classes left at the
  // pretrained count), and a timeline window past the run's end, are said, not silently run.
  r = run(1, "--config " + cfg + " --set train.steps=1 --set model.classes=5 --set log.progress=false --set run_dir=" +
                 dir + "/wide-fc --set log.timeline=" + dir + "/wide-fc/trace.json --set log.timeline_skip=100");
  expect(r.rc == 0 && has(r, "note: model.classes 5 (set in --set) for the 3 classes of folder ") &&
             has(r, ": 2 outputs no label reaches") &&
             has(r, "warning: log.timeline_skip 100 passes the run's last step (1 to go): the timeline traces no step"),
         "model.classes past the data's classes and an empty timeline window, said", r);
  const fs::path val = fs::path(dir) / "imgs/val";
  const fs::path cls = *fs::directory_iterator(val);
  const fs::path good = *fs::directory_iterator(cls);
  std::ofstream(cls / "zz-empty.jpg").flush();
  fs::copy_file(good, cls / "zz-cut.jpg");
  fs::resize_file(cls / "zz-cut.jpg", 300);
  for (const int np : {1, 2}) {
    r = run(np, "--config " + cfg + " --set run_dir=" + dir + "/bad-val" + std::to_string(np));
    expect(r.rc == 0 && has(r, "(15 images, 2 undecodable left out)") &&
               has(r, "zz-empty.jpg: cannot be decoded: an empty file") &&
               has(r, "zz-cut.jpg: cannot be decoded: a JPEG cut short (no end-of-image marker)"),
           "training evaluates the 15 decodable validation images on " + std::to_string(np) + " rank(s)", r);
  }
  {  // Training's replacements are counted every epoch, not only warned about once.
    const std::string bad = image_config("bad-train", "imgs-bad-train", "bad-train");
    expect(run(1, "--config " + bad + " --set train.steps=1").rc == 0, "generated images", {});
    const fs::path train_cls = *fs::directory_iterator(fs::path(dir) / "imgs-bad-train/train");
    std::ofstream(train_cls / "zz-empty.jpg").flush();
    r = run(2, "--config " + bad + " --set run_dir=" + dir + "/bad-train2 --set eval.every_epochs=0 "
               "--set eval.at_end=false");
    const std::string metrics = read_file(dir + "/bad-train2/metrics.jsonl");
    expect(r.rc == 0 && has(r, "undecodable image(s) replaced by others of the ranks' shares)") &&
               metrics.find("\"train_skipped\":1") != std::string::npos,
           "an undecodable training image counted in its epoch", r);
    // Half the images undecodable and one step run: only the batch trained counts, not those the
    // decode threads had made ready ahead of it (at most its 4 images, 1 rank x batch 4).
    for (int i = 0; i < 24; ++i) std::ofstream(train_cls / ("zz-empty" + std::to_string(i) + ".jpg")).flush();
    r = run(1, "--config " + bad + " --set run_dir=" + dir + "/bad-train3 --set eval.every_epochs=0 "
               "--set eval.at_end=false --set train.steps=1");
    std::smatch m;
    const std::string m3 = read_file(dir + "/bad-train3/metrics.jsonl");
    const bool counted = std::regex_search(m3, m, std::regex("\"train_skipped\":(\\d+)"));
    expect(r.rc == 0 && counted && std::stoi(m[1]) <= 4,
           "a one-step run counts the replacements of its one batch (" + (counted ? m[1].str() : "none") + ")",
           {r.rc, r.out + m3});
    for (int i = 0; i < 24; ++i) fs::remove(train_cls / ("zz-empty" + std::to_string(i) + ".jpg"));
  }
  const auto ck = checkpoints("bad-val2");
  if (!ck.empty()) {
    r = run(3, "--eval --checkpoint " + ck.back());
    expect(r.rc == 0 && has(r, "over 15 images, 2 undecodable left out"), "--eval counts the left-out images", r);
  }
  fs::remove(cls / "zz-empty.jpg");
  fs::remove(cls / "zz-cut.jpg");

  // Validation data that cannot serve stops the job before its first step.
  fs::create_directories(dir + "/noval/train");
  fs::copy(dir + "/imgs/train", dir + "/noval/train", fs::copy_options::recursive);
  r = run(2, "--config " + image_config("noval", "noval", "noval", "", false));
  expect_error(r, "rank [01] of 2: data: " + dir + "/noval/val is not a folder", "a missing validation folder");
  expect(!has(r, "epoch 1/") && checkpoints("noval").empty(), "... found before any training", r);
  r = run(2, "--config " +
                 image_config("noeval", "noval", "noeval", "eval: {every_epochs: 0, at_end: false}\n", false));
  expect(r.rc == 0, "... and not needed by a run that never evaluates", r);

  // Shard sets made with other class lists: the same label would name another class.
  using namespace rt::data;
  const auto train = open_folder(dir + "/imgs", Split::train);
  pack_shards(*train, "train", dir + "/shards/train", 1 << 20);
  fs::create_directories(dir + "/more/train/0");  // one class more, sorted first: every label moves
  fs::copy(dir + "/imgs", dir + "/more", fs::copy_options::recursive);
  fs::copy_file(good, dir + "/more/train/0/x.jpg");
  pack_shards(*open_folder(dir + "/more", Split::val), "val", dir + "/shards/val", 1 << 20);
  const std::string shards = write("shards.yaml", "model: {name: resnet20, classes: 4, width: 0.25}\n"
                                                  "data: {train_shards: " + dir + "/shards/train.index, val_shards: " +
                                                      dir + "/shards/val.index, image_size: 8, threads: 1}\n"
                                                  "train: {epochs: 1, batch: 4}\n"
                                                  "log: {print_config: false}\n"
                                                  "threads: 1\n"
                                                  "run_dir: " + dir + "/shards-run\n");
  r = run(2, "--config " + shards);
  expect_error(r, "training \\(shard set " + dir + "/shards/train.index\\) and validation \\(shard set " + dir +
                      "/shards/val.index\\) name different classes \\(3 and 4; label 0 is '[^']+' in training, "
                      "'0' in validation\\)",
               "shard sets of other class lists");
  expect(!has(r, "epoch 1/"), "... refused at start-up", r);

  // List files: the class count is both lists' largest label plus one, and the message says so.
  std::string lines;
  for (int i = 0; i < 8; ++i) lines += good.string() + " " + std::to_string(i % 3) + "\n";
  const std::string tl = write("train.txt", lines), vl = write("val.txt", good.string() + " 7\n");
  expect_error(run(1, "--config " + cfg + " --set data.root= --set data.generate.classes=0 --set data.train_list=" +
                          tl + " --set data.val_list=" + vl),
               "model.classes is 3 but the training data \\(list file " + tl +
                   "\\) has 8 classes \\(the largest label of data.train_list and data.val_list, plus one\\)",
               "a validation list's label past model.classes");
  // A validation list numbered from 1 beside a training list numbered from 0: one class count
  // serves both, so it is only said, on rank 0.
  r = run(2, "--config " + cfg + " --set data.root= --set data.generate.classes=0 --set model.classes=4 --set "
             "train.steps=1 --set train.batch=2 --set data.train_list=" + tl + " --set data.val_list=" +
             write("val1.txt", good.string() + " 3\n" + good.string() + " 1\n"));
  expect(r.rc == 0 && has(r, "warning: validation labels reach 3, training's only 2 (list file ") &&
             has(r, "are both lists numbered from 0?"),
         "a validation list's labels past the training list's", r);

  // --predict names classes as the checkpoint's training data did, whatever the folder holds now.
  const auto own = checkpoints("bad-val1");
  if (own.empty()) return;
  const std::string name = cls.filename().string();
  r = run(1, "--predict --checkpoint " + own.back() + " " + good.string());
  const bool named = r.rc == 0 && has(r, good.string() + ": ") && has(r, name);
  expect(named, "--predict names the classes", r);
  // --eval on the validation folder alone (no train/ beside it): the checkpoint's class list
  // labels it, to the same figures.
  const fs::path valonly = fs::path(dir) / "valonly";
  fs::remove_all(valonly);
  fs::create_directories(valonly);
  fs::copy(fs::path(dir) / "imgs/val", valonly / "val", fs::copy_options::recursive);
  const auto figures = [](const Result& x) {
    const size_t at = x.out.find(": top1 ");
    return at == std::string::npos ? std::string() : x.out.substr(at, x.out.find(" (", at) - at);  // not the time
  };
  const Result full = run(1, "--eval --checkpoint " + own.back());
  const Result alone = run(1, "--eval --checkpoint " + own.back() + " --set data.root=" + valonly.string());
  expect(full.rc == 0 && alone.rc == 0 && !figures(full).empty() && figures(full) == figures(alone),
         "--eval of the validation folder alone: '" + figures(alone) + "', with train/ beside it '" + figures(full) + "'",
         alone);
  // ... and a dataset whose classes are named otherwise is refused, not scored by other labels.
  const fs::path renamed = fs::path(dir) / "imgs-renamed";
  fs::remove_all(renamed);
  fs::copy(fs::path(dir) / "imgs", renamed, fs::copy_options::recursive);
  for (const char* split : {"train", "val"}) fs::rename(renamed / split / name, renamed / split / "aaa");
  expect_error(run(1, "--eval --checkpoint " + own.back() + " --set data.root=" + renamed.string()),
               own.back() + ": written for other classes than folder .*/imgs-renamed/val names \\(3 and 3; label [0-2] "
                            "is '[^']+' in the file, '[^']+' here\\): the same label would mean another class",
               "--eval of a dataset whose classes are named otherwise");
  fs::create_directories(dir + "/imgs/train/aaa");
  fs::copy_file(good, dir + "/imgs/train/aaa/x.jpg");
  const Result later = run(1, "--predict --checkpoint " + own.back() + " " + good.string());
  expect(later.rc == 0 && later.out == r.out && !has(later, "aaa"),
         "--predict: the same names after a class folder was added to the dataset", later);
  // A weights file without a dataset in its configuration (as tools/torch_weights.py import
  // writes) classifies without one; evaluating it needs one, and says so.
  const rt::trainer::Checkpoint c = rt::trainer::checkpoint_read(own.back());
  const std::string bare = dir + "/bare.rtck";
  rt::trainer::checkpoint_write(bare, c.meta, "model:\n  name: resnet20\n  classes: 3\n  width: 0.25\n", c.params,
                                c.state, {}, {}, c.layout);
  r = run(1, "--predict --weights " + bare + " " + good.string());
  expect(r.rc == 0 && has(r, good.string() + ": ") &&
             has(r, "classes by number: " + bare + " names none, and no dataset folder is given to name them"),
         "--predict --weights of a file that names no dataset: classes by number, said", r);
  expect_error(run(1, "--eval --weights " + bare), bare + " \\(saved configuration\\): names no dataset to evaluate "
                                                          "on: give --config FILE or --set data.root=PATH",
               "--eval --weights of a file that names no dataset");
}

void check_runs() {
  const std::string cfg = tiny_config("runs");
  const std::string ckdir = dir + "/runs/checkpoints";
  Result r = run(2, "--config " + cfg + " --set checkpoint.every_steps=3 --set checkpoint.keep=5");
  const auto first = checkpoints("runs");  // steps 3, 5 (epoch), 6, 9, 10
  expect(r.rc == 0 && first.size() == 5, "a run with five checkpoints", r);
  if (first.size() != 5) return;

  // Back to step 3 with another rate: steps 5..10 of the first history are set aside, whole,
  // and pruning to 1 keeps the new run's own last checkpoint.
  r = run(2, "--config " + cfg + " --set optimizer.lr=1 --set checkpoint.keep=1 --resume " + first.front());
  std::vector<fs::path> aside;
  for (const auto& e : fs::directory_iterator(ckdir))
    if (e.is_directory()) aside.push_back(e.path());
  expect(r.rc == 0 && has(r, "4 checkpoint file(s) written after step 3, where this run resumes") &&
             has(r, "epoch 1/2: train loss") && has(r, "% (its steps 4-5 of 5 only: resumed mid-epoch)") &&
             aside.size() == 1 && checkpoints("runs").size() == 1 && checkpoints("runs").back() == first.back(),
         "a resume from an older checkpoint sets the later ones aside", r);
  if (aside.size() == 1) {
    size_t kept = 0;
    for (const auto& e : fs::directory_iterator(aside[0])) kept += e.path().extension() == ".rtck";
    expect(kept == 4, "... all four of them, in " + aside[0].string(), r);
  }
  const rt::trainer::Checkpoint now = rt::trainer::checkpoint_read(checkpoints("runs").back());
  expect(now.config_yaml.find("lr: 1\n") != std::string::npos, "... and the newest is the new run's", r);

  // The seed draws every epoch's order: a resume with another one is refused.
  expect_error(run(2, "--config " + cfg + " --set seed=7 --resume " + checkpoints("runs").back()),
               "written by a run with seed 0; this run's seed is 7 \\(resume with --set seed=0",
               "a resume with another seed");

  // A new run in the same folder sets the earlier run's checkpoints aside; --resume auto then
  // continues the new run, not the old one.
  r = run(2, "--config " + cfg + " --set train.steps=4 --set checkpoint.keep=2");
  expect(r.rc == 0 && has(r, "1 checkpoint file(s) written after step 0, where this run starts (an earlier run's)"),
         "a new run in a used run folder", r);
  r = run(2, "--config " + cfg + " --set train.steps=5 --resume auto");
  expect(r.rc == 0 && has(r, "loaded " + dir + "/runs/checkpoints/ckpt-0000000004.rtck"),
         "--resume auto continues the new run", r);

  // train.steps past the epochs ends with them, and says so; a metrics file that cannot be
  // written is named once, and the run goes on.
  r = run(1, "--config " + cfg + " --set run_dir=" + dir + "/full --set log.jsonl=/dev/full --set train.steps=50");
  expect(r.rc == 0 && has(r, "train.steps 50 (set in --set) is past the end of train.epochs: the run ends after "
                             "epoch 2, step 20") &&
             has(r, "warning: writing the metrics file /dev/full failed (No space left on device)"),
         "train.steps past the epochs; a full metrics disk", r);

  // A metrics file that a killed run left with half a record: the next run starts a new line.
  const std::string cut = write("cut.jsonl", "{\"type\":\"step\",\"step\":3");
  r = run(1, "--config " + cfg + " --set run_dir=" + dir + "/cut --set log.jsonl=" + cut + " --set train.steps=1");
  expect(r.rc == 0 && read_file(cut).rfind("{\"type\":\"step\",\"step\":3\n{\"type\":\"start\"", 0) == 0,
         "appends after half a record start on a new line", {0, read_file(cut)});

  // A NaN loss with the gradient check off: the message does not claim the gradients finite.
  r = run(2, "--config " + cfg + " --set run_dir=" + dir + "/nan --set check.finite=false --set debug.fault=nan "
             "--set debug.rank=1 --set debug.step=2 --set debug.param=fc.weight");
  expect_error(r, "rank 1 of 2: training diverged: the loss is nan at step 2 .*the gradients were not checked "
                  "\\(check.finite is off", "a NaN loss with check.finite off");
  // A checkpoint folder that cannot be made is found before the first step.
  r = run(2, "--config " + cfg + " --set run_dir=" + dir + "/ro --set checkpoint.dir=" + cfg + "/sub");
  expect_error(r, cfg + "/sub: cannot create the checkpoint folder \\(.*; checkpoint.dir set in --set",
               "an unusable checkpoint folder");
  expect(!has(r, "epoch 1/"), "... found before any training", r);
  // So is a run folder that cannot be made: the cause named, and the key.
  r = run(2, "--config " + cfg + " --set run_dir=" + cfg + "/run");
  expect_error(r, cfg + "/run: cannot create the folder of the metrics file \\(.*\\); run_dir set in --set",
               "an unusable run folder");
}

// Two ranks launched with different settings or data (one mpirun, a command line per rank):
// refused at start-up, naming the rank and what differs, where they used to hang in different
// collectives or train on overlapping shares.
void check_ranks() {
  const std::string cfg = image_config("ranks", "imgs-r", "ranks");
  Result r = run(1, "--config " + cfg + " --set train.steps=1");  // generates the images
  expect(r.rc == 0, "a first run on generated images", r);
  const auto two = [&](const std::string& rank0, const std::string& rank1) {
    const std::string each = " --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " + trainer + " --config " + cfg;
    return shell("timeout 120 " + mpiexec + " -np 1" + each + " " + rank0 + " : -np 1" + each + " " + rank1);
  };
  r = two("", "--set train.epochs=1 --set seed=5");
  expect_error(r, "ranks disagree at start-up \\(2 ranks\\): rank 1's configuration differs from rank 0's: "
                  "train.epochs: 2 on rank 0, 1 on rank 1; seed: [0-9]+ on rank 0, 5 on rank 1",
               "another train.epochs and seed on rank 1");
  // The stall check on one rank only: its watches are collectives made before the comm check's.
  r = two("", "--set comm.stall_warning_s=0 --set comm.stall_abort_s=0");
  expect_error(r, "rank 1's configuration differs from rank 0's: comm.stall_warning_s: 60 on rank 0, 0 on rank 1; "
                  "comm.stall_abort_s: 600 on rank 0, 0 on rank 1", "the stall check off on rank 1 only");
  // The same images less two training ones, under another root.
  const fs::path less = fs::path(dir) / "imgs-r-less";
  fs::remove_all(less);
  fs::copy(fs::path(dir) / "imgs-r", less, fs::copy_options::recursive);
  const fs::path cls = *fs::directory_iterator(less / "train");
  std::vector<fs::path> files(fs::directory_iterator(cls), fs::directory_iterator{});
  std::sort(files.begin(), files.end());
  fs::remove(files[0]);
  fs::remove(files[1]);
  r = two("", "--set data.root=" + less.string());
  expect_error(r, "rank 1 sees 22 training samples of 3 classes \\([^;]+; folder " + less.string() +
                      "/train\\), 15 validation samples .*, rank 0 24 training samples",
               "a dataset with two training images fewer on rank 1");
  // As many images in as many classes, of other names (another dataset's folders).
  const fs::path renamed = fs::path(dir) / "imgs-r-renamed";
  fs::remove_all(renamed);
  fs::copy(fs::path(dir) / "imgs-r", renamed, fs::copy_options::recursive);
  for (const char* split : {"train", "val"}) {
    std::vector<fs::path> classes(fs::directory_iterator(renamed / split), fs::directory_iterator{});
    std::sort(classes.begin(), classes.end());
    fs::rename(classes.back(), renamed / split / "zzz-other");
  }
  r = two("", "--set data.root=" + renamed.string());
  expect_error(r, "rank 1 sees 24 training samples of 3 classes \\([^;]* … zzz-other; folder ", "other class names on rank 1");
  // The same images with one file renamed: as many samples of the same classes, but sample i is
  // not the same image on both ranks.
  const fs::path moved = fs::path(dir) / "imgs-r-moved";
  fs::remove_all(moved);
  fs::copy(fs::path(dir) / "imgs-r", moved, fs::copy_options::recursive);
  const fs::path first_class = *fs::directory_iterator(moved / "train");
  std::vector<fs::path> in_class(fs::directory_iterator(first_class), fs::directory_iterator{});
  std::sort(in_class.begin(), in_class.end());
  fs::rename(in_class[0], first_class / ("zzz" + in_class[0].extension().string()));
  r = two("", "--set data.root=" + moved.string());
  expect_error(r, "rank 1 sees 24 training samples of 3 classes .*, with other labels or file names in sample order "
                  "in its training data \\(another copy, or the same files listed in another order\\), rank 0 24 "
                  "training samples", "a file renamed on rank 1");
  // Where the data is, and how many threads read it, may differ.
  r = two("--set train.steps=2", "--set train.steps=2 --set data.threads=2 --set data.root=" + dir + "/imgs-r/");
  expect(r.rc == 0, "another data.root holding the same data, and other thread counts, on rank 1", r);
}

}  // namespace

int main(int argc, char** argv) {
  if (!start(argc, argv, "test_mpi_trainer_data", {"data", "runs", "ranks"})) return 2;
  if (wants("data")) check_data();
  if (wants("runs")) check_runs();
  if (wants("ranks")) check_ranks();
  return finish("test_mpi_trainer_data");
}

// Trainer configuration: parsing, every error message (file:line and key), --set overrides,
// validation, the printed YAML reading back the same, the shipped configs, the command line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/error_of.h"
#include "trainer/cli.h"
#include "trainer/config.h"

namespace rt::trainer {
namespace {

namespace fs = std::filesystem;

constexpr auto error_of = [](auto&& f) { return rt_test::error_of<ConfigError>(f); };

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / name;
  std::ofstream(p) << text;
  return p.string();
}

TEST(trainer_config, DefaultsAndValues) {
  Config c = config_parse("", "empty.yaml");
  EXPECT_EQ(c.model.name, "resnet50");
  EXPECT_EQ(c.train.batch, 32);
  EXPECT_EQ(c.cuda.conv_algos, "auto");
  EXPECT_FALSE(c.cuda.deterministic);
  EXPECT_EQ(c.cuda.workspace_mib, 1024);
  EXPECT_EQ(c.cuda.algo_cache, "");
  c = config_parse("cuda: {conv_algos: heuristic, deterministic: true, workspace_mib: 256, "
                   "algo_cache: /tmp/algos.tsv}\n", "g.yaml");
  EXPECT_EQ(c.cuda.conv_algos, "heuristic");
  EXPECT_TRUE(c.cuda.deterministic);
  EXPECT_EQ(c.cuda.workspace_mib, 256);
  EXPECT_EQ(c.cuda.algo_cache, "/tmp/algos.tsv");
  c = config_parse(
      "model:\n  name: resnet18\n  width: 0.5\ntrain: {batch: 64, epochs: 3}\n"
      "schedule:\n  kind: multistep\n  milestones: [1, 2]\ndata:\n  synthetic: true\n"
      "  mean: [0.5, 0.5, 0.5]\nseed: 7\n",
      "x.yaml");
  EXPECT_EQ(c.model.name, "resnet18");
  EXPECT_DOUBLE_EQ(c.model.width, 0.5);
  EXPECT_EQ(c.train.batch, 64);
  EXPECT_EQ(c.schedule.kind, ScheduleKind::multistep);
  EXPECT_EQ(c.schedule.milestones, (std::vector<double>{1, 2}));
  EXPECT_FLOAT_EQ(c.data.mean[1], 0.5f);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.origin.at("train.batch"), "x.yaml:4");
  EXPECT_NO_THROW(config_validate(c));
}

TEST(trainer_config, UnknownKeyNamesFileLineAndKey) {
  const std::string e = error_of([] { config_parse("model:\n  name: resnet18\n  nme: x\n", "cfg.yaml"); });
  EXPECT_NE(e.find("cfg.yaml:3: unknown key 'model.nme'"), std::string::npos) << e;
  EXPECT_NE(e.find("model takes: name, classes"), std::string::npos) << e;
  const std::string top = error_of([] { config_parse("seed: 1\nepochs: 3\n", "cfg.yaml"); });
  EXPECT_NE(top.find("cfg.yaml:2: unknown key 'epochs' (top level takes:"), std::string::npos) << top;
}

TEST(trainer_config, WrongTypeNamesFileLineAndKey) {
  auto e = error_of([] { config_parse("train:\n  batch: many\n", "t.yaml"); });
  EXPECT_NE(e.find("t.yaml:2: key 'train.batch' expects an integer, got 'many'"), std::string::npos) << e;
  e = error_of([] { config_parse("optimizer:\n  nesterov: 3\n", "t.yaml"); });
  EXPECT_NE(e.find("t.yaml:2: key 'optimizer.nesterov' expects true or false, got '3'"), std::string::npos) << e;
  e = error_of([] { config_parse("schedule:\n  milestones: 30\n", "t.yaml"); });
  EXPECT_NE(e.find("key 'schedule.milestones' expects a list of numbers"), std::string::npos) << e;
  e = error_of([] { config_parse("model: resnet50\n", "t.yaml"); });
  EXPECT_NE(e.find("t.yaml:1: key 'model' is a section and expects a mapping"), std::string::npos) << e;
  e = error_of([] { config_parse("seed: -1\n", "t.yaml"); });
  EXPECT_NE(e.find("key 'seed' expects a non-negative integer, got '-1'"), std::string::npos) << e;
  e = error_of([] { config_parse("schedule: {kind: linear}\n", "t.yaml"); });
  EXPECT_NE(e.find("t.yaml:1: key 'schedule.kind'"), std::string::npos) << e;
  EXPECT_NE(e.find("linear"), std::string::npos) << e;
  e = error_of([] { config_parse("train:\n  batch: [1\n", "t.yaml"); });
  EXPECT_NE(e.find("t.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;
}

TEST(trainer_config, FileErrors) {
  auto e = error_of([] { config_load("/nonexistent/dir/x.yaml"); });
  EXPECT_NE(e.find("/nonexistent/dir/x.yaml: cannot read the config file"), std::string::npos) << e;
  const std::string path = write_temp("rt_cfg_line.yaml", "# comment\nmodel:\n  classes: 10\n  depth: 3\n");
  e = error_of([&] { config_load(path); });
  EXPECT_NE(e.find(path + ":4: unknown key 'model.depth'"), std::string::npos) << e;
}

TEST(trainer_config, SetOverrides) {
  Config c = config_parse("train: {batch: 8}\n", "s.yaml", {"train.batch=16", "schedule.milestones=[5, 9]",
                                                           "data.root=/data/x", "optimizer.nesterov=true"});
  EXPECT_EQ(c.train.batch, 16);
  EXPECT_EQ(c.schedule.milestones, (std::vector<double>{5, 9}));
  EXPECT_EQ(c.data.root, "/data/x");
  EXPECT_TRUE(c.optimizer.sgd.nesterov);
  EXPECT_EQ(c.origin.at("train.batch"), "--set");
  auto e = error_of([] { config_parse("", "s.yaml", {"train.batch=abc"}); });
  EXPECT_NE(e.find("--set train.batch=abc: key 'train.batch' expects an integer, got 'abc'"), std::string::npos) << e;
  e = error_of([] { config_parse("", "s.yaml", {"train.bacth=4"}); });
  EXPECT_NE(e.find("--set train.bacth=4: unknown key 'train.bacth' (did you mean 'train.batch'? train takes: "
                   "epochs, steps, batch"),
            std::string::npos) << e;
  e = error_of([] { config_parse("", "s.yaml", {"train.batch"}); });
  EXPECT_NE(e.find("expected key=value"), std::string::npos) << e;
}

TEST(trainer_config, SetWholeSections) {
  // A section's keys in one --set, the others kept; each named --set.
  Config c = config_parse("model: {name: resnet18, classes: 7}\n", "s.yaml", {"model={name: resnet20, width: 0.5}"});
  EXPECT_EQ(c.model.name, "resnet20");
  EXPECT_DOUBLE_EQ(c.model.width, 0.5);
  EXPECT_EQ(c.model.classes, 7);
  EXPECT_EQ(c.origin.at("model.name"), "--set");
  EXPECT_EQ(c.origin.at("model.classes"), "s.yaml:1");
  auto e = error_of([] { config_parse("", "s.yaml", {"train=4"}); });
  EXPECT_NE(e.find("--set train=4: key 'train' is a section and expects a mapping (epochs, steps, batch"),
            std::string::npos) << e;
  e = error_of([] { config_parse("", "s.yaml", {"model={nmae: resnet20}"}); });
  EXPECT_NE(e.find("unknown key 'model.nmae' (did you mean 'model.name'?"), std::string::npos) << e;
  // Below a single value: no section there (the mapping form is for lr_mult only).
  e = error_of([] { config_parse("", "s.yaml", {"train.batch.x=4"}); });
  EXPECT_NE(e.find("'train.batch' is one value, not a section (--set train.batch=VALUE)"), std::string::npos) << e;
  e = error_of([] { config_parse("", "s.yaml", {"optimizer.lr_mult.fc=5"}); });
  EXPECT_NE(e.find("e.g. --set 'optimizer.lr_mult={fc: 5}'"), std::string::npos) << e;
}

TEST(trainer_config, UnknownKeysGetTheNearestKnownOne) {
  auto e = error_of([] { config_parse("", "s.yaml", {"TRAIN.batch=4"}); });
  EXPECT_NE(e.find("unknown key 'TRAIN.batch' (did you mean 'train.batch'? top level takes: model, data"),
            std::string::npos) << e;
  e = error_of([] { config_parse("", "s.yaml", {"train..batch=4"}); });
  EXPECT_NE(e.find("unknown key 'train..batch' (did you mean 'train.batch'? train takes: epochs"), std::string::npos) << e;
  // A dotted key in a file: the list is its section's, not the top level's.
  e = error_of([] { config_parse("train.bacth: 3\n", "d.yaml"); });
  EXPECT_NE(e.find("d.yaml:1: unknown key 'train.bacth' (did you mean 'train.batch'? train takes:"), std::string::npos)
      << e;
  e = error_of([] { config_parse("trian: {batch: 3}\n", "d.yaml"); });
  EXPECT_NE(e.find("unknown key 'trian' (did you mean 'train'? top level takes:"), std::string::npos) << e;
  // Nothing near: no guess.
  e = error_of([] { config_parse("colour: blue\n", "d.yaml"); });
  EXPECT_EQ(e.find("did you mean"), std::string::npos) << e;
}

TEST(trainer_config, DottedKeysMeetTheirNestedTwins) {
  Config c = config_parse("train.batch: 3\nmodel: {classes: 5}\n", "d.yaml");
  EXPECT_EQ(c.train.batch, 3);
  auto e = error_of([] { config_parse("train: {batch: 8}\ntrain.batch: 3\n", "d.yaml"); });
  EXPECT_NE(e.find("d.yaml:2: key 'train.batch' given twice (first at d.yaml:1)"), std::string::npos) << e;
  e = error_of([] { config_parse("train.batch: 3\ntrain:\n  batch: 8\n", "d.yaml"); });
  EXPECT_NE(e.find("d.yaml:3: key 'train.batch' given twice (first at d.yaml:1)"), std::string::npos) << e;
  // A section in parts, dotted and nested, is one section; its values each once.
  c = config_parse("data.generate: {classes: 5}\ndata: {generate: {size: 12}, synthetic: true}\n", "d.yaml");
  EXPECT_EQ(c.generate.classes, 5);
  EXPECT_EQ(c.generate.size, 12);
  e = error_of([] { config_parse("data.generate: {size: 5}\ndata: {generate: {size: 12}}\n", "d.yaml"); });
  EXPECT_NE(e.find("d.yaml:2: key 'data.generate.size' given twice (first at d.yaml:1)"), std::string::npos) << e;
  e = error_of([] { config_parse("train:\n  <<: {batch: 4}\n", "d.yaml"); });
  EXPECT_NE(e.find("d.yaml:2: YAML merge keys ('<<') are not read here"), std::string::npos) << e;
}

TEST(trainer_config, EmptyFileIsRefused) {
  for (const char* text : {"", "# only a comment\n", "{}\n"}) {
    const std::string path = write_temp("rt_cfg_empty.yaml", text);
    const std::string e = error_of([&] { config_load(path); });
    EXPECT_NE(e.find(path + ": the configuration is empty (no keys)"), std::string::npos) << e;
  }
  // /dev/null: no file, every key from --set (tools/bench_trainer.sh).
  EXPECT_EQ(config_load("/dev/null", {"train.batch=3"}).train.batch, 3);
  // Documents after an empty first one: named as such, not as an empty file.
  const std::string path = write_temp("rt_cfg_docs.yaml", "---\n---\ntrain: {batch: 4}\n");
  const std::string e = error_of([&] { config_load(path); });
  EXPECT_NE(e.find("a second YAML document"), std::string::npos) << e;
}

TEST(trainer_config, PrintedFloatsAreTheirShortestText) {
  Config c = config_parse("data: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}\n", "f.yaml");
  const std::string y = config_to_yaml(c);
  EXPECT_NE(y.find("mean: [0.485, 0.456, 0.406]"), std::string::npos) << y;
  EXPECT_NE(y.find("std: [0.229, 0.224, 0.225]"), std::string::npos) << y;
  const Config back = config_parse(y, "saved");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(back.data.mean[i], c.data.mean[i]);
  auto e = error_of([] { config_parse("", "s.yaml", {"data.mean=[0.5, 0.5]"}); });
  EXPECT_NE(e.find("expects a list of 3 numbers, got a list of 2"), std::string::npos) << e;
}

// "data: {<source>}" before the yaml; a test's own "data: {...}" on line 2 becomes part of it (a
// key may not be given twice), so line numbers stay those of the yaml plus one.
std::string with_data(const std::string& source, const std::string& yaml) {
  const std::string open = "data: {";
  if (yaml.rfind(open, 0) != 0) return "data: {" + source + "}\n" + yaml;
  return "\ndata: {" + source + ", " + yaml.substr(open.size());
}

TEST(trainer_config, ValidationNamesWhereTheValueCameFrom) {
  auto invalid = [](const std::string& yaml, std::vector<std::string> sets = {}) {
    return error_of([&] { config_validate(config_parse(with_data("synthetic: true", yaml), "v.yaml", sets)); });
  };
  auto e = invalid("train:\n  batch: 0\n");
  EXPECT_NE(e.find("v.yaml:3: key 'train.batch' must be in [1, 16777216] (got 0)"), std::string::npos) << e;
  e = invalid("", {"train.batch=0"});
  EXPECT_NE(e.find("--set: key 'train.batch' must be in [1, 16777216] (got 0)"), std::string::npos) << e;
  e = invalid("model: {name: resnet51}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'model.name' must be resnet18"), std::string::npos) << e;
  e = invalid("backend: tpu\n");
  EXPECT_NE(e.find("key 'backend' must be onednn"), std::string::npos) << e;
  e = invalid("comm: {algorithm: tree}\n");
  EXPECT_NE(e.find("key 'comm.algorithm' must be one of ring, hierarchical, mpi"), std::string::npos) << e;
  EXPECT_NE(e.find("(got tree)"), std::string::npos) << e;
  e = invalid("optimizer: {momentum: 0, nesterov: true}\n");
  EXPECT_NE(e.find("optimizer: sgd: nesterov requires momentum > 0"), std::string::npos) << e;
  e = invalid("schedule: {kind: multistep, milestones: [60, 30]}\n");
  EXPECT_NE(e.find("v.yaml:2: schedule: milestones must be strictly increasing"), std::string::npos) << e;
  e = invalid("checkpoint: {keep: 0}\n");
  EXPECT_NE(e.find("key 'checkpoint.keep' must be >= 1"), std::string::npos) << e;
  e = invalid("", {"train.accumulate=0"});
  EXPECT_NE(e.find("--set: key 'train.accumulate' must be >= 1 (got 0)"), std::string::npos) << e;
  e = invalid("train: {accumulate: 2}\nemulate: {compute_ms: 5}\n");
  EXPECT_NE(e.find("key 'train.accumulate' must be 1 when emulate.compute_ms is set (got 2)"), std::string::npos) << e;
  e = invalid("", {"train.mixup=-0.2"});
  EXPECT_NE(e.find("--set: key 'train.mixup' must be >= 0 (0: off) (got -0.2)"), std::string::npos) << e;
  e = invalid("train: {cutmix: -1}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'train.cutmix' must be >= 0 (0: off) (got -1)"), std::string::npos) << e;
  EXPECT_EQ(invalid("train: {mixup: 0.2, cutmix: 1}\n"), "");
  EXPECT_EQ(config_parse("", "d.yaml").train.mixup, 0.0);  // off unless asked for
  EXPECT_EQ(config_parse("", "d.yaml").train.cutmix, 0.0);
  e = invalid("train: {ema: 1}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'train.ema' must be in [0, 1) (0: off; e.g. 0.9999) (got 1)"), std::string::npos) << e;
  EXPECT_NE(invalid("", {"train.ema=-0.5"}).find("key 'train.ema' must be in [0, 1)"), std::string::npos);
  EXPECT_EQ(invalid("train: {ema: 0.9999, ema_warmup: false}\n"), "");
  EXPECT_EQ(config_parse("", "d.yaml").train.ema, 0.0);
  EXPECT_TRUE(config_parse("", "d.yaml").train.ema_warmup);
  EXPECT_EQ(config_parse("", "d.yaml").train.ema_every, 1);
  // AdamW and LAMB.
  EXPECT_EQ(invalid("optimizer: {kind: lamb, lr: 0.005, beta1: 0.9, beta2: 0.999, eps: 1.0e-6, weight_decay: 0.02}\n"), "");
  e = invalid("optimizer: {kind: adam}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'optimizer.kind': 'adam' is not sgd, adamw or lamb"), std::string::npos) << e;
  e = invalid("optimizer:\n  kind: adamw\n  beta2: 1\n");
  EXPECT_NE(e.find("v.yaml:4: optimizer: adamw: beta2 must be in [0, 1), got 1"), std::string::npos) << e;
  e = invalid("", {"optimizer.kind=lamb", "optimizer.lars=true"});
  EXPECT_NE(e.find("optimizer: lamb: lars is SGD's layer-wise scaling"), std::string::npos) << e;
  EXPECT_EQ(config_parse("", "d.yaml").optimizer.sgd.kind, OptimizerKind::sgd);
  // RandAugment's magnitude noise.
  EXPECT_EQ(config_parse("data: {randaugment_magnitude_std: 1.5}\n", "r.yaml").data.auto_augment.magnitude_std, 1.5);
  e = invalid("data: {randaugment_magnitude_std: -1}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'data.randaugment_magnitude_std' must be in [0, 31] bins"), std::string::npos) << e;
  // Frozen statistics need frozen layers.
  e = invalid("optimizer: {freeze_bn_stats: true}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'optimizer.freeze_bn_stats' needs frozen layers (optimizer.freeze) (got true)"), std::string::npos)
      << e;
  EXPECT_EQ(invalid("optimizer: {freeze: [conv1, bn1], freeze_bn_stats: true}\n"), "");
  // Stochastic depth.
  EXPECT_EQ(config_resnet(config_parse("model: {drop_path: 0.05}\n", "s.yaml")).drop_path, 0.05);
  EXPECT_EQ(config_parse("", "d.yaml").model.drop_path, 0.0);
  e = invalid("model: {drop_path: 1}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'model.drop_path' must be in [0, 1) (0: off; e.g. 0.05) (got 1)"), std::string::npos)
      << e;
  // Synchronised batch norm: a group size (0: all ranks), on every backend.
  EXPECT_EQ(config_parse("", "d.yaml").model.bn_group, 1);
  EXPECT_EQ(config_parse("model: {bn_group: 4}\n", "g.yaml").model.bn_group, 4);
  EXPECT_EQ(invalid("model: {bn_group: 0}\n"), "");
  e = invalid("model: {bn_group: -2}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'model.bn_group' must be 0 (all ranks), 1 (each rank its own batch) or a group size"),
            std::string::npos) << e;
  for (const char* backend : {"cuda", "cuda-tf32", "cuda-bf16", "cuda-fp16"})
    EXPECT_EQ(invalid(std::string("model: {bn_group: 0}\nbackend: ") + backend + "\n"), "") << backend;
  // The loss: its kind by name, the BCE target threshold only for BCE and below 1.
  const Config bce = config_parse("train: {loss: bce, bce_threshold: 0.2}\n", "b.yaml");
  EXPECT_EQ(bce.train.loss, LossKind::bce);
  EXPECT_EQ(bce.train.bce_threshold, 0.2);
  EXPECT_EQ(config_resnet(bce).loss.kind, LossKind::bce);
  EXPECT_EQ(config_resnet(bce).loss.bce_threshold, 0.2);
  EXPECT_EQ(config_parse(config_to_yaml(bce), "back.yaml").train.loss, LossKind::bce);
  EXPECT_EQ(config_parse("", "d.yaml").train.loss, LossKind::softmax);
  EXPECT_LT(config_parse("", "d.yaml").train.bce_threshold, 0);  // soft targets
  EXPECT_EQ(invalid("train: {loss: cross_entropy}\n"), "");
  e = invalid("train: {loss: focal}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'train.loss': 'focal' is not cross_entropy or bce"), std::string::npos) << e;
  e = invalid("train: {loss: bce, bce_threshold: 1}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'train.bce_threshold' must be below 1"), std::string::npos) << e;
  e = invalid("", {"train.bce_threshold=0.2"});
  EXPECT_NE(e.find("--set: key 'train.bce_threshold' applies only to train.loss: bce (got 0.2)"), std::string::npos) << e;
  // Per-tensor learning-rate factors: a mapping, printed back as one.
  const Config lm = config_parse("optimizer:\n  lr_mult: {fc: 10, layer4.2: 0.5}\n", "m.yaml");
  ASSERT_EQ(lm.optimizer.sgd.lr_mult.size(), 2u);
  EXPECT_EQ(lm.optimizer.sgd.lr_mult[0], (std::pair<std::string, double>{"fc", 10}));
  EXPECT_EQ(lm.optimizer.sgd.lr_mult[1], (std::pair<std::string, double>{"layer4.2", 0.5}));
  EXPECT_EQ(config_parse(config_to_yaml(lm), "back.yaml").optimizer.sgd.lr_mult, lm.optimizer.sgd.lr_mult);
  EXPECT_EQ(config_parse("", "d.yaml", {"optimizer.lr_mult={fc: 3}"}).optimizer.sgd.lr_mult.at(0).second, 3);
  e = invalid("optimizer: {lr_mult: [fc]}\n");
  EXPECT_NE(e.find("key 'optimizer.lr_mult' expects a mapping of tensor names to factors"), std::string::npos) << e;
  e = error_of([] { config_parse("", "d.yaml", {"optimizer.lr_mult={fc:10}"}); });
  EXPECT_NE(e.find("key 'optimizer.lr_mult': 'fc:10' has no factor (YAML needs a space after the colon: {fc: 10})"),
            std::string::npos) << e;
  e = invalid("optimizer: {lr_mult: {fc: -2}}\n");
  EXPECT_NE(e.find("optimizer: lr_mult: 'fc' must name tensors and have a finite factor >= 0, got -2"),
            std::string::npos) << e;
  e = invalid("train: {ema: 0.99, ema_every: 0}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'train.ema_every' must be >= 1 (got 0)"), std::string::npos) << e;
  EXPECT_EQ(invalid("train: {ema: 0.99998, ema_every: 32}\n"), "");
  e = invalid("train: {clip_grad_norm: -1}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'train.clip_grad_norm' must be >= 0 (0: off) (got -1)"), std::string::npos) << e;
  EXPECT_NE(invalid("", {"train.clip_grad_norm=.inf"}).find("key 'train.clip_grad_norm' must be >= 0"),
            std::string::npos);
  EXPECT_EQ(invalid("train: {clip_grad_norm: 1.0}\n"), "");
  EXPECT_EQ(config_parse("", "d.yaml").train.clip_grad_norm, 0.0);  // off unless asked for
  e = invalid("optimizer: {freeze: layer1}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'optimizer.freeze' expects a list of names, got 'layer1'"), std::string::npos) << e;
  EXPECT_EQ(config_parse("optimizer: {freeze: [conv1, layer1.0]}\n", "d.yaml").optimizer.sgd.freeze,
            (std::vector<std::string>{"conv1", "layer1.0"}));
  EXPECT_TRUE(config_parse("", "d.yaml").optimizer.sgd.freeze.empty());
  // Automatic augmentation: decoded images only; RandAugment's ops and magnitude in range.
  auto invalid_root = [](const std::string& yaml, std::vector<std::string> sets = {}) {
    return error_of([&] { config_validate(config_parse(with_data("root: /d", yaml), "r.yaml", sets)); });
  };
  e = invalid("data: {auto_augment: randaugment}\n");
  EXPECT_NE(e.find("key 'data.auto_augment' works on decoded images; data.synthetic has none (got randaugment)"),
            std::string::npos) << e;
  e = invalid_root("", {"data.auto_augment=augmix"});
  EXPECT_NE(e.find("--set data.auto_augment=augmix: key 'data.auto_augment': 'augmix' is not an augmentation policy (none, autoaugment, "
                   "randaugment, trivialaugment, autoaugment_cifar10, autoaugment_svhn)"), std::string::npos) << e;
  e = invalid_root("data: {auto_augment: randaugment, randaugment_ops: 0}\n");
  EXPECT_NE(e.find("r.yaml:2: key 'data.randaugment_ops' must be in [1, 16] (got 0)"), std::string::npos) << e;
  e = invalid_root("", {"data.randaugment_magnitude=31"});
  EXPECT_NE(e.find("--set: key 'data.randaugment_magnitude' must be a bin in [0, 30] (got 31)"), std::string::npos) << e;
  EXPECT_EQ(invalid_root("data: {auto_augment: trivialaugment}\n"), "");
  const Config aa = config_parse("data: {root: /d, auto_augment: randaugment, randaugment_ops: 3, "
                                 "randaugment_magnitude: 15}\n", "d.yaml");
  EXPECT_EQ(aa.data.auto_augment.policy, data::AutoAugment::randaugment);
  EXPECT_EQ(aa.data.auto_augment.ops, 3);
  EXPECT_EQ(aa.data.auto_augment.magnitude, 15);
  EXPECT_EQ(config_parse("", "d.yaml").data.auto_augment.policy, data::AutoAugment::none);
  e = invalid_root("data: {random_erasing: 1.5}\n");
  EXPECT_NE(e.find("r.yaml:2: key 'data.random_erasing' must be a probability in [0, 1] (0: off) (got 1.5)"),
            std::string::npos) << e;
  e = invalid("", {"data.random_erasing=0.25"});
  EXPECT_NE(e.find("key 'data.random_erasing' works on decoded images; data.synthetic has none (got 0.25)"),
            std::string::npos) << e;
  EXPECT_EQ(invalid_root("data: {random_erasing: 0.1}\n"), "");
  EXPECT_EQ(config_parse("", "d.yaml").data.random_erasing, 0.0f);
  // Evaluation's own side and resize, and repeated augmentation.
  EXPECT_EQ(invalid_root("data: {image_size: 176, eval_image_size: 224, eval_resize: 232, repeated_augment: 4}\n"), "");
  e = invalid_root("data: {image_size: 176, eval_image_size: 224, eval_resize: 200}\n");
  EXPECT_NE(e.find("r.yaml:2: key 'data.eval_resize' must be at least the evaluation side, 224"), std::string::npos) << e;
  e = invalid_root("data: {eval_resize: 100}\n");  // the side defaults to image_size, 224
  EXPECT_NE(e.find("key 'data.eval_resize' must be at least the evaluation side, 224"), std::string::npos) << e;
  e = invalid("", {"data.eval_image_size=4"});
  EXPECT_NE(e.find("--set: key 'data.eval_image_size' must be >= 8 (0: data.image_size) (got 4)"), std::string::npos) << e;
  e = invalid("", {"data.repeated_augment=0"});
  EXPECT_NE(e.find("--set: key 'data.repeated_augment' must be >= 1 (1: off; e.g. 4) (got 0)"), std::string::npos) << e;
  EXPECT_EQ(config_parse("", "d.yaml").data.repeated_augment, 1);
  EXPECT_EQ(config_parse("", "d.yaml").data.eval_image_size, 0);
  // The crops' resize taps: training's may draw per crop, evaluation's is one of the two.
  EXPECT_EQ(config_parse("data: {interpolation: random, eval_interpolation: bicubic}\n", "d.yaml").data.interpolation,
            data::Interpolation::random);
  EXPECT_EQ(config_parse("data: {eval_interpolation: bicubic}\n", "d.yaml").data.eval_interpolation,
            data::Interpolation::bicubic);
  EXPECT_EQ(config_parse("", "d.yaml").data.interpolation, data::Interpolation::bilinear);
  e = invalid("data: {eval_interpolation: random}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'data.eval_interpolation' must be bilinear or bicubic (random draws per training "
                   "crop only) (got random)"),
            std::string::npos) << e;
  e = invalid("", {"data.interpolation=nearest"});
  EXPECT_NE(e.find("key 'data.interpolation': 'nearest' is not bilinear, bicubic or random"), std::string::npos) << e;
  // Evaluation's own batch: 0 is training's.
  e = invalid("", {"eval.batch=-1"});
  EXPECT_NE(e.find("--set: key 'eval.batch' must be >= 0 (0: train.batch) (got -1)"), std::string::npos) << e;
  EXPECT_EQ(config_eval_batch(config_parse("train: {batch: 24}\n", "d.yaml")), 24);
  EXPECT_EQ(config_eval_batch(config_parse("train: {batch: 24}\neval: {batch: 100}\n", "d.yaml")), 100);
  e = invalid("checkpoint: {every_minutes: -5}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'checkpoint.every_minutes' must be >= 0 (0: off) (got -5)"), std::string::npos) << e;
  EXPECT_EQ(invalid("checkpoint: {every_minutes: 30}\n"), "");
  e = invalid("train: {target_top1: 101}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'train.target_top1' must be a percentage in [0, 100] (0: off) (got 101)"),
            std::string::npos) << e;
  e = invalid("train: {target_top1: 75.9}\neval: {every_epochs: 0}\n");
  EXPECT_NE(e.find("key 'train.target_top1' needs evaluations during the run (eval.every_epochs > 0 or "
                   "eval.every_steps > 0)"),
            std::string::npos) << e;
  EXPECT_EQ(invalid("train: {target_top1: 75.9}\n"), "");
  EXPECT_EQ(invalid("train: {target_top1: 75.9}\neval: {every_epochs: 0, every_steps: 500}\n"), "");
  e = invalid("eval: {every_steps: -1}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'eval.every_steps' must be >= 0 (got -1)"), std::string::npos) << e;
  e = invalid("checkpoint: {keep_best: true}\neval: {every_epochs: 0, at_end: false}\n");
  EXPECT_NE(e.find("key 'checkpoint.keep_best' needs evaluations to choose by"), std::string::npos) << e;
  EXPECT_EQ(invalid("checkpoint: {keep_best: true}\neval: {every_epochs: 0, every_steps: 9, at_end: false}\n"), "");
  e = invalid("", {"emulate.compute_ms=-1"});
  EXPECT_NE(e.find("--set: key 'emulate.compute_ms' must be >= 0"), std::string::npos) << e;
  e = invalid("emulate: {compute_ms: 5, forward_fraction: 1}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'emulate.forward_fraction' must be in [0, 1)"), std::string::npos) << e;
  e = invalid("cuda: {conv_algos: fastest}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'cuda.conv_algos' must be auto, timed or heuristic (got fastest)"),
            std::string::npos) << e;
  e = invalid("cuda: {conv_algos: timed, deterministic: true}\n");
  EXPECT_NE(e.find("key 'cuda.conv_algos' cannot be timed with cuda.deterministic: true"), std::string::npos) << e;
  e = invalid("", {"cuda.workspace_mib=-1"});
  EXPECT_NE(e.find("--set: key 'cuda.workspace_mib' must be in [0, 1073741824] (MiB) (got -1)"), std::string::npos) << e;
  EXPECT_EQ(invalid("cuda: {conv_algos: heuristic, deterministic: true, workspace_mib: 0}\n"), "");
  e = invalid("cuda: {algo_cache: /tmp}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'cuda.algo_cache' must be a file, not a directory (got /tmp)"),
            std::string::npos) << e;
  EXPECT_EQ(invalid("cuda: {algo_cache: algos.tsv}\n"), "");  // beside where the job runs
  EXPECT_EQ(invalid("cuda: {algo_cache: /no/such/dir/algos.tsv}\n"), "");  // its folder is made
  e = invalid("comm: {compression: int8}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'comm.compression' must be none, bf16 or fp16 (got int8)"),
            std::string::npos) << e;
  e = invalid("comm: {algorithm: mpi, compression: fp16}\n");
  EXPECT_NE(e.find("key 'comm.compression' bf16 and fp16 need comm.algorithm ring, hierarchical, reducer or nccl"),
            std::string::npos) << e;
  EXPECT_EQ(invalid("comm: {algorithm: reducer, compression: fp16}\n"), "");
  EXPECT_EQ(invalid("comm: {algorithm: hierarchical, ranks_per_node: 4, compression: bf16}\n"), "");
  EXPECT_EQ(config_parse("comm: {ranks_per_node: 4}\n", "d.yaml").comm.ranks_per_node, 4);
  EXPECT_EQ(config_parse("", "d.yaml").comm.ring_order, "node");
  e = invalid("comm: {ring_order: zigzag}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'comm.ring_order' must be node or rank (got zigzag)"), std::string::npos) << e;
  e = invalid("comm: {algorithm: hierarchical, ranks_per_node: -2}\n");
  EXPECT_NE(e.find("v.yaml:2: key 'comm.ranks_per_node' must be >= 0"), std::string::npos) << e;
  EXPECT_EQ(config_parse("", "d.yaml").comm.compression, "none");
  EXPECT_EQ(config_parse("", "d.yaml", {"comm.compression=bf16"}).comm.compression, "bf16");
  e = error_of([] { config_validate(config_parse("data: {synthetic: true, root: /x}\n", "v.yaml")); });
  EXPECT_NE(e.find("set exactly one of data.root"), std::string::npos) << e;
  e = error_of([] { config_validate(config_parse("data: {train_list: a.txt}\n", "v.yaml")); });
  EXPECT_NE(e.find("data.train_list' needs its partner data.val_list where the run evaluates"), std::string::npos) << e;
  // A run that never evaluates needs no validation data.
  const auto check = [](const std::string& yaml) { return error_of([&] { config_validate(config_parse(yaml, "v.yaml")); }); };
  EXPECT_EQ(check("data: {train_shards: a.index}\neval: {every_epochs: 0, at_end: false}\n"), "");
  e = check("data: {val_list: v.txt}\neval: {every_epochs: 0, at_end: false}\n");
  EXPECT_NE(e.find("data.val_list' needs its partner (data.train_list and data.val_list go together)"),
            std::string::npos) << e;
}

// The cuda backends normalise 8-bit batches on the device unless data.output says otherwise.
TEST(trainer_config, CudaBackendsDefaultToEightBitBatches) {
  const std::string data = "data: {synthetic: true}\n";
  EXPECT_EQ(config_parse(data, "a.yaml").data.output, data::Output::f32);
  for (const std::string b : {"cuda", "cuda-tf32", "cuda-bf16", "cuda-fp16"}) {
    SCOPED_TRACE(b);
    Config c = config_parse(data + "backend: " + b + "\n", "a.yaml");
    EXPECT_EQ(c.data.output, data::Output::u8);
    EXPECT_EQ(c.origin.at("data.output"), "a.yaml (default for backend " + b + ")");
    EXPECT_EQ(config_parse(data, "a.yaml", {"backend=" + b}).data.output, data::Output::u8);
    EXPECT_EQ(config_parse("data: {synthetic: true, output: float}\nbackend: " + b + "\n", "a.yaml").data.output,
              data::Output::f32);
    EXPECT_EQ(config_parse(data + "backend: " + b + "\n", "a.yaml", {"data.output=float"}).data.output,
              data::Output::f32);
  }
}

TEST(trainer_config, Fp16BackendDefaultsToDynamicLossScaling) {
  const std::string data = "data: {synthetic: true}\n";
  EXPECT_EQ(config_parse(data, "a.yaml").loss_scale.mode, "none");
  EXPECT_EQ(config_parse(data + "backend: cuda-bf16\n", "a.yaml").loss_scale.mode, "none");
  Config c = config_parse(data + "backend: cuda-fp16\n", "a.yaml");
  EXPECT_EQ(c.loss_scale.mode, "dynamic");
  EXPECT_EQ(c.origin.at("loss_scale.mode"), "a.yaml (default for backend cuda-fp16)");
  EXPECT_NO_THROW(config_validate(c));
  // The backend from the command line resolves the same.
  EXPECT_EQ(config_parse(data, "a.yaml", {"backend=cuda-fp16"}).loss_scale.mode, "dynamic");
  // A mode given anywhere wins, none included.
  for (const std::string mode : {"none", "static", "dynamic"}) {
    SCOPED_TRACE(mode);
    EXPECT_EQ(config_parse(data + "backend: cuda-fp16\nloss_scale: {mode: " + mode + "}\n", "a.yaml")
                  .loss_scale.mode,
              mode);
    EXPECT_EQ(config_parse(data + "backend: cuda-fp16\n", "a.yaml", {"loss_scale.mode=" + mode})
                  .loss_scale.mode,
              mode);
  }
  // The printed configuration (what checkpoints keep) holds the resolved mode.
  const Config back = config_parse(config_to_yaml(c), "printed", {"backend=cuda-bf16"});
  EXPECT_EQ(back.loss_scale.mode, "dynamic");
  // A GPU backend, as comm.algorithm nccl needs.
  EXPECT_NO_THROW(config_validate(config_parse(data + "backend: cuda-fp16\ncomm: {algorithm: nccl}\n", "a.yaml")));
  const std::string e = error_of([&] { config_validate(config_parse(data + "comm: {algorithm: nccl}\n", "a.yaml")); });
  EXPECT_NE(e.find("nccl needs backend: cuda, cuda-tf32, cuda-bf16 or cuda-fp16"), std::string::npos) << e;
}

TEST(trainer_config, PrintedYamlReadsBackTheSame) {
  Config c = config_parse("data: {synthetic: true}\n", "r.yaml",
                          {"optimizer.lr=0.123456789", "schedule.milestones=[1.5, 2]", "data.root=",
                           "data.std=[0.1, 0.2, 0.3]", "log.jsonl=m-{rank}.jsonl", "seed=18446744073709551615",
                           "emulate.compute_ms=12.5"});
  const std::string y = config_to_yaml(c);
  EXPECT_EQ(config_to_yaml(config_parse(y, "printed")), y);
  Config back = config_parse(y, "printed");
  EXPECT_DOUBLE_EQ(back.optimizer.lr, 0.123456789);
  EXPECT_EQ(back.seed, 18446744073709551615ull);
  EXPECT_EQ(back.log.jsonl, "m-{rank}.jsonl");
  EXPECT_EQ(back.emulate.compute_ms, 12.5);
  EXPECT_DOUBLE_EQ(back.emulate.forward_fraction, 1.0 / 3);
  // Every key is printed: a --set of each printed key is accepted.
  for (const auto& k : config_keys()) EXPECT_NE(y.find(k.substr(k.rfind('.') + 1) + ":"), std::string::npos) << k;
}

TEST(trainer_config, DerivedValues) {
  Config c = config_parse("train: {batch: 32, epochs: 90}\noptimizer: {lr: 0.1}\n", "d.yaml");
  EXPECT_DOUBLE_EQ(config_base_lr(c, 8), 0.1);  // 8 x 32 = 256 images
  EXPECT_DOUBLE_EQ(config_schedule(c, 16).base_lr, 0.2);
  EXPECT_DOUBLE_EQ(config_schedule(c, 16).total_epochs, 90);
  // Accumulated passes count in the global batch: 4 ranks x 32 x 2 = 256 images per step.
  Config acc = config_parse("train: {batch: 32, accumulate: 2}\noptimizer: {lr: 0.1}\nschedule: {final_lr: 0.01}\n",
                            "a.yaml");
  EXPECT_DOUBLE_EQ(config_global_batch(acc, 4), 256);
  EXPECT_DOUBLE_EQ(config_base_lr(acc, 4), 0.1);
  EXPECT_DOUBLE_EQ(config_schedule(acc, 4).final_lr, 0.01);
  // optimizer.lr_scaling: at 1024 images (4 x 256) linear is x4, sqrt x2 (timm's adaptive rule),
  // none x1; schedule.final_lr follows the same rule.
  for (const auto& [rule, factor] : {std::pair<const char*, double>{"linear", 4}, {"sqrt", 2}, {"none", 1}}) {
    Config r = config_parse(str_cat("data: {synthetic: true}\ntrain: {batch: 128}\noptimizer: {lr: 0.001, lr_scaling: ", rule,
                                    "}\nschedule: {final_lr: 0.0001}\n"), "r.yaml");
    config_validate(r);
    EXPECT_DOUBLE_EQ(config_base_lr(r, 8), 0.001 * factor) << rule;
    EXPECT_DOUBLE_EQ(config_schedule(r, 8).final_lr, 0.0001 * factor) << rule;
  }
  EXPECT_NE(error_of([] {
              config_validate(config_parse("data: {synthetic: true, min_ratio: 1.5, max_ratio: 1.2}\n", "q.yaml"));
            })
                .find("q.yaml:1: key 'data.max_ratio' must be >= data.min_ratio (1.5, set in q.yaml:1) (got 1.2)"),
            std::string::npos);
  EXPECT_NE(error_of([] { config_validate(config_parse("data: {synthetic: true}\noptimizer: {lr_scaling: square}\n", "s.yaml")); })
                .find("s.yaml:2: key 'optimizer.lr_scaling' must be linear, sqrt or none (got square)"),
            std::string::npos);
  EXPECT_EQ(config_run_dir(c), "runs/d");
  EXPECT_EQ(config_checkpoint_dir(c), "runs/d/checkpoints");
  // Per-rank files (log.jsonl, log.timeline): one per rank with "{rank}", else rank 0's only.
  EXPECT_EQ(config_rank_file("t.json", 0), "t.json");
  EXPECT_EQ(config_rank_file("t.json", 1), "");
  EXPECT_EQ(config_rank_file("runs/t-{rank}.json", 12), "runs/t-12.json");
  EXPECT_EQ(config_rank_file("runs/{rank}/t-{rank}.json", 3), "runs/3/t-3.json");
}

TEST(trainer_config, ShippedConfigsAreValid) {
  const fs::path dir = fs::path(__FILE__).parent_path().parent_path() / "configs";
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(config_validate(config_load(e.path().string())));
    ++n;
  }
  EXPECT_GE(n, 5);
}

TEST(trainer_cli, Arguments) {
  const char* ok[] = {"trainer", "--config", "c.yaml", "--set", "a.b=1", "--resume", "auto"};
  CliOptions o = cli_parse(7, ok);
  EXPECT_EQ(o.config, "c.yaml");
  EXPECT_EQ(o.sets, (std::vector<std::string>{"a.b=1"}));
  EXPECT_EQ(o.resume, "auto");
  const char* ev[] = {"trainer", "--eval", "--checkpoint", "x.rtck"};
  EXPECT_TRUE(cli_parse(4, ev).eval);
  auto e = error_of([] { const char* a[] = {"trainer", "--config"}; cli_parse(2, a); });
  EXPECT_NE(e.find("--config needs a value"), std::string::npos) << e;
  e = error_of([] { const char* a[] = {"trainer", "--confg", "x"}; cli_parse(3, a); });
  EXPECT_NE(e.find("unknown argument '--confg'"), std::string::npos) << e;
  e = error_of([] { const char* a[] = {"trainer", "--eval"}; cli_parse(2, a); });
  EXPECT_NE(e.find("--eval needs --checkpoint PATH or --weights PATH"), std::string::npos) << e;
  e = error_of([] { const char* a[] = {"trainer"}; cli_parse(1, a); });
  EXPECT_NE(e.find("--config FILE is required"), std::string::npos) << e;
  const char* tune[] = {"trainer", "--config", "c.yaml", "--weights", "w.rtck", "--resume", "auto"};
  EXPECT_EQ(cli_parse(7, tune).weights, "w.rtck");
  e = error_of([] {
    const char* a[] = {"trainer", "--config", "c.yaml", "--weights", "w.rtck", "--resume", "r.rtck"};
    cli_parse(7, a);
  });
  EXPECT_NE(e.find("--weights goes with --resume auto only"), std::string::npos) << e;
  e = error_of([] { const char* a[] = {"trainer", "--eval", "--checkpoint", "x", "--weights", "w"}; cli_parse(6, a); });
  EXPECT_NE(e.find("--eval needs --checkpoint PATH or --weights PATH (one of them)"), std::string::npos) << e;
  const char* ew[] = {"trainer", "--eval", "--weights", "w.rtck"};
  EXPECT_EQ(cli_parse(4, ew).weights, "w.rtck");
}

TEST(trainer_cli, RanksMustAgreeOnTheCommandLinesShape) {
  const auto shape = [](std::vector<const char*> args) {
    args.insert(args.begin(), "trainer");
    return cli_shape(cli_parse(int(args.size()), args.data()));
  };
  const CliShape train = shape({"--config", "a.yaml"}), resume = shape({"--config", "b.yaml", "--resume", "auto"}),
                 eval = shape({"--eval", "--checkpoint", "x.rtck"});
  EXPECT_EQ(cli_disagreement({train, train, train}), "");
  // Paths may differ (rank 0 reads the files): only their kinds are compared.
  EXPECT_EQ(cli_disagreement({resume, shape({"--config", "c.yaml", "--resume", "auto"})}), "");
  EXPECT_EQ(cli_disagreement({shape({"--config", "a", "--resume", "p1"}), shape({"--config", "a", "--resume", "p2"})}), "");
  EXPECT_NE(cli_disagreement({train, train, resume}).find("command line: rank 2 has --resume auto, rank 0 no --resume"),
            std::string::npos);
  EXPECT_NE(cli_disagreement({train, eval}).find("rank 1 has --eval, rank 0 training"), std::string::npos);
  EXPECT_NE(cli_disagreement({train, shape({"--config", "a", "--weights", "w.rtck"})})
                .find("rank 1 has --weights, rank 0 no --weights"),
            std::string::npos);
  EXPECT_NE(cli_disagreement({eval, shape({"--eval", "--weights", "w.rtck"})}).find("rank 1 has --weights, rank 0 no --weights"),
            std::string::npos);
  EXPECT_NE(cli_disagreement({eval, shape({"--eval", "--checkpoint", "x", "--config", "a"})})
                .find("rank 1 has --config, rank 0 no --config"),
            std::string::npos);
}

TEST(trainer_cli, OptionEqualsValueAndFilesGivenOnce) {
  const char* eq[] = {"trainer", "--config=c.yaml", "--set=train.batch=4", "--resume=auto"};
  CliOptions o = cli_parse(4, eq);
  EXPECT_EQ(o.config, "c.yaml");
  EXPECT_EQ(o.sets, (std::vector<std::string>{"train.batch=4"}));
  EXPECT_EQ(o.resume, "auto");
  // A second --config would replace the first without a word: files do not merge.
  auto e = error_of([] { const char* a[] = {"trainer", "--config", "a.yaml", "--config", "b.yaml"}; cli_parse(5, a); });
  EXPECT_NE(e.find("--config given twice ('a.yaml' and 'b.yaml')"), std::string::npos) << e;
  e = error_of([] { const char* a[] = {"trainer", "--eval=yes", "--checkpoint", "x"}; cli_parse(4, a); });
  EXPECT_NE(e.find("--eval takes no value"), std::string::npos) << e;
  e = error_of([] { const char* a[] = {"trainer", "--confg=x.yaml"}; cli_parse(2, a); });
  EXPECT_NE(e.find("unknown argument '--confg=x.yaml'"), std::string::npos) << e;
  // An empty value (an unset variable) is not "none": --resume= would start afresh.
  for (const char* opt : {"--resume=", "--config=", "--weights=", "--checkpoint="}) {
    e = error_of([&] { const char* a[] = {"trainer", "--config", "c.yaml", opt}; cli_parse(4, a); });
    EXPECT_NE(e.find("has an empty value (an unset variable?)"), std::string::npos) << opt << ": " << e;
  }
  e = error_of([] { const char* a[] = {"trainer", "--config", "c.yaml", "--resume", ""}; cli_parse(5, a); });
  EXPECT_NE(e.find("--resume has an empty value"), std::string::npos) << e;
  e = error_of([] { const char* a[] = {"trainer", "--config", "c.yaml", "--resume", "auto", "--resume=x"}; cli_parse(6, a); });
  EXPECT_NE(e.find("--resume given twice ('auto' and 'x')"), std::string::npos) << e;
}

}  // namespace
}  // namespace rt::trainer

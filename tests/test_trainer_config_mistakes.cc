// Mistakes users make in configurations and command lines, each refused with a message that names
// where it was made: a key given twice, a second YAML document, a folder for a file, an option
// without its value, a library's field named by the key that set it, thread counts no machine
// has; and, for a refused checkpoint of another model, the model keys that differ.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/error_of.h"
#include "trainer/cli.h"
#include "trainer/config.h"

namespace rt::trainer {
namespace {

constexpr auto error_of = [](auto&& f) { return rt_test::error_of<ConfigError>(f); };
const std::string kData = "data: {synthetic: true}\n";

TEST(trainer_config_mistakes, KeyGivenTwiceOrSecondDocument) {
  auto e = error_of([] { config_parse("seed: 1\ntrain: {batch: 4}\nseed: 2\n", "d.yaml"); });
  EXPECT_NE(e.find("d.yaml:3: key 'seed' given twice (first at d.yaml:1)"), std::string::npos) << e;
  e = error_of([] { config_parse("train:\n  batch: 4\n  epochs: 2\n  batch: 8\n", "d.yaml"); });
  EXPECT_NE(e.find("d.yaml:4: key 'train.batch' given twice (first at d.yaml:2)"), std::string::npos) << e;
  e = error_of([] { config_parse("train: {batch: 4}\ntrain: {epochs: 2}\n", "d.yaml"); });
  EXPECT_NE(e.find("d.yaml:2: key 'train' given twice"), std::string::npos) << e;
  // Inside a mapping of names (yaml-cpp keeps both entries; the first would apply, the second print).
  e = error_of([] { config_parse("optimizer:\n  lr_mult:\n    fc: 0\n    fc: 5\n", "d.yaml"); });
  EXPECT_NE(e.find("d.yaml:2: key 'optimizer.lr_mult': 'fc' given twice"), std::string::npos) << e;
  e = error_of([] { config_parse(kData, "d.yaml", {"optimizer.lr_mult={fc: 0, layer4: 1, fc: 5}"}); });
  EXPECT_NE(e.find("key 'optimizer.lr_mult': 'fc' given twice"), std::string::npos) << e;
  // A name inside such a mapping, set as if it were a key of its own.
  e = error_of([] { config_parse(kData, "d.yaml", {"optimizer.lr_mult.fc=5"}); });
  EXPECT_NE(e.find("unknown key 'optimizer.lr_mult.fc': 'optimizer.lr_mult' takes its whole value, e.g. --set "
                   "'optimizer.lr_mult={fc: 5}'"), std::string::npos) << e;
  e = error_of([] { config_parse("---\nseed: 1\n---\nseed: 2\n", "m.yaml"); });
  EXPECT_NE(e.find("m.yaml:4: a second YAML document ('---')"), std::string::npos) << e;
  EXPECT_EQ(config_parse("---\nseed: 3\n", "one.yaml").seed, 3u);  // a leading marker is one document
  e = error_of([] { config_load(std::filesystem::temp_directory_path().string()); });
  EXPECT_NE(e.find(": is a folder, not a config file"), std::string::npos) << e;
}

// Synthetic data for a config of 10 classes (a benchmark of it, tools/scaling --synthetic) labels
// 10 classes, not the 1000 that made the model too small for its own data.
TEST(trainer_config_mistakes, SyntheticDataTakesTheModelsClasses) {
  Config c = config_parse("model: {classes: 10}\ndata: {synthetic: true}\n", "s.yaml");
  EXPECT_EQ(c.data.synthetic_classes, 10);
  EXPECT_NO_THROW(config_validate(c));
  c = config_parse("model: {classes: 10}\ndata: {synthetic: true, synthetic_classes: 4}\n", "s.yaml");
  EXPECT_EQ(c.data.synthetic_classes, 4);
  EXPECT_EQ(config_parse(config_to_yaml(c), "back.yaml").data.synthetic_classes, 4);
}

TEST(trainer_config_mistakes, OptionWithoutItsValue) {
  auto e = error_of([] {
    const char* a[] = {"trainer", "--config", "--set", "log.progress=false"};
    cli_parse(4, a);
  });
  EXPECT_NE(e.find("command line: --config needs a value, not the option '--set'"), std::string::npos) << e;
  e = error_of([] {
    const char* a[] = {"trainer", "--config", "c.yaml", "--resume", "--set", "x=1"};
    cli_parse(6, a);
  });
  EXPECT_NE(e.find("--resume needs a value, not the option '--set'"), std::string::npos) << e;
}

// A library validator names its own field; the message points at the key that set it.
TEST(trainer_config_mistakes, LibraryFieldsNamedWhereTheyWereSet) {
  auto invalid = [](const std::string& yaml, std::vector<std::string> sets = {}) {
    return error_of([&] { config_validate(config_parse(kData + yaml, "v.yaml", sets)); });
  };
  auto e = invalid("optimizer: {momentum: 0.9}\n", {"optimizer.weight_decay=-1"});
  EXPECT_NE(e.find("--set: optimizer: sgd: weight_decay must be finite and >= 0"), std::string::npos) << e;
  e = invalid("train: {epochs: 1}\nschedule:\n  kind: cosine\n  warmup_epochs: 5\n");
  EXPECT_NE(e.find("v.yaml:5: key 'schedule.warmup_epochs' exceeds train.epochs, 1 (set in v.yaml:2) (got 5)"),
            std::string::npos) << e;
  e = invalid("schedule: {warmup_start_factor: 2}\n");
  EXPECT_NE(e.find("v.yaml:2: schedule: warmup_start_factor must be in [0, 1], got 2"), std::string::npos) << e;
  e = invalid("optimizer: {lr: 0.1}\nschedule: {kind: cosine, final_lr: 1}\n");
  EXPECT_NE(e.find("v.yaml:3: key 'schedule.final_lr' exceeds optimizer.lr, 0.1 (set in v.yaml:2; both per 256 "
                   "images) (got 1)"), std::string::npos) << e;
  e = error_of([] { config_validate(config_parse("data: {root: /d}\n", "s.yaml", {"data.synthetic=true"})); });
  EXPECT_NE(e.find("(2 set; data.root at s.yaml:1, data.synthetic at --set)"), std::string::npos) << e;
  e = error_of([] { config_validate(config_parse("seed: 1\n", "s.yaml", {"data.root="})); });
  EXPECT_NE(e.find("(0 set; data.root at --set)"), std::string::npos) << e;
}

TEST(trainer_config_mistakes, CountsNoMachineHas) {
  auto e = error_of([] { config_validate(config_parse(kData + "threads: 100000\n", "t.yaml")); });
  EXPECT_NE(e.find("t.yaml:2: key 'threads' must be in [0, 1024]"), std::string::npos) << e;
  e = error_of([] { config_validate(config_parse("data: {synthetic: true, threads: 5000}\n", "t.yaml")); });
  EXPECT_NE(e.find("key 'data.threads' must be in [0, 1024]"), std::string::npos) << e;
  EXPECT_NO_THROW(config_validate(config_parse(kData + "threads: 64\n", "t.yaml")));
  // A stray digit is named as the key it is, not met later as "out of memory, lower train.batch".
  e = error_of([] { config_validate(config_parse(kData, "t.yaml", {"data.queue_depth=1000000000"})); });
  EXPECT_NE(e.find("--set: key 'data.queue_depth' must be in [1, 1024]"), std::string::npos) << e;
  e = error_of([] { config_validate(config_parse(kData, "t.yaml", {"model.classes=4294967306"})); });
  EXPECT_NE(e.find("--set: key 'model.classes' must be in [2, 16777216]"), std::string::npos) << e;
  e = error_of([] { config_validate(config_parse(kData, "t.yaml", {"train.batch=99999999999"})); });
  EXPECT_NE(e.find("--set: key 'train.batch' must be in [1, 16777216]"), std::string::npos) << e;
}

TEST(trainer_config_mistakes, StallWarningAfterTheStop) {
  auto e = error_of([] {
    config_validate(config_parse(kData, "s.yaml", {"comm.stall_warning_s=10", "comm.stall_abort_s=5"}));
  });
  EXPECT_NE(e.find("--set: key 'comm.stall_warning_s' must be below comm.stall_abort_s, 5"), std::string::npos) << e;
  EXPECT_NO_THROW(config_validate(config_parse(kData, "s.yaml", {"comm.stall_warning_s=10", "comm.stall_abort_s=0"})));
}

TEST(trainer_config_mistakes, ModelKeysThatDifferFromACheckpoints) {
  const Config then = config_parse("model: {name: resnet20, classes: 4, width: 0.25}\n", "a.yaml");
  const std::string saved = config_to_yaml(then);
  EXPECT_EQ(config_model_changes(saved, then), "");
  const Config now = config_parse("model: {name: resnet20, classes: 5, width: 0.5}\ntrain: {batch: 9}\n", "b.yaml");
  EXPECT_EQ(config_model_changes(saved, now),
            "model.classes: 4 in the file, 5 here; model.width: 0.25 in the file, 0.5 here");
  EXPECT_EQ(config_model_changes("not: [valid", now), "");
}

TEST(trainer_config_mistakes, KeysWithoutEffectAreNamed) {
  // Set, but read by another backend, optimizer, schedule or model: the start-up names them.
  const auto unread = [](std::vector<std::string> sets) { return inapplicable_keys(config_parse(kData, "d.yaml", sets)); };
  EXPECT_EQ(unread({}), "");
  EXPECT_EQ(unread({"cuda.conv_algos=timed", "cuda.algo_cache=/tmp/a.tsv"}),
            "cuda.conv_algos (read with the cuda backends only); cuda.algo_cache (read with the cuda backends only)");
  EXPECT_EQ(unread({"optimizer.beta1=0.8"}), "optimizer.beta1 (read with optimizer.kind adamw and lamb only)");
  EXPECT_EQ(unread({"optimizer.kind=adamw", "optimizer.beta1=0.8", "optimizer.momentum=0.5"}),
            "optimizer.momentum (read with optimizer.kind sgd only)");
  EXPECT_EQ(unread({"train.ema_every=4", "optimizer.lars_trust=0.01"}),
            "optimizer.lars_trust (read with optimizer.lars: true only); train.ema_every (read with train.ema > 0 only)");
  EXPECT_EQ(unread({"train.ema=0.999", "train.ema_every=4"}), "");
  // LAMB's trust ratio reads the exclusion too.
  EXPECT_EQ(unread({"optimizer.kind=lamb", "optimizer.lars_exclude_bn_and_bias=false"}), "");
  EXPECT_EQ(unread({"optimizer.lars_exclude_bn_and_bias=false"}),
            "optimizer.lars_exclude_bn_and_bias (read with optimizer.lars: true and optimizer.kind lamb only)");
  EXPECT_EQ(unread({"data.randaugment_magnitude=5"}),
            "data.randaugment_magnitude (read with data.auto_augment: randaugment only)");
  EXPECT_EQ(unread({"model.name=resnet50", "model.cifar_shortcut=B"}),
            "model.cifar_shortcut (read with the CIFAR ResNets (resnet20/32/44/56/110) only)");
  EXPECT_EQ(unread({"model.name=resnet20", "model.cifar_shortcut=B"}), "");
  EXPECT_EQ(unread({"schedule.kind=step", "schedule.final_lr=0.05"}),
            "schedule.final_lr (read with schedule.kind cosine and poly only)");
  EXPECT_EQ(unread({"loss_scale.init=1024"}), "loss_scale.init (read with loss_scale.mode static and dynamic only)");
  EXPECT_EQ(unread({"comm.ranks_per_node=3", "comm.device_path=direct"}),
            "comm.ranks_per_node (read with comm.algorithm hierarchical only); comm.device_path (read with the cuda "
            "backends (gradients in GPU memory) only)");
  EXPECT_EQ(unread({"comm.algorithm=hierarchical", "comm.ranks_per_node=2"}), "");
  // A saved configuration writes every key at its default: nothing to say.
  EXPECT_EQ(inapplicable_keys(config_parse(config_to_yaml(config_parse(kData, "d.yaml")), "saved")), "");
  // The cuda backends read cuda.*.
  Config g = config_parse(kData, "d.yaml", {"cuda.conv_algos=timed"});
  g.backend = "cuda-bf16";
  EXPECT_EQ(inapplicable_keys(g), "");
}

TEST(trainer_config_mistakes, ValuesOnAnotherScaleOrKeyAreBlamedOnTheirOwnKey) {
  const auto invalid = [](std::vector<std::string> sets) {
    return error_of([&] { config_validate(config_parse(kData, "d.yaml", sets)); });
  };
  // mmcv-style normalisation on the 0-255 scale.
  auto e = invalid({"data.mean=[123.675, 116.28, 103.53]"});
  EXPECT_NE(e.find("--set: key 'data.mean' must be in [0, 1]: pixels are in [0, 1] when normalised"), std::string::npos)
      << e;
  EXPECT_NE(e.find("divide by 255"), std::string::npos) << e;
  e = invalid({"data.std=[58.395, 57.12, 57.375]"});
  EXPECT_NE(e.find("key 'data.std' must be in (0, 1]"), std::string::npos) << e;
  // The key that is out of range, where it was set, and its own value.
  e = invalid({"data.max_scale=1.5"});
  EXPECT_NE(e.find("--set: key 'data.max_scale' must be in [data.min_scale, 1] (min_scale 0.08, set in d.yaml "
                   "(default)) (got 1.5)"),
            std::string::npos) << e;
  e = invalid({"data.min_scale=0"});
  EXPECT_NE(e.find("key 'data.min_scale' must be in (0, 1] (got 0)"), std::string::npos) << e;
  // Adam's values are checked whichever optimizer runs.
  e = invalid({"optimizer.beta1=5"});
  EXPECT_NE(e.find("beta1 must be in [0, 1), got 5"), std::string::npos) << e;
  EXPECT_NE(e.find("--set"), std::string::npos) << e;
  e = invalid({"optimizer.eps=-1"});
  EXPECT_NE(e.find("eps must be finite and > 0, got -1"), std::string::npos) << e;
}

}  // namespace
}  // namespace rt::trainer

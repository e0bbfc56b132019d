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

TEST(trainer_config_mistakes, CudaKeysOnACpuBackendAreNamed) {
  // A GPU job's options carried over to a CPU run do nothing; the trainer's start-up says so.
  EXPECT_EQ(ignored_cuda_keys(config_parse(kData, "d.yaml")), "");
  EXPECT_EQ(ignored_cuda_keys(config_parse(kData, "d.yaml", {"cuda.conv_algos=timed", "cuda.algo_cache=/tmp/a.tsv"})),
            "cuda.conv_algos, cuda.algo_cache");
  EXPECT_EQ(ignored_cuda_keys(config_parse(kData, "d.yaml", {"cuda.deterministic=true", "cuda.workspace_mib=64"})),
            "cuda.deterministic, cuda.workspace_mib");
  // A saved configuration writes every key at its default: nothing to say.
  const Config c = config_parse(kData, "d.yaml");
  EXPECT_EQ(ignored_cuda_keys(config_parse(config_to_yaml(c), "saved")), "");
  // The cuda backends read them.
  Config g = config_parse(kData, "d.yaml", {"cuda.conv_algos=timed"});
  g.backend = "cuda-bf16";
  EXPECT_EQ(ignored_cuda_keys(g), "");
}

}  // namespace
}  // namespace rt::trainer

// Checkpoint files: round trip, truncation, corruption, wrong model, the newest-valid search
// (a damaged or half-written newest file is passed over), pruning; top-k counting and the
// non-finite count behind the per-step gradient check.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "tests/error_of.h"
#include "trainer/checkpoint.h"
#include "trainer/trainer.h"

namespace rt::trainer {
namespace {

namespace fs = std::filesystem;

struct Fixture {
  CheckpointMeta meta;
  std::string yaml = "model:\n  name: resnet20\n  classes: 10\n";
  std::vector<float> params, state, momentum;
  Fixture() {
    meta.step = 1234;
    meta.epoch = 3;
    meta.position = {3, 17};
    meta.optimizer_steps = 1234;
    meta.world = 4;
    meta.batch = 32;
    meta.accumulate = 3;
    meta.model.param_count = 1001;
    meta.model.grad_elems = 1008;
    meta.model.layout_hash = 0x1234abcd5678ef01ull;
    meta.model.state_elems = 37;
    meta.model.state_hash = 99;
    meta.seed = 5;
    for (size_t i = 0; i < 1008; ++i) params.push_back(float(i) * 0.5f - 3.f);
    for (size_t i = 0; i < 37; ++i) state.push_back(float(i) + 0.25f);
    for (size_t i = 0; i < 1008; ++i) momentum.push_back(-float(i));
  }
  void write(const std::string& path) const { checkpoint_write(path, meta, yaml, params, state, momentum); }
};

std::string temp_dir(const char* name) {
  fs::path d = fs::temp_directory_path() / (std::string(name) + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

constexpr auto error_of = [](auto&& f) { return rt_test::error_of<CheckpointError>(f); };

TEST(trainer_checkpoint, RoundTrip) {
  const std::string dir = temp_dir("rt_ck_rt");
  Fixture f;
  const std::string path = checkpoint_path(dir, f.meta.step);
  EXPECT_EQ(path, dir + "/ckpt-0000001234.rtck");
  f.write(path);
  Checkpoint c = checkpoint_read(path);
  EXPECT_EQ(c.meta.step, 1234);
  EXPECT_EQ(c.meta.position.epoch, 3);
  EXPECT_EQ(c.meta.position.step, 17);
  EXPECT_EQ(c.meta.world, 4);
  EXPECT_EQ(c.meta.accumulate, 3);
  EXPECT_EQ(c.meta.best_top1, 0.0);  // no checkpoint.keep_best record
  EXPECT_EQ(c.meta.best_step, 0);
  EXPECT_EQ(c.meta.model.layout_hash, f.meta.model.layout_hash);
  EXPECT_EQ(c.config_yaml, f.yaml);
  EXPECT_EQ(c.params, f.params);
  EXPECT_EQ(c.state, f.state);
  EXPECT_EQ(c.momentum, f.momentum);
  EXPECT_NO_THROW(checkpoint_check_model(c, path, f.meta.model, "resnet20"));
  // No temporary file is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  // Files from before train.accumulate hold 0 in its word: one pass per step.
  f.meta.accumulate = 0;
  f.write(path);
  EXPECT_EQ(checkpoint_read(path).meta.accumulate, 1);
  EXPECT_TRUE(checkpoint_read(path).rank_state.empty());  // written without the ranks' own sets
  fs::remove_all(dir);
}

// checkpoint_read's parts: sections left out are still read, counted and checksummed, only not
// held; a damaged byte in one is the same checksum error as anywhere else.
// Every field of the meta section comes back as written: a resume continues from all of them (a
// dynamic loss scale's count of good steps lost would make the resumed run grow its scale later
// than the uninterrupted one; an evaluation a stop skipped would never be made).
TEST(trainer_checkpoint, EveryMetaFieldRoundTrips) {
  const std::string dir = temp_dir("rt_ck_meta");
  Fixture f;
  CheckpointMeta& m = f.meta;
  m.epoch = 4;  // each field its own value: a swapped or dropped word shows
  m.optimizer_steps = 1201;
  m.seed = 0xfeedbeefcafe1234ull;
  m.loss_scale = 4096.0;
  m.loss_scale_good = 37;
  m.best_top1 = 61.25;
  m.best_step = 1100;
  m.eval_pending = true;
  m.data_samples = 50000;
  m.data_repeats = 3;
  m.data_order = 0x0123456789abcdefull;
  const std::string path = checkpoint_path(dir, m.step);
  f.write(path);
  const CheckpointMeta c = checkpoint_read(path).meta;
  EXPECT_EQ(c.step, m.step);
  EXPECT_EQ(c.epoch, m.epoch);
  EXPECT_EQ(c.position.epoch, m.position.epoch);
  EXPECT_EQ(c.position.step, m.position.step);
  EXPECT_EQ(c.optimizer_steps, m.optimizer_steps);
  EXPECT_EQ(c.world, m.world);
  EXPECT_EQ(c.batch, m.batch);
  EXPECT_EQ(c.accumulate, m.accumulate);
  EXPECT_EQ(c.model, m.model);
  EXPECT_EQ(c.seed, m.seed);
  EXPECT_EQ(c.loss_scale, m.loss_scale);
  EXPECT_EQ(c.loss_scale_good, m.loss_scale_good);
  EXPECT_EQ(c.best_top1, m.best_top1);
  EXPECT_EQ(c.best_step, m.best_step);
  EXPECT_EQ(c.eval_pending, m.eval_pending);
  EXPECT_EQ(c.data_samples, m.data_samples);
  EXPECT_EQ(c.data_repeats, m.data_repeats);
  EXPECT_EQ(c.data_order, m.data_order);
  fs::remove_all(dir);
}

TEST(trainer_checkpoint, PartsLeftOutAreCheckedButNotHeld) {
  const std::string dir = temp_dir("rt_ck_parts");
  Fixture f;
  const std::string path = checkpoint_path(dir, f.meta.step);
  std::vector<float> ema(f.params.size() + f.state.size(), 0.75f), ranks(4 * f.state.size(), 2.f);
  const std::vector<float> moment2(f.params.size(), 3.f);
  const std::vector<CheckpointTensor> layout = {{false, "w", {1008}, 0, 1008}, {true, "s", {37}, 0, 37}};
  checkpoint_write(path, f.meta, f.yaml, f.params, f.state, f.momentum, ranks, layout, ema, ranks, moment2);
  const Checkpoint all = checkpoint_read(path);
  EXPECT_EQ(all.moment2, moment2);
  EXPECT_EQ(all.ema_rank_state, ranks);
  EXPECT_EQ(all.layout.size(), 2u);
  const Checkpoint none = checkpoint_read(path, CheckpointParts::none());
  EXPECT_EQ(none.meta.step, f.meta.step);
  EXPECT_EQ(none.config_yaml, f.yaml);
  EXPECT_FALSE(none.weights_only) << "momentum was there, though not held";
  for (const auto* v : {&none.params, &none.state, &none.momentum, &none.moment2, &none.rank_state, &none.ema,
                        &none.ema_rank_state})
    EXPECT_TRUE(v->empty());
  EXPECT_TRUE(none.layout.empty());
  const Checkpoint eval = checkpoint_read(path, {.weights = true, .optimizer = false, .rank_state = false, .ema = true});
  EXPECT_EQ(eval.params, f.params);
  EXPECT_EQ(eval.state, f.state);
  EXPECT_EQ(eval.ema, ema);
  EXPECT_EQ(eval.layout.size(), 2u);
  EXPECT_TRUE(eval.momentum.empty() && eval.moment2.empty() && eval.rank_state.empty() && eval.ema_rank_state.empty());
  // Counted though skipped: a short momentum is refused as when it is held.
  checkpoint_write(path, f.meta, f.yaml, f.params, f.state, std::vector<float>(f.params.size() - 2, 1.f));
  EXPECT_NE(error_of([&] { checkpoint_read(path, CheckpointParts::none()); }).find("section sizes disagree"),
            std::string::npos);
  // A byte flipped in the momentum, which none of these keep, and one in a section's length,
  // which makes the section run past the end: both are named as the damage they are.
  f.write(path);
  const auto size = fs::file_size(path);
  for (std::streamoff at : {std::streamoff(size - 8), std::streamoff(32 + 16 + 160 + 8 + 1)}) {
    f.write(path);
    {
      std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(at);
      io.put('\x7f');
    }
    for (const CheckpointParts& keep : {CheckpointParts{}, CheckpointParts::none()}) {
      const auto e = error_of([&] { checkpoint_read(path, keep); });
      EXPECT_EQ(e, path + ": corrupt: checksum mismatch (the file was damaged after it was written)") << at;
    }
  }
  fs::remove_all(dir);
}

// Each rank's own BN statistics ("bn_ranks"): one set per rank that wrote the file, refused by
// name when the count is wrong.
TEST(trainer_checkpoint, RanksOwnStatisticsRoundTripAndAreCounted) {
  const std::string dir = temp_dir("rt_ck_ranks");
  Fixture f;
  const std::string path = checkpoint_path(dir, f.meta.step);
  std::vector<float> ranks;
  for (size_t i = 0; i < 4 * f.state.size(); ++i) ranks.push_back(float(i) * 0.125f);
  checkpoint_write(path, f.meta, f.yaml, f.params, f.state, f.momentum, ranks);
  Checkpoint c = checkpoint_read(path);
  EXPECT_EQ(c.rank_state, ranks);
  EXPECT_EQ(c.state, f.state);
  EXPECT_EQ(c.momentum, f.momentum);
  ranks.resize(3 * f.state.size());  // 3 sets from a run of 4 ranks
  checkpoint_write(path, f.meta, f.yaml, f.params, f.state, f.momentum, ranks);
  EXPECT_EQ(error_of([&] { checkpoint_read(path); }),
            path + ": corrupt: section 'bn_ranks' holds 111 values, not 4 rank(s) x 37");
  fs::remove_all(dir);
}

// The weights' moving average ("ema": parameters then statistics; "ema_bnr": each rank's
// statistics): read back as written, absent unless written, refused by name when miscounted.
TEST(trainer_checkpoint, MovingAverageRoundTripsAndIsCounted) {
  const std::string dir = temp_dir("rt_ck_ema");
  Fixture f;
  const std::string path = checkpoint_path(dir, f.meta.step);
  std::vector<float> ema, ranks(4 * f.state.size());
  for (size_t i = 0; i < f.params.size() + f.state.size(); ++i) ema.push_back(float(i) * 0.25f + 1);
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = -float(i);
  checkpoint_write(path, f.meta, f.yaml, f.params, f.state, f.momentum, {}, {}, ema, ranks);
  Checkpoint c = checkpoint_read(path);
  EXPECT_EQ(c.ema, ema);
  EXPECT_EQ(c.ema_rank_state, ranks);
  EXPECT_EQ(c.params, f.params);
  EXPECT_TRUE(c.rank_state.empty());
  f.write(path);
  EXPECT_TRUE(checkpoint_read(path).ema.empty());
  EXPECT_TRUE(checkpoint_read(path).ema_rank_state.empty());
  ema.pop_back();
  checkpoint_write(path, f.meta, f.yaml, f.params, f.state, f.momentum, {}, {}, ema);
  EXPECT_EQ(error_of([&] { checkpoint_read(path); }),
            path + ": corrupt: section 'ema' holds 1044 values, not 1008 + 37 (parameters and BN statistics)");
  ema.push_back(0);
  ranks.pop_back();
  checkpoint_write(path, f.meta, f.yaml, f.params, f.state, f.momentum, {}, {}, ema, ranks);
  EXPECT_EQ(error_of([&] { checkpoint_read(path); }),
            path + ": corrupt: section 'ema_bnr' holds 147 values, not 4 rank(s) x 37");
  checkpoint_write(path, f.meta, f.yaml, f.params, f.state, f.momentum, {}, {}, {}, std::vector<float>(4 * 37));
  EXPECT_EQ(error_of([&] { checkpoint_read(path); }), path + ": corrupt: section 'ema_bnr' without 'ema'");
  fs::remove_all(dir);
}

// The moving average's decay: TensorFlow's warm-up min(decay, (1 + n) / (10 + n)), or the decay.
TEST(trainer_checkpoint, MovingAverageDecay) {
  EXPECT_DOUBLE_EQ(ema_decay(0.9999, true, 0), 0.1);
  EXPECT_DOUBLE_EQ(ema_decay(0.9999, true, 90), 91.0 / 100.0);
  EXPECT_DOUBLE_EQ(ema_decay(0.99, true, 890), 0.99);  // 891/900 = 0.99 exactly: the cap meets
  EXPECT_DOUBLE_EQ(ema_decay(0.99, true, 100000), 0.99);
  EXPECT_DOUBLE_EQ(ema_decay(0.9999, false, 0), 0.9999);
}

// The "layout" section: read back as written; a malformed line is refused naming file and line.
TEST(trainer_checkpoint, LayoutRoundTripsAndBadLinesAreNamed) {
  const std::string dir = temp_dir("rt_ck_layout");
  Fixture f;
  const std::string path = checkpoint_path(dir, f.meta.step);
  const std::vector<CheckpointTensor> layout = {
      {false, "fc.weight", {10, 100}, 0, 1000}, {false, "fc.bias", {1}, 1000, 1}, {true, "bn1.running_mean", {37}, 0, 37}};
  checkpoint_write(path, f.meta, f.yaml, f.params, f.state, f.momentum, {}, layout);
  const Checkpoint c = checkpoint_read(path);
  ASSERT_EQ(c.layout.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(c.layout[i].state, layout[i].state);
    EXPECT_EQ(c.layout[i].name, layout[i].name);
    EXPECT_EQ(c.layout[i].dims, layout[i].dims);
    EXPECT_EQ(c.layout[i].offset, layout[i].offset);
    EXPECT_EQ(c.layout[i].count, layout[i].count);
  }
  auto parse = [&](const std::string& text) {
    return error_of([&] { checkpoint_layout_parse(text, 1008, 37, "f"); });
  };
  EXPECT_EQ(parse("p\ta\t0\t6\t2,3\n"), "");
  EXPECT_EQ(parse("p\ta\t0\t6\t2,3\nq\tb\t0\t1\t1\n"),
            "f: corrupt: section 'layout' line 2: not 'p|s <tab> name <tab> offset <tab> count <tab> dims'");
  EXPECT_EQ(parse("p\ta\tx\t6\t2,3\n"), "f: corrupt: section 'layout' line 1: offset or count is not a number");
  EXPECT_EQ(parse("p\ta\t0\t6\t2,0\n"), "f: corrupt: section 'layout' line 1: bad dims '2,0'");
  EXPECT_EQ(parse("p\ta\t0\t7\t2,3\n"),
            "f: corrupt: section 'layout' line 1: 'a' does not fit: 7 values of dims 2,3 at 0 in 1008");
  EXPECT_EQ(parse("s\tm\t32\t6\t6\n"),
            "f: corrupt: section 'layout' line 1: 'm' does not fit: 6 values of dims 6 at 32 in 37");
  EXPECT_EQ(parse("p\ta\t0\t6\t2,3\np\ta\t6\t6\t6\n"), "f: corrupt: section 'layout' line 2: 'a' listed twice");
  EXPECT_EQ(parse("p\ta\t18446744073709551615\t6\t2,3\n"),
            "f: corrupt: section 'layout' line 1: 'a' does not fit: 6 values of dims 2,3 at 18446744073709551615 in 1008");
  fs::remove_all(dir);
}

// A weights file (tools/torch_weights.py import): no momentum section, read as weights only;
// a real checkpoint is not, and a momentum section of the wrong length is still corrupt.
TEST(trainer_checkpoint, WeightsFilesHaveNoMomentum) {
  const std::string dir = temp_dir("rt_ck_weights");
  Fixture f;
  const std::string path = dir + "/w.rtck";
  checkpoint_write(path, f.meta, f.yaml, f.params, f.state, {});
  Checkpoint c = checkpoint_read(path);
  EXPECT_TRUE(c.weights_only);
  EXPECT_TRUE(c.momentum.empty());
  EXPECT_EQ(c.params, f.params);
  EXPECT_EQ(c.state, f.state);
  f.write(path);
  c = checkpoint_read(path);
  EXPECT_FALSE(c.weights_only);
  EXPECT_EQ(c.momentum, f.momentum);
  const std::vector<float> short_momentum(f.params.size() - 2, 1.f);
  checkpoint_write(path, f.meta, f.yaml, f.params, f.state, short_momentum);
  const auto e = error_of([&] { checkpoint_read(path); });
  EXPECT_NE(e.find(path + ": corrupt: section sizes disagree"), std::string::npos) << e;
  fs::remove_all(dir);
}

// --weights' copy: tensors of the same name and dims are taken, the others left and named.
TEST(trainer_checkpoint, WeightsAreCopiedByNameAndShape) {
  Arena<float> arena;
  arena.add_param("conv.weight", {2, 3}, ParamKind::conv_weight);
  arena.add_param("fc.weight", {4, 2}, ParamKind::linear_weight);
  arena.add_param("fc.bias", {4}, ParamKind::bias);
  arena.add_state("bn.running_mean", 3, 0.f);
  arena.add_state("bn.running_var", 3, 1.f);
  arena.finalize();
  Checkpoint ck;
  ck.params.resize(100);
  ck.state.resize(6);
  for (size_t i = 0; i < ck.params.size(); ++i) ck.params[i] = float(i + 1);
  for (size_t i = 0; i < ck.state.size(); ++i) ck.state[i] = float(-int(i) - 1);
  ck.layout = {{false, "fc.weight", {5, 2}, 0, 10}, {false, "conv.weight", {2, 3}, 16, 6},
               {true, "bn.running_var", {3}, 3, 3}, {true, "bn.running_mean", {3}, 0, 3}};
  std::vector<float> params(arena.size(), 0.5f), state(arena.state().size(), 0.25f);
  const auto kept = checkpoint_copy_matching(ck, arena, params, state);
  EXPECT_EQ(kept, (std::vector<std::string>{"fc.bias (not in the checkpoint)",
                                            "fc.weight ([4, 2]; the checkpoint's is [5, 2])"}))
      << "in the arena's order (by offset: reverse registration)";
  for (const ParamInfo& p : arena.layout())
    for (size_t i = 0; i < p.count; ++i)
      EXPECT_EQ(params[p.offset + i], p.name == "conv.weight" ? float(17 + i) : 0.5f) << p.name << " " << i;
  for (const StateInfo& s : arena.state_layout())
    for (size_t i = 0; i < s.count; ++i)
      EXPECT_EQ(state[s.offset + i], s.name == "bn.running_mean" ? -float(i + 1) : -float(i + 4)) << s.name;
  // The arena's own listing is what checkpoints write.
  const auto mine = checkpoint_layout(arena);
  ASSERT_EQ(mine.size(), 5u);
  EXPECT_EQ(mine.back().name, "bn.running_var");
  EXPECT_TRUE(mine.back().state);
  EXPECT_EQ(mine.back().dims, std::vector<int64_t>{3});
}

TEST(trainer_checkpoint, TruncatedCorruptAndForeignFilesAreRefusedByName) {
  const std::string dir = temp_dir("rt_ck_bad");
  Fixture f;
  const std::string path = dir + "/ckpt-0000000001.rtck";
  f.write(path);
  const auto size = fs::file_size(path);

  fs::resize_file(path, size - 100);
  auto e = error_of([&] { checkpoint_read(path); });
  EXPECT_NE(e.find(path + ": truncated:"), std::string::npos) << e;
  fs::resize_file(path, 6);
  e = error_of([&] { checkpoint_read(path); });
  EXPECT_NE(e.find(path + ": not a checkpoint: truncated"), std::string::npos) << e;

  f.write(path);
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(std::streamoff(size / 2));
    io.put('\x5a');
  }
  e = error_of([&] { checkpoint_read(path); });
  EXPECT_NE(e.find(path + ": corrupt: checksum mismatch"), std::string::npos) << e;

  std::ofstream(path) << "model:\n  name: resnet50\n";
  e = error_of([&] { checkpoint_read(path); });
  EXPECT_NE(e.find("not a ringtrain checkpoint"), std::string::npos) << e;

  e = error_of([&] { checkpoint_read(dir + "/missing.rtck"); });
  EXPECT_NE(e.find(dir + "/missing.rtck: cannot open"), std::string::npos) << e;

  f.write(path);
  comm::ModelFingerprint other = f.meta.model;
  other.param_count = 2002;
  other.layout_hash = 7;
  e = error_of([&] { checkpoint_check_model(checkpoint_read(path), path, other, "resnet56"); });
  EXPECT_NE(e.find(path + ": written for another model (resnet20, 1001 parameters"), std::string::npos) << e;
  EXPECT_NE(e.find("this run builds resnet56 (2002 parameters"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(trainer_checkpoint, LatestValidSkipsDamagedAndHalfWrittenFiles) {
  const std::string dir = temp_dir("rt_ck_latest");
  EXPECT_EQ(checkpoint_find_latest(dir), "");
  EXPECT_EQ(checkpoint_find_latest(dir + "/absent"), "");
  Fixture f;
  for (int64_t s : {10, 20, 30}) {
    f.meta.step = s;
    f.write(checkpoint_path(dir, s));
  }
  EXPECT_EQ(checkpoint_find_latest(dir), checkpoint_path(dir, 30));
  // A run killed while writing step 40 leaves only its temporary file: not a checkpoint.
  std::ofstream(dir + "/.ckpt-0000000040.rtck.tmp") << "partial";
  // A newest file damaged after it was written is reported and passed over.
  fs::resize_file(checkpoint_path(dir, 30), 64);
  std::vector<std::string> skipped;
  EXPECT_EQ(checkpoint_find_latest(dir, &skipped), checkpoint_path(dir, 20));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("ckpt-0000000030.rtck"), std::string::npos);
  // --resume auto keeps the one found, read with the parts asked for, instead of reading it again.
  Checkpoint found;
  CheckpointParts keep;
  keep.optimizer = false;
  EXPECT_EQ(checkpoint_find_latest(dir, nullptr, &found, keep), checkpoint_path(dir, 20));
  EXPECT_EQ(found.meta.step, 20);
  EXPECT_EQ(found.params, f.params);
  EXPECT_EQ(found.state, f.state);
  EXPECT_TRUE(found.momentum.empty());
  EXPECT_EQ(found.config_yaml, f.yaml);

  checkpoint_prune(dir, 2);
  EXPECT_EQ(checkpoint_list(dir), (std::vector<std::string>{checkpoint_path(dir, 30), checkpoint_path(dir, 20)}));
  EXPECT_FALSE(fs::exists(dir + "/.ckpt-0000000040.rtck.tmp"));
  fs::remove_all(dir);
}

// checkpoint.keep_best: the record travels in meta; best.rtck is the chosen checkpoint's bytes
// (a hard link here), replaced by the next best, kept through pruning, never taken for the newest
// checkpoint; no temporary file stays.
TEST(trainer_checkpoint, BestCheckpointIsKeptApart) {
  const std::string dir = temp_dir("rt_ck_best");
  Fixture f;
  auto bytes = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string best = checkpoint_best_path(dir);
  EXPECT_EQ(best, dir + "/best.rtck");
  for (int64_t s : {10, 20, 30}) {
    f.meta.step = s;
    f.meta.best_top1 = 61.25 + double(s);
    f.meta.best_step = s;
    f.params[0] = float(s);
    f.write(checkpoint_path(dir, s));
    if (s != 30) checkpoint_keep_best(checkpoint_path(dir, s));  // 30 did not improve on 20
  }
  const Checkpoint c = checkpoint_read(best);
  EXPECT_EQ(c.meta.step, 20);
  EXPECT_EQ(c.meta.best_top1, 81.25);
  EXPECT_EQ(c.meta.best_step, 20);
  EXPECT_EQ(bytes(best), bytes(checkpoint_path(dir, 20)));
  EXPECT_EQ(fs::hard_link_count(best), 2u);  // one file, two names
  checkpoint_prune(dir, 1);
  EXPECT_EQ(checkpoint_list(dir), (std::vector<std::string>{checkpoint_path(dir, 30)}));
  EXPECT_EQ(checkpoint_read(best).params[0], 20.0f);  // outlives its ckpt- name
  EXPECT_EQ(checkpoint_find_latest(dir), checkpoint_path(dir, 30));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);  // no .best.rtck.tmp
  EXPECT_NE(error_of([&] { checkpoint_keep_best(dir + "/ckpt-0000000099.rtck"); }).find(best + ": cannot make it"),
            std::string::npos);
  EXPECT_EQ(checkpoint_read(best).meta.step, 20);  // a failure leaves the old best
  fs::remove_all(dir);
}

TEST(trainer_checkpoint, HashIsFnv1aOverWords) {
  const uint64_t w[2] = {1, 2};
  uint64_t h = 0xcbf29ce484222325ull;
  h = (h ^ 1) * 0x100000001b3ull;
  h = (h ^ 2) * 0x100000001b3ull;
  EXPECT_EQ(checkpoint_hash(w, 16), h);
}

TEST(trainer_numerics, CountNonfiniteSeesNanAndInfOnly) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v = {0.0f, -0.0f, 1e-45f, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          3.5f, std::numeric_limits<float>::min()};
  EXPECT_EQ(count_nonfinite(v.data(), v.size()), 0u);
  v.insert(v.end(), {inf, -inf, nan, -nan});
  EXPECT_EQ(count_nonfinite(v.data(), v.size()), 4u);
  EXPECT_EQ(count_nonfinite(v.data(), 0), 0u);
}

TEST(trainer_eval, CountCorrect) {
  // 3 samples, 6 classes.
  const float logits[] = {0, 5, 1, 2, 3, 4,   // label 1: first
                          9, 8, 7, 6, 5, 4,   // label 5: sixth
                          1, 1, 1, 1, 1, 1};  // label 4 tied: four ties come first -> top-5 only
  const int32_t labels[] = {1, 5, 4};
  int64_t top1 = 0, top5 = 0;
  double loss = 0;
  count_correct(logits, labels, 3, 6, top1, top5, loss);
  EXPECT_EQ(top1, 1);
  EXPECT_EQ(top5, 2);
  EXPECT_NEAR(loss / 3, 0, 10);
  EXPECT_GT(loss, 0);
}

TEST(trainer_eval, NonFiniteLogitsAreNeverCorrect) {
  // NaN compares false with everything, so the label would have nothing ranked above it.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float logits[] = {nan, nan, nan, nan,  // all NaN
                          0, 3, nan, 1,        // the label's logit is the largest finite one
                          0, inf, 1, 2};       // +inf on the label
  const int32_t labels[] = {2, 1, 1};
  int64_t top1 = 0, top5 = 0;
  double loss = 0;
  count_correct(logits, labels, 3, 4, top1, top5, loss);
  EXPECT_EQ(top1, 0);
  EXPECT_EQ(top5, 0);
  EXPECT_FALSE(std::isfinite(loss));
}

}  // namespace
}  // namespace rt::trainer

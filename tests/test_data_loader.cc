// The loader on real files: thread-count independence, resume, shards equal to the folder,
// exactly-once evaluation across ranks, the skipped-image policy, errors from decode threads,
// clean shutdown mid-epoch and batches in a given HostMemory.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "data/dataset.h"
#include "data/image.h"
#include "data/loader.h"
#include "data/shard.h"
#include "tests/counting_memory.h"
#include "tests/data_u8_check.h"
#include "tests/error_of.h"
#include "nn/error.h"

namespace fs = std::filesystem;

namespace rt::data {
namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("rt_data_loader_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// root/{train,val}/c<k>/<i>.jpg: noisy images of varied sizes (so crops and flips are visible).
void make_folder(const fs::path& root, int classes, int train_per_class, int val_per_class) {
  cv::RNG rng(1234);
  for (const char* split : {"train", "val"})
    for (int c = 0; c < classes; ++c)
      for (int i = 0; i < (std::string(split) == "train" ? train_per_class : val_per_class); ++i) {
        const fs::path dir = root / split / ("c" + std::to_string(c));
        fs::create_directories(dir);
        cv::Mat m(24 + (i * 7) % 30, 30 + (i * 5) % 40, CV_8UC3);
        rng.fill(m, cv::RNG::UNIFORM, 0, 256);
        cv::imwrite((dir / (std::to_string(i) + ".jpg")).string(), m);
      }
}

DataConfig folder_config(const fs::path& root, int threads) {
  DataConfig cfg;
  cfg.root = root.string();
  cfg.image_size = 16;
  cfg.threads = threads;
  cfg.queue_depth = 2;
  cfg.seed = 5;
  return cfg;
}

std::vector<Batch> run_epoch(Loader& l, Position from) {
  l.start_epoch(from);
  std::vector<Batch> out;
  Batch b;
  while (l.next(b)) {
    EXPECT_GE(l.last_wait_s(), 0.0);
    out.push_back(b);
  }
  return out;
}

void expect_same(const std::vector<Batch>& a, const std::vector<Batch>& b, size_t offset = 0) {
  ASSERT_EQ(a.size(), b.size() + offset);
  for (size_t s = 0; s < b.size(); ++s) {
    EXPECT_EQ(a[s + offset].n, b[s].n);
    EXPECT_EQ(a[s + offset].indices, b[s].indices) << "step " << s + offset;
    EXPECT_EQ(a[s + offset].labels, b[s].labels);
    EXPECT_TRUE(a[s + offset].images == b[s].images) << "step " << s + offset;
  }
}

class data_loader : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    make_folder(dir_->path / "ds", 3, 14, 5);
  }
  static void TearDownTestSuite() { delete dir_; }
  static fs::path root() { return dir_->path / "ds"; }
  static TempDir* dir_;
};
TempDir* data_loader::dir_ = nullptr;

TEST_F(data_loader, SameBatchesForAnyThreadCountAndExactResume) {
  auto one = make_loader(folder_config(root(), 1), Split::train, 1, 2, 4);
  auto three = make_loader(folder_config(root(), 3), Split::train, 1, 2, 4);
  EXPECT_EQ(one->steps_per_epoch(), 42 / 8);
  const auto a = run_epoch(*one, {1, 0});
  expect_same(a, run_epoch(*three, {1, 0}));
  expect_same(a, run_epoch(*three, {1, 3}), 3);  // resumed: the rest of the epoch, unchanged
  const auto ds = open_folder(root().string(), Split::train);
  for (const Batch& b : a) {
    EXPECT_EQ(b.n, 4);
    for (int j = 0; j < b.n; ++j) EXPECT_EQ(b.labels[j], ds->label(b.indices[j]));
  }
  const auto other_epoch = run_epoch(*one, {2, 0});
  EXPECT_NE(other_epoch[0].indices, a[0].indices);
  DataConfig seeded = folder_config(root(), 2);
  seeded.seed = 6;
  EXPECT_NE(run_epoch(*make_loader(seeded, Split::train, 1, 2, 4), {1, 0})[0].indices, a[0].indices);
}

// data.auto_augment reaches the training crops (and only them), as a function of (seed, epoch,
// sample) like the rest: any thread count, a resume, and the 8-bit output all agree.
// data.min_ratio / max_ratio reach the training crops: at a ratio of 100 no box of the random
// draws fits, and the fallback, a centred strip one source row high, makes every output row of a
// training image the same (up to the resize's fixed-point rounding, a level or two of 255); the
// default ratio range does not.
TEST_F(data_loader, CropRatioRangeReachesTheTrainingCrops) {
  for (const double ratio : {100.0, 0.0}) {
    DataConfig cfg = folder_config(root(), 1);
    cfg.flip = false;
    if (ratio > 0) cfg.min_ratio = cfg.max_ratio = ratio;
    auto l = make_loader(cfg, Split::train, 0, 1, 2);
    const std::vector<Batch> e = run_epoch(*l, {0, 0});
    ASSERT_FALSE(e.empty());
    const Batch& b = e.front();
    const int s = cfg.image_size;
    bool rows_alike = true;  // image 0, every channel plane (NCHW)
    for (int c = 0; c < 3; ++c)
      for (int y = 1; y < s; ++y)
        for (int x = 0; x < s; ++x)
          rows_alike = rows_alike &&
                       std::abs(b.images[size_t((c * s + y) * s + x)] - b.images[size_t(c * s * s + x)]) < 0.05f;
    EXPECT_EQ(rows_alike, ratio > 0) << "ratio " << ratio;
  }
}

// data.interpolation reaches the training crops and data.eval_interpolation the evaluation's,
// each only its own split: the same samples, other pixels. random gives each training crop one
// of the two, the same box and flip (its draw comes last), and both kinds over an epoch.
TEST_F(data_loader, InterpolationReachesItsSplitOnly) {
  DataConfig cubic = folder_config(root(), 1), eval_cubic = cubic, random = cubic;
  cubic.interpolation = Interpolation::bicubic;
  eval_cubic.eval_interpolation = Interpolation::bicubic;
  random.interpolation = Interpolation::random;
  auto epoch = [&](const DataConfig& cfg, Split split) { return run_epoch(*make_loader(cfg, split, 0, 1, 4), {0, 0}); };
  // Per batch: whether every image differs from the other run's.
  auto all_differ = [](const std::vector<Batch>& a, const std::vector<Batch>& b) {
    EXPECT_EQ(a.size(), b.size());
    bool differ = !a.empty();
    for (size_t s = 0; s < std::min(a.size(), b.size()); ++s) {
      EXPECT_EQ(a[s].indices, b[s].indices);
      differ = differ && !(a[s].images == b[s].images);
    }
    return differ;
  };
  for (const Split split : {Split::train, Split::val}) {
    const bool train = split == Split::train;
    const auto plain = epoch(folder_config(root(), 1), split);
    EXPECT_EQ(all_differ(plain, epoch(cubic, split)), train);
    EXPECT_EQ(all_differ(plain, epoch(eval_cubic, split)), !train);
  }
  const auto lin = epoch(folder_config(root(), 1), Split::train), cub = epoch(cubic, Split::train);
  const auto mix = epoch(random, Split::train);
  ASSERT_EQ(mix.size(), lin.size());
  int from_linear = 0, from_cubic = 0;
  for (size_t s = 0; s < mix.size(); ++s) {
    const size_t per = mix[s].images.size() / size_t(mix[s].n);
    for (int i = 0; i < mix[s].n; ++i) {
      auto same = [&](const Batch& o) {
        return std::equal(mix[s].images.begin() + i * per, mix[s].images.begin() + (i + 1) * per,
                          o.images.begin() + i * per);
      };
      const bool l = same(lin[s]), c = same(cub[s]);
      EXPECT_TRUE(l != c) << "batch " << s << " image " << i << ": bilinear's " << l << ", bicubic's " << c;
      from_linear += l;
      from_cubic += c;
    }
  }
  EXPECT_GT(from_linear, 0);
  EXPECT_GT(from_cubic, 0);
}

TEST_F(data_loader, AutoAugmentChangesTrainingCropsOnlyAndReproduces) {
  DataConfig aug = folder_config(root(), 1), aug3 = folder_config(root(), 3);
  aug.auto_augment.policy = aug3.auto_augment.policy = AutoAugment::randaugment;
  const auto plain = run_epoch(*make_loader(folder_config(root(), 2), Split::train, 0, 1, 6), {1, 0});
  const auto a = run_epoch(*make_loader(aug, Split::train, 0, 1, 6), {1, 0});
  expect_same(a, run_epoch(*make_loader(aug3, Split::train, 0, 1, 6), {1, 0}));
  expect_same(a, run_epoch(*make_loader(aug3, Split::train, 0, 1, 6), {1, 2}), 2);
  ASSERT_EQ(a.size(), plain.size());
  int changed = 0;
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_EQ(a[s].indices, plain[s].indices);  // the same samples in the same order
    changed += !(a[s].images == plain[s].images);
  }
  EXPECT_EQ(changed, static_cast<int>(a.size()));
  test::expect_u8_normalizes_to_floats(aug, Split::train);
  expect_same(run_epoch(*make_loader(aug, Split::val, 0, 1, 5), {0, 0}),
              run_epoch(*make_loader(folder_config(root(), 1), Split::val, 0, 1, 5), {0, 0}));
  aug.auto_augment.magnitude = 40;
  EXPECT_NE(rt_test::error_of([&] { make_loader(aug, Split::train, 0, 1, 6); })
                .find("data: RandAugment's magnitude must be a bin in [0, 30], not 40"),
            std::string::npos);
}

TEST_F(data_loader, ShardsYieldTheSameBatchesAsTheFolder) {
  TempDir t;
  for (Split split : {Split::train, Split::val}) {
    const auto folder = open_folder(root().string(), split);
    const PackStats st = pack_shards(*folder, split == Split::train ? "train" : "val",
                                     (t.path / (split == Split::train ? "train" : "val")).string(), 4000);
    DataConfig from_shards = folder_config(root(), 2);
    (split == Split::train ? from_shards.train_shards : from_shards.val_shards) = st.index_path;
    expect_same(run_epoch(*make_loader(folder_config(root(), 2), split, 0, 1, 5), {0, 0}),
                run_epoch(*make_loader(from_shards, split, 0, 1, 5), {0, 0}));
  }
}

TEST_F(data_loader, EvaluationCoversEverySampleOnceAcrossRanks) {
  for (int world : {1, 2, 3, 5, 7}) {
    std::map<int64_t, int> seen;
    for (int r = 0; r < world; ++r) {
      auto l = make_loader(folder_config(root(), 2), Split::val, r, world, 2);
      const auto e = run_epoch(*l, {0, 0});
      EXPECT_EQ(static_cast<int64_t>(e.size()), l->steps_per_epoch());
      for (const Batch& b : e)
        for (int64_t i : b.indices) ++seen[i];
    }
    ASSERT_EQ(seen.size(), 15u) << "world " << world;
    for (auto [i, count] : seen) EXPECT_EQ(count, 1) << "sample " << i << " world " << world;
  }
}

// data.eval_image_size and data.eval_resize shape the evaluation split only: its images are the
// centre crop of that side from the image resized to that short side, exactly as decoding one
// file by hand with those settings gives; training keeps data.image_size.
TEST_F(data_loader, EvaluationHasItsOwnSideAndResize) {
  DataConfig cfg = folder_config(root(), 2);
  cfg.eval_image_size = 20;
  cfg.eval_resize = 30;
  const auto val = run_epoch(*make_loader(cfg, Split::val, 0, 1, 5), {0, 0});
  const auto train = run_epoch(*make_loader(cfg, Split::train, 0, 1, 5), {0, 0});
  ASSERT_FALSE(val.empty());
  ASSERT_FALSE(train.empty());
  EXPECT_EQ(train[0].images.size(), size_t(5 * 3 * 16 * 16));
  const auto ds = open_folder(root().string(), Split::val);
  AugmentSpec spec = make_augment_spec(20, false, cfg.min_scale, cfg.max_scale, cfg.flip, cfg.mean, cfg.std);
  spec.resize = 30;
  AugmentSpec classic = spec;
  classic.resize = 0;  // 20 * 256 / 224 = 22
  DecodeScratch scratch;
  std::vector<uint8_t> bytes;
  std::vector<float> want(3 * 20 * 20), other(3 * 20 * 20);
  int differ = 0;
  for (const Batch& b : val) {
    ASSERT_EQ(b.images.size(), size_t(b.n) * want.size());
    for (int j = 0; j < b.n; ++j) {
      ASSERT_TRUE(ds->read(b.indices[size_t(j)], bytes));
      Rng rng(1);  // evaluation draws nothing
      ASSERT_TRUE(decode_augment(bytes.data(), bytes.size(), spec, rng, scratch, want.data(), nullptr));
      ASSERT_TRUE(decode_augment(bytes.data(), bytes.size(), classic, rng, scratch, other.data(), nullptr));
      EXPECT_TRUE(std::equal(want.begin(), want.end(), b.images.begin() + ptrdiff_t(j * want.size())))
          << "sample " << b.indices[size_t(j)];
      differ += want != other;
    }
  }
  EXPECT_GT(differ, 0) << "data.eval_resize changed nothing";
  // The evaluation side alone: the default resize of that side, as data.image_size of it gives.
  DataConfig same = folder_config(root(), 2), side = same;
  same.image_size = 20;
  side.eval_image_size = 20;
  expect_same(run_epoch(*make_loader(same, Split::val, 0, 1, 5), {0, 0}),
              run_epoch(*make_loader(side, Split::val, 0, 1, 5), {0, 0}));
}

// data.repeated_augment: a step's copies of a sample lie on different ranks, each augmented its
// own way, with the sample's label; the same batches on any thread count and after a resume.
TEST_F(data_loader, RepeatedAugmentationCopiesDifferInTheirCrops) {
  DataConfig cfg = folder_config(root(), 1);
  cfg.repeated_augment = 2;
  auto r0 = make_loader(cfg, Split::train, 0, 2, 4), r1 = make_loader(cfg, Split::train, 1, 2, 4);
  const auto a = run_epoch(*r0, {1, 0}), b = run_epoch(*r1, {1, 0});
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), size_t(42 / 8));
  const auto ds = open_folder(root().string(), Split::train);
  const size_t per = 3 * 16 * 16;
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_EQ(a[s].indices, b[s].indices) << "step " << s;  // positions 2k, 2k + 1: one sample
    for (int j = 0; j < a[s].n; ++j) {
      EXPECT_EQ(a[s].labels[size_t(j)], ds->label(a[s].indices[size_t(j)]));
      EXPECT_FALSE(std::equal(a[s].images.begin() + ptrdiff_t(j * per), a[s].images.begin() + ptrdiff_t((j + 1) * per),
                              b[s].images.begin() + ptrdiff_t(j * per)))
          << "step " << s << " sample " << a[s].indices[size_t(j)] << ": both copies augmented alike";
    }
  }
  DataConfig threads = cfg;
  threads.threads = 3;
  expect_same(a, run_epoch(*make_loader(threads, Split::train, 0, 2, 4), {1, 0}));
  expect_same(a, run_epoch(*make_loader(threads, Split::train, 0, 2, 4), {1, 2}), 2);  // a resume
  // Off (1): the loader's batches are those of before.
  DataConfig off = folder_config(root(), 1);
  off.repeated_augment = 1;
  expect_same(run_epoch(*make_loader(folder_config(root(), 1), Split::train, 1, 2, 4), {1, 0}),
              run_epoch(*make_loader(off, Split::train, 1, 2, 4), {1, 0}));
}

TEST_F(data_loader, EightBitOutputNormalizesToTheFloatsFromFolderListAndShards) {
  TempDir t;
  // A list file naming the folder's images (labels as the folder numbers them).
  std::ofstream list(t.path / "train.txt");
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 14; ++i)
      list << (root() / "train" / ("c" + std::to_string(c)) / (std::to_string(i) + ".jpg")).string() << " " << c
           << "\n";
  list.close();
  const auto folder = open_folder(root().string(), Split::train);
  const PackStats st = pack_shards(*folder, "train", (t.path / "train").string(), 4000);
  DataConfig from_list = folder_config(root(), 2), from_shards = folder_config(root(), 2);
  from_list.root.clear();
  from_list.train_list = (t.path / "train.txt").string();
  from_shards.train_shards = st.index_path;
  for (const DataConfig& cfg : {folder_config(root(), 2), from_list, from_shards}) {
    SCOPED_TRACE(cfg.train_list.empty() ? cfg.train_shards.empty() ? "folder" : "shards" : "list");
    test::expect_u8_normalizes_to_floats(cfg, Split::train);
  }
  // Evaluation (centre crops), another mean and std, one rank of three.
  DataConfig cfg = folder_config(root(), 3);
  cfg.mean[0] = 0.3f, cfg.std[2] = 0.31f;
  test::expect_u8_normalizes_to_floats(cfg, Split::val, 2, 3, 2, 0);
}

// set_batch_memory: every batch comes out in that memory, equal to heap batches; one lap of
// buffers (the slots', and the caller's heap one once swapped in) is allocated there and then
// reused for every later epoch; all of it is freed there.
TEST_F(data_loader, BatchesLiveInTheMemoryGivenAndAreAllocatedOnce) {
  rt::test::CountingMemory mem;
  for (Output out : {Output::f32, Output::u8}) {
    for (Split split : {Split::train, Split::val}) {
      DataConfig cfg = folder_config(root(), 2);
      cfg.output = out;
      const auto want = run_epoch(*make_loader(cfg, split, 0, 1, 4), {0, 0});
      {
        auto l = make_loader(cfg, split, 0, 1, 4);
        l->set_batch_memory(&mem);
        Batch b;  // the caller's, on the heap until swapped into the loader
        int64_t after_two = 0;
        for (int64_t e = 0; e < 4; ++e) {
          l->start_epoch({e, 0});
          size_t s = 0;
          for (; l->next(b); ++s) {
            const bool f32 = out == Output::f32;
            const void* p = f32 ? static_cast<const void*>(b.images.data()) : b.pixels.data();
            const size_t bytes = f32 ? b.images.size() * sizeof(float) : b.pixels.size();
            EXPECT_TRUE(bytes > 0 && mem.owns(p, bytes)) << "epoch " << e << " step " << s;
            if (e == 0 && s < want.size()) {
              EXPECT_EQ(b.labels, want[s].labels);
              EXPECT_TRUE(b.images == want[s].images && b.pixels == want[s].pixels) << "step " << s;
            }
          }
          if (e == 0) {
            EXPECT_EQ(s, want.size());
          }
          if (e == 1) after_two = mem.allocs();
        }
        EXPECT_EQ(mem.allocs(), after_two) << "allocated in epochs 3 and 4";
      }
      EXPECT_EQ(mem.live(), 0u) << "batch buffers never freed";
    }
  }
  EXPECT_GT(mem.allocs(), 0);
}

// What the loader relies on: the memory travels with the bytes when vectors are swapped or
// moved, and each buffer is freed where it was allocated.
TEST(host_vector, SwapAndMoveCarryTheMemory) {
  rt::test::CountingMemory mem;
  {
    HostVector<float> a{HostAllocator<float>(&mem)}, heap(3, 1.0f);
    a.resize(5, 2.0f);
    std::swap(a, heap);
    EXPECT_EQ(a.get_allocator().memory(), nullptr);
    EXPECT_EQ(heap.get_allocator().memory(), &mem);
    EXPECT_TRUE(mem.owns(heap.data(), 5 * sizeof(float)));
    rehome(a, &mem);
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(a.get_allocator().memory(), &mem);
    HostVector<float> moved = std::move(heap);
    EXPECT_EQ(moved.get_allocator().memory(), &mem);
    EXPECT_EQ(moved, HostVector<float>(5, 2.0f));
  }
  EXPECT_EQ(mem.live(), 0u);
  EXPECT_EQ(mem.allocs(), 1);
}

// Every loader's decode threads start at once; OpenCV's thread setting must survive that (set
// concurrently, it crashed one run in a few thousand starts).
TEST(data_loader_bad, DecodeThreadsStartingTogetherDoNotCrash) {
  for (int round = 0; round < 1000; ++round) {
    std::vector<std::thread> t;
    for (int i = 0; i < 3; ++i) t.emplace_back([] { decode_thread_init(); });
    for (std::thread& x : t) x.join();
  }
}

TEST(data_loader_bad, CorruptImagesAreSkippedNeverShiftingLabels) {
  TempDir t;
  make_folder(t.path, 2, 10, 4);
  std::ofstream(t.path / "train/c0/3.jpg", std::ios::trunc) << "not a jpeg at all";
  std::ofstream(t.path / "val/c1/1.jpg", std::ios::trunc) << "\xff\xd8\xff";
  {  // a truncated JPEG
    std::vector<uint8_t> jpg;
    cv::Mat m(40, 40, CV_8UC3, cv::Scalar(10, 200, 30));
    cv::imencode(".jpg", m, jpg);
    std::ofstream(t.path / "train/c1/5.jpg", std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(jpg.data()), jpg.size() / 2);
  }
  const auto ds = open_folder(t.path.string(), Split::train);
  std::set<int64_t> bad;
  for (int64_t i = 0; i < ds->size(); ++i)
    if (ds->name(i).find("c0/3.jpg") != std::string::npos || ds->name(i).find("c1/5.jpg") != std::string::npos)
      bad.insert(i);
  ASSERT_EQ(bad.size(), 2u);
  auto l = make_loader(folder_config(t.path, 2), Split::train, 0, 1, 4);
  ::testing::internal::CaptureStderr();
  std::vector<Batch> epochs[2] = {run_epoch(*l, {0, 0}), run_epoch(*l, {1, 0})};
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(l->skipped(), 4);  // 20 samples, batch 4, one rank: both bad images used in both epochs
  for (const auto& e : epochs) {
    int replaced = 0;  // per batch, so that a run counts the batches it took
    for (const Batch& b : e) replaced += b.skipped;
    EXPECT_EQ(replaced, 2);
  }
  for (const auto& e : epochs)
    for (const Batch& b : e) {
      EXPECT_EQ(b.n, 4);  // training keeps batches full
      for (int j = 0; j < b.n; ++j) {
        EXPECT_EQ(bad.count(b.indices[j]), 0u);
        EXPECT_EQ(b.labels[j], ds->label(b.indices[j]));  // a substitute brings its own label
      }
    }
  for (const char* f : {"c0/3.jpg", "c1/5.jpg"}) {  // one warning per file, naming it
    const size_t at = err.find(f);
    ASSERT_NE(at, std::string::npos) << err;
    EXPECT_EQ(err.find(f, at + 1), std::string::npos) << err;
  }
  // Evaluation omits the bad image: n shrinks, every other sample still appears once.
  auto v = make_loader(folder_config(t.path, 2), Split::val, 0, 1, 3);
  ::testing::internal::CaptureStderr();
  const auto e = run_epoch(*v, {0, 0});
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("c1/1.jpg"), std::string::npos);
  const auto vds = open_folder(t.path.string(), Split::val);
  int total = 0;
  for (const Batch& b : e) {
    total += b.n;
    ASSERT_EQ(b.labels.size(), size_t(b.n));
    for (int j = 0; j < b.n; ++j) EXPECT_EQ(b.labels[j], vds->label(b.indices[j]));
  }
  EXPECT_EQ(total, 7);
  int left_out = 0;
  for (const Batch& b : e) left_out += b.skipped;
  EXPECT_EQ(left_out, 1);
  // The 8-bit output is substituted and compacted like the floats.
  ::testing::internal::CaptureStderr();
  test::expect_u8_normalizes_to_floats(folder_config(t.path, 2), Split::train, 0, 1, 4, 0);
  test::expect_u8_normalizes_to_floats(folder_config(t.path, 2), Split::val, 0, 1, 3, 0);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(v->skipped(), 1);
}

TEST(data_loader_bad, WorkerErrorsAreRethrownFromNext) {
  TempDir t;
  make_folder(t.path, 1, 4, 1);
  for (int i = 0; i < 4; ++i) std::ofstream(t.path / "train/c0" / (std::to_string(i) + ".jpg"), std::ios::trunc) << "x";
  auto l = make_loader(folder_config(t.path, 2), Split::train, 0, 1, 2);
  l->start_epoch({0, 0});
  Batch b;
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(l->next(b), Error);  // no decodable image to substitute
  ::testing::internal::GetCapturedStderr();
}

TEST(data_loader_bad, ManySkippedFilesAreCountedNotListedAndTheLastReasonGiven) {
  // A folder removed mid-run: a line per file would bury the log. The first ones are named (with
  // the rank), the rest counted; with nothing left to substitute, the error says why.
  TempDir t;
  make_folder(t.path, 1, 30, 1);
  auto l = make_loader(folder_config(t.path, 2), Split::train, 0, 1, 2);
  for (int i = 0; i < 30; ++i) fs::remove(t.path / "train/c0" / (std::to_string(i) + ".jpg"));
  ::testing::internal::CaptureStderr();  // before the decode threads start, and say their first lines
  l->start_epoch({0, 0});
  Batch b;
  const std::string e = rt_test::error_of<Error>([&] { l->next(b); });
  l.reset();  // the other decode thread may still be printing: joined before the output is read
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(e.find("data: rank 0: no image of its share of epoch 0 could be read and decoded (the last one skipped "
                   "cannot be read)"),
            std::string::npos) << e;
  size_t listed = 0;
  for (size_t at = err.find("data: warning: rank 0: skipping "); at != std::string::npos;
       at = err.find("data: warning: rank 0: skipping ", at + 1))
    ++listed;
  EXPECT_EQ(listed, 20u) << err;
  EXPECT_NE(err.find("data: warning: rank 0: 20 files skipped; more are counted, not listed (the next: "),
            std::string::npos) << err;
}

TEST(data_loader_bad, TooFewSamplesAndBadPositions) {
  TempDir t;
  make_folder(t.path, 1, 3, 2);
  // 2 validation samples on 3 ranks: the third rank evaluates none (and adds nothing to the sums).
  for (int r = 0; r < 3; ++r) {
    auto v = make_loader(folder_config(t.path, 1), Split::val, r, 3, 1);
    const auto e = run_epoch(*v, {0, 0});
    int64_t n = 0;
    for (const Batch& b : e) n += b.n;
    EXPECT_EQ(n, r < 2 ? 1 : 0) << "rank " << r;
  }
  EXPECT_THROW(make_loader(folder_config(t.path, 1), Split::train, 0, 4, 1), Error);  // 3 samples, 4 ranks
  EXPECT_THROW(make_loader(folder_config(t.path, 1), Split::train, 0, 2, 2), Error);  // no full batch
  auto l = make_loader(folder_config(t.path, 1), Split::train, 0, 1, 1);
  EXPECT_THROW(l->start_epoch({0, 4}), Error);
}

TEST_F(data_loader, DestroyAndRestartMidEpochDoNotHang) {
  for (int threads : {1, 2, 4}) {
    DataConfig cfg = folder_config(root(), threads);
    cfg.queue_depth = 1;
    auto l = make_loader(cfg, Split::train, 0, 1, 2);
    l->start_epoch({0, 0});
    Batch b;
    ASSERT_TRUE(l->next(b));
    l->start_epoch({0, 5});  // restart while decode threads wait for a free slot
    ASSERT_TRUE(l->next(b));
    EXPECT_EQ(l->position().step, 6);
    l.reset();  // destruction with a full queue and blocked threads
    auto idle = make_loader(cfg, Split::val, 0, 1, 2);  // never started: nothing to join
  }
}

}  // namespace
}  // namespace rt::data

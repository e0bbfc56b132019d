// Dataset formats: folder layout and label mapping, list files, packed shards (round trip equal to
// the folder, sample for sample) and the errors each gives for bad input.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <opencv2/imgcodecs.hpp>

#include "data/dataset.h"
#include "data/shard.h"
#include "nn/error.h"

namespace fs = std::filesystem;

namespace rt::data {
namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("rt_data_formats_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_image(const fs::path& p, int w, int h, int value) {
  fs::create_directories(p.parent_path());
  cv::Mat m(h, w, CV_8UC3, cv::Scalar(value, 255 - value, value / 2));
  const std::string ext = p.extension().string();
  const bool png = ext == ".png" || ext == ".PNG" || ext == ".Png";
  std::vector<uint8_t> buf;
  ASSERT_TRUE(cv::imencode(png ? ".png" : ".jpg", m, buf));
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(buf.data()), buf.size());
}

void write_text(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << s;
}

// Expects fn to throw rt::Error whose message contains `part`.
template <class Fn>
void expect_error(Fn fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// root/train/{cat, ant, bee}, root/val/{bee}: mixed extensions and letter cases.
void make_small_tree(const fs::path& root) {
  write_image(root / "train/cat/2.jpg", 20, 10, 10);
  write_image(root / "train/cat/1.JPEG", 20, 10, 20);
  write_image(root / "train/cat/deeper/0.png", 20, 10, 30);
  write_text(root / "train/cat/notes.txt", "not an image");
  write_image(root / "train/ant/a.Png", 12, 12, 40);
  write_image(root / "train/bee/b.jpeg", 16, 8, 50);
  write_image(root / "val/bee/v.jpg", 16, 8, 60);
}

TEST(data_formats, FolderClassesSortedLabelsAndOrder) {
  TempDir t;
  make_small_tree(t.path);
  const auto ds = open_folder(t.path.string(), Split::train);
  EXPECT_EQ(ds->class_names(), (std::vector<std::string>{"ant", "bee", "cat"}));
  ASSERT_EQ(ds->size(), 5);
  const std::vector<std::string> tail = {"ant/a.Png", "bee/b.jpeg", "cat/1.JPEG", "cat/2.jpg",
                                         "cat/deeper/0.png"};
  const std::vector<int32_t> labels = {0, 1, 2, 2, 2};
  for (int64_t i = 0; i < 5; ++i) {
    const std::string name = ds->name(i);
    EXPECT_EQ(name.substr(name.size() - tail[i].size()), tail[i]);
    EXPECT_EQ(ds->label(i), labels[i]);
    std::vector<uint8_t> bytes;
    EXPECT_TRUE(ds->read(i, bytes));
    EXPECT_GT(bytes.size(), 50u);
  }
  const auto val = open_folder(t.path.string(), Split::val);  // val uses the train class list
  ASSERT_EQ(val->size(), 1);
  EXPECT_EQ(val->label(0), 1);
  EXPECT_EQ(val->num_classes(), 3);
}

TEST(data_formats, FolderErrorsNameThePath) {
  TempDir t;
  expect_error([&] { open_folder((t.path / "missing").string(), Split::train); }, "missing");
  make_small_tree(t.path);
  write_image(t.path / "val/wasp/w.jpg", 8, 8, 1);
  expect_error([&] { open_folder(t.path.string(), Split::val); }, "val/wasp");
  fs::remove_all(t.path / "val");
  fs::create_directories(t.path / "val");
  expect_error([&] { open_folder(t.path.string(), Split::val); }, "no images found");
  fs::create_directories(t.path / "train/dog");
  write_text(t.path / "train/dog/readme.txt", "x");
  expect_error([&] { open_folder(t.path.string(), Split::train); }, "train/dog");
}

TEST(data_formats, ListFileCommentsRelativeAbsoluteAndSpaces) {
  TempDir t;
  write_image(t.path / "imgs/a.jpg", 8, 8, 1);
  write_image(t.path / "imgs/with space.png", 8, 8, 2);
  write_image(t.path / "abs.jpg", 8, 8, 3);
  write_text(t.path / "lists/train.txt",
             "# header comment\n\n../imgs/a.jpg 3\n  ../imgs/with space.png\t0  # trailing\n" +
                 (t.path / "abs.jpg").string() + " 1\n");
  const auto ds = open_list((t.path / "lists/train.txt").string());
  ASSERT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->label(0), 3);
  EXPECT_EQ(ds->label(1), 0);
  EXPECT_EQ(ds->label(2), 1);
  EXPECT_EQ(ds->num_classes(), 4);
  for (int64_t i = 0; i < 3; ++i) {
    std::vector<uint8_t> b;
    EXPECT_TRUE(ds->read(i, b)) << ds->name(i);
  }
  // The class count covers both splits' labels.
  write_text(t.path / "lists/val.txt", "../imgs/a.jpg 9\n");
  DataConfig cfg;
  cfg.train_list = (t.path / "lists/train.txt").string();
  cfg.val_list = (t.path / "lists/val.txt").string();
  EXPECT_EQ(open_dataset(cfg, Split::train)->num_classes(), 10);
  EXPECT_EQ(open_dataset(cfg, Split::val)->num_classes(), 10);
}

TEST(data_formats, ListFileBadLinesNameFileAndLine) {
  TempDir t;
  const fs::path list = t.path / "l.txt";
  write_text(list, "# c\na.jpg 1\nb.jpg\n");
  expect_error([&] { open_list(list.string()); }, list.string() + ":3");
  write_text(list, "a.jpg 1\nb.jpg x2\n");
  expect_error([&] { open_list(list.string()); }, list.string() + ":2");
  write_text(list, "a.jpg -1\n");
  expect_error([&] { open_list(list.string()); }, list.string() + ":1");
  write_text(list, "# nothing\n");
  expect_error([&] { open_list(list.string()); }, "names no images");
  expect_error([&] { open_list((t.path / "none.txt").string()); }, "none.txt");
  expect_error([&] { open_dataset(DataConfig{}, Split::train); }, "no train data");
}

TEST(data_formats, ShardsRoundTripEqualTheFolder) {
  TempDir t;
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 7; ++i)
      write_image(t.path / "ds/train" / ("c" + std::to_string(c)) / (std::to_string(i) + ".jpg"), 30 + i, 20 + c, c * 50 + i);
  const std::string root = (t.path / "ds").string();
  const auto folder = open_folder(root, Split::train);
  const PackStats st = pack_shards(*folder, "train", (t.path / "packed/train").string(), 2000, root);
  EXPECT_GT(st.shards, 2);  // a small limit forces several shards
  EXPECT_EQ(st.samples, 21);
  EXPECT_FALSE(fs::exists(st.index_path + ".tmp"));
  const auto shards = open_shards(st.index_path);
  ASSERT_EQ(shards->size(), folder->size());
  EXPECT_EQ(shards->class_names(), folder->class_names());
  std::vector<uint8_t> a, b;
  for (int64_t i = 0; i < folder->size(); ++i) {
    ASSERT_TRUE(folder->read(i, a));
    ASSERT_TRUE(shards->read(i, b));
    EXPECT_EQ(a, b) << "sample " << i;
    EXPECT_EQ(folder->label(i), shards->label(i));
    const std::string fname = fs::path(folder->name(i)).filename().string();
    EXPECT_NE(shards->name(i).find(fname), std::string::npos) << shards->name(i);
  }
  DataConfig cfg;
  cfg.root = "/nonexistent";
  cfg.train_shards = st.index_path;  // shards take precedence over the root
  EXPECT_EQ(open_dataset(cfg, Split::train)->size(), 21);
  // The set names its split: given for the other one, it is refused (the keys swapped).
  cfg.val_shards = st.index_path;
  expect_error([&] { open_dataset(cfg, Split::val); }, st.index_path + ":2: packs the train split, not val");
  // Packed again into fewer shards: the earlier set's extra shards go.
  EXPECT_EQ(pack_shards(*folder, "train", (t.path / "packed/train").string(), 1 << 20, root).shards, 1);
  EXPECT_FALSE(fs::exists(t.path / "packed/train-00001.shard"));
  EXPECT_EQ(open_shards(st.index_path, "train")->size(), 21);
  // Samples in the same order hash alike in both forms (ranks or a resume may read either), and
  // one file renamed hashes otherwise.
  EXPECT_EQ(open_shards(st.index_path)->order_hash(), folder->order_hash());
  fs::rename(t.path / "ds/train/c1/3.jpg", t.path / "ds/train/c1/9.jpg");
  EXPECT_NE(open_folder(root, Split::train)->order_hash(), folder->order_hash());
  // An index with Windows line ends reads the same; a folder or a shard file given as the index
  // is named for what it is.
  std::ifstream in(st.index_path);
  std::string crlf, line;
  while (std::getline(in, line)) crlf += line + "\r\n";
  write_text(t.path / "packed/crlf.index", crlf);
  const auto windows = open_shards((t.path / "packed/crlf.index").string());
  EXPECT_EQ(windows->class_names(), folder->class_names());
  EXPECT_EQ(windows->size(), 21);
  expect_error([&] { open_shards((t.path / "packed").string()); }, "packed: is a folder, not a shard index");
  expect_error([&] { open_shards((t.path / "packed/train-00000.shard").string()); },
               "train-00000.shard:1: expected \"ringtrain-shards\", got binary data");
}

TEST(data_formats, DamagedShardsGiveErrorsNamingTheFile) {
  TempDir t;
  for (int i = 0; i < 6; ++i) write_image(t.path / "ds/train/a" / (std::to_string(i) + ".png"), 16, 16, i * 30);
  const auto folder = open_folder((t.path / "ds").string(), Split::train);
  const PackStats st = pack_shards(*folder, "train", (t.path / "p").string(), 1 << 20);
  ASSERT_EQ(st.shards, 1);
  const fs::path shard = t.path / "p-00000.shard";
  std::string bytes;
  {
    std::ifstream in(shard, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write_with = [&](size_t at, char v) {
    std::string b = bytes;
    b[at] = v;
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << b;
  };
  write_with(0, 'X');
  expect_error([&] { open_shards(st.index_path); }, shard.string() + ": bad magic");
  write_with(bytes.size() - 3, static_cast<char>(bytes[bytes.size() - 3] ^ 1));  // in the names block
  expect_error([&] { open_shards(st.index_path); }, "index checksum");
  write_with(100, static_cast<char>(bytes[100] ^ 1));  // inside the first record's bytes
  const auto ds = open_shards(st.index_path);
  std::vector<uint8_t> buf;
  expect_error([&] { ds->read(0, buf); }, shard.string() + ": checksum mismatch in record 0");
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  expect_error([&] { open_shards(st.index_path); }, shard.string());
  write_text(t.path / "bad.index", "something else\n");
  expect_error([&] { open_shards((t.path / "bad.index").string()); }, "bad.index:1");
}

// Files a user's folder may hold besides images: a named pipe (reading it must not wait for a
// writer), links that loop or lead nowhere, a list file saved with a byte order mark.
TEST(data_formats, OddFilesNeitherHangNorMultiplySamples) {
  TempDir t;
  make_small_tree(t.path);
  const fs::path fifo = t.path / "pipe.jpg";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::vector<uint8_t> bytes;
  EXPECT_FALSE(read_file(fifo.string(), bytes));  // without O_NONBLOCK this waits forever
  write_text(t.path / "list.txt", "pipe.jpg 0\ntrain/ant/a.Png 1\n");
  const auto listed = open_list((t.path / "list.txt").string());
  EXPECT_FALSE(listed->read(0, bytes));
  EXPECT_TRUE(listed->read(1, bytes));

  // A link to a missing image is listed (the loader then warns and skips it); one to a folder
  // already listed for the class is an error naming the link.
  fs::create_symlink(t.path / "gone.jpg", t.path / "train/ant/dangling.jpg");
  auto ds = open_folder(t.path.string(), Split::train);
  ASSERT_EQ(ds->size(), 6);
  EXPECT_EQ(ds->name(1), (t.path / "train/ant/dangling.jpg").string());
  EXPECT_FALSE(ds->read(1, bytes));
  fs::create_directory_symlink(t.path / "train/cat", t.path / "train/cat/deeper/up");
  expect_error([&] { open_folder(t.path.string(), Split::train); }, "train/cat/deeper/up is ");
  fs::remove(t.path / "train/cat/deeper/up");
  fs::create_directory_symlink(t.path / "train/cat/deeper", t.path / "train/cat/also");
  expect_error([&] { open_folder(t.path.string(), Split::train); }, "a second link to it");
  fs::remove(t.path / "train/cat/also");
  // Another class's or split's folder is that class's own listing: allowed.
  fs::create_directory_symlink(t.path / "train/ant", t.path / "val/bee/elsewhere");
  EXPECT_EQ(open_folder(t.path.string(), Split::val)->size(), 3);

  write_text(t.path / "bom.txt", "\xEF\xBB\xBFtrain/ant/a.Png 0\n");
  ds = open_list((t.path / "bom.txt").string());
  EXPECT_EQ(ds->name(0), (t.path / "train/ant/a.Png").string());
  EXPECT_TRUE(ds->read(0, bytes));
}

// A class name with a line break cannot go into a shard index (one name per line): refused when
// packing, not found out when the index is read back.
TEST(data_formats, PackingRefusesAClassNameWithALineBreak) {
  TempDir t;
  write_image(t.path / "train/a\nb/x.jpg", 8, 8, 1);
  write_image(t.path / "train/c/y.jpg", 8, 8, 2);
  const auto ds = open_folder(t.path.string(), Split::train);
  expect_error([&] { pack_shards(*ds, "train", (t.path / "out/s").string(), 1 << 20); }, "holds a line break");
  EXPECT_FALSE(fs::exists(t.path / "out/s.index"));
}

// Labels mean the same classes in both splits: named sources must list the same names in the same
// order; unnamed ones (list files) may only have fewer in validation.
TEST(data_formats, SplitsMustShareTheirClasses) {
  DataConfig cfg;
  cfg.train_shards = "/d/train.index";
  cfg.val_shards = "/d/val.index";
  const std::vector<std::string> abc = {"a", "b", "c"};
  EXPECT_NO_THROW(check_split_classes(cfg, abc, abc));
  expect_error([&] { check_split_classes(cfg, abc, {"a", "c"}); },
               "training (shard set /d/train.index) and validation (shard set /d/val.index) name different "
               "classes (3 and 2; label 1 is 'b' in training, 'c' in validation)");
  expect_error([&] { check_split_classes(cfg, abc, {"a", "b", "c", "d"}); }, "label 3 is none in training, 'd'");
  cfg.val_shards.clear();
  cfg.val_list = "/d/val.txt";
  EXPECT_NO_THROW(check_split_classes(cfg, abc, {"0", "1"}));
  expect_error([&] { check_split_classes(cfg, abc, {"0", "1", "2", "3"}); },
               "the validation split has 4 classes but the training split only 3; training (shard set "
               "/d/train.index) and validation (list file /d/val.txt) must share their labels");
  cfg = DataConfig{};
  cfg.root = "/d";
  EXPECT_EQ(split_source(cfg, Split::val), "folder /d/val");
}

}  // namespace
}  // namespace rt::data

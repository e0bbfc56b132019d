// data/ as GPU-only builds compile it without OpenCV (image_decode_none.cc): synthetic data loads
// as in the full build, and a dataset on disk is refused up front with the reason, not per image.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "data/image.h"
#include "data/loader.h"
#include "nn/error.h"

namespace rt::data {
namespace {

DataConfig synthetic(Output output) {
  DataConfig cfg;
  cfg.synthetic = true;
  cfg.synthetic_samples = 40;
  cfg.synthetic_classes = 5;
  cfg.image_size = 8;
  cfg.threads = 2;
  cfg.output = output;
  return cfg;
}

std::vector<Batch> epoch(const DataConfig& cfg) {
  auto l = make_loader(cfg, Split::train, 0, 2, 4);
  l->start_epoch({0, 0});
  std::vector<Batch> out;
  for (Batch b; l->next(b);) out.push_back(b);
  return out;
}

TEST(data_no_decoder, SyntheticLoadsDeterministically) {
  EXPECT_FALSE(have_image_decoder());
  const auto a = epoch(synthetic(Output::f32)), b = epoch(synthetic(Output::f32));
  const auto u = epoch(synthetic(Output::u8));
  ASSERT_EQ(a.size(), 5u);  // 40 samples / (2 ranks x 4)
  ASSERT_EQ(u.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].images, b[i].images);
    EXPECT_EQ(a[i].labels, b[i].labels);
    EXPECT_EQ(a[i].labels, u[i].labels);
    EXPECT_EQ(a[i].images.size(), 4u * 3 * 8 * 8);
    EXPECT_EQ(u[i].pixels.size(), 4u * 8 * 8 * 3);
    for (int32_t l : a[i].labels) EXPECT_TRUE(l >= 0 && l < 5) << l;
  }
}

TEST(data_no_decoder, DatasetOnDiskIsRefusedWithTheReason) {
  const auto root = std::filesystem::temp_directory_path() / "rt_no_decoder";
  std::filesystem::create_directories(root / "train" / "a");
  std::ofstream(root / "train" / "a" / "x.jpg") << "not decoded";
  DataConfig cfg = synthetic(Output::f32);
  cfg.synthetic = false;
  cfg.root = root.string();
  try {
    make_loader(cfg, Split::train, 0, 1, 1);
    FAIL() << "a folder dataset was accepted without a decoder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no image decoder"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace rt::data

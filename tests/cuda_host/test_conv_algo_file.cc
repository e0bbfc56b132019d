// The algorithm cache file (cuda.algo_cache) on the host: its lines read back, other identities
// and malformed lines are left alone, the last line of a key wins, and a file that cannot be
// used is named in the error. Reading choices back into a context: tests/gpu/gpu_conv_algos.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "cuda/conv_algo_cache.h"
#include "cuda/conv_algo_file.h"
#include "nn/error.h"
#include "tests/error_of.h"

namespace rt::cuda {
namespace {

namespace fs = std::filesystem;

using rt_test::error_of;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("rt_algo_file_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

ConvAlgos sample(int k) {
  ConvAlgos a;
  a.fwd = cudnnConvolutionFwdAlgo_t(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM + k % 2);
  a.bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  a.bwd_filter = cudnnConvolutionBwdFilterAlgo_t(k % 4);
  a.fwd_math = CUDNN_TENSOR_OP_MATH;
  a.bwd_data_math = CUDNN_DEFAULT_MATH;
  a.bwd_filter_math = CUDNN_FMA_MATH;
  a.workspace = 12345;  // not kept: the reader asks cuDNN again
  return a;
}

bool same(const ConvAlgos& a, const ConvAlgos& b) {
  return a.fwd == b.fwd && a.bwd_data == b.bwd_data && a.bwd_filter == b.bwd_filter &&
         a.fwd_math == b.fwd_math && a.bwd_data_math == b.bwd_data_math &&
         a.bwd_filter_math == b.bwd_filter_math;
}

TEST(ConvAlgoFile, LinesReadBackForTheirIdentityOnly) {
  const fs::path f = fresh_dir("roundtrip") / "algos.tsv";
  const std::string id = "NVIDIA H200 sm_90 cudnn 91000 cudart 13000 timed workspace 1073741824";
  prepare_algo_file(f);
  EXPECT_EQ(slurp(f).substr(0, 2), "# ");  // says what it holds
  prepare_algo_file(f);                      // an existing file is kept as it is
  EXPECT_EQ(slurp(f).find('\t'), std::string::npos);
  append_algo_file(f, algo_file_line(id, "bf16 NHWC tensor-op 256x64x56x56 out_c 64", sample(0)));
  append_algo_file(f, algo_file_line(id, "fma 256x3x224x224 out_c 64", sample(1)));
  append_algo_file(f, algo_file_line(id + " deterministic", "fma 256x3x224x224 out_c 64", sample(2)));
  append_algo_file(f, algo_file_line(id, "bf16 NHWC tensor-op 256x64x56x56 out_c 64", sample(3)));

  const AlgoFileContents c = read_algo_file(f, id);
  EXPECT_EQ(c.lines, 4);
  EXPECT_EQ(c.malformed, 0);
  ASSERT_EQ(c.choices.size(), 2u);
  EXPECT_TRUE(same(c.choices.at("fma 256x3x224x224 out_c 64"), sample(1)));
  // The later line of a key wins (another rank's, or a choice made again after the first went stale).
  EXPECT_TRUE(same(c.choices.at("bf16 NHWC tensor-op 256x64x56x56 out_c 64"), sample(3)));
  EXPECT_EQ(c.choices.at("fma 256x3x224x224 out_c 64").workspace, 0u);
  const AlgoFileContents det = read_algo_file(f, id + " deterministic");
  ASSERT_EQ(det.choices.size(), 1u);
  EXPECT_TRUE(same(det.choices.begin()->second, sample(2)));
  EXPECT_TRUE(read_algo_file(f, "another GPU").choices.empty());
  EXPECT_TRUE(read_algo_file(f, id.substr(0, 20)).choices.empty());  // a prefix is not the identity
  // A line cut short by a kill: the next run's first choice starts a line of its own.
  {
    std::ofstream(f, std::ios::app) << id << "\tcut short 1x1 out_c";
  }
  prepare_algo_file(f);
  append_algo_file(f, algo_file_line(id, "fma 1x1x8x8 out_c 4", sample(2)));
  const AlgoFileContents cut = read_algo_file(f, id);
  EXPECT_EQ(cut.malformed, 1);
  ASSERT_EQ(cut.choices.count("fma 1x1x8x8 out_c 4"), 1u);
  EXPECT_TRUE(same(cut.choices.at("fma 1x1x8x8 out_c 4"), sample(2)));
}

TEST(ConvAlgoFile, TabsAndNewlinesInNamesDoNotBreakTheLine) {
  const fs::path f = fresh_dir("names") / "algos.tsv";
  const std::string id = "odd\tdevice\nname";
  append_algo_file(f, algo_file_line(id, "key\twith tab", sample(0)));
  const std::string text = slurp(f);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
  const AlgoFileContents c = read_algo_file(f, id);
  ASSERT_EQ(c.choices.size(), 1u);
  EXPECT_EQ(c.choices.begin()->first, "key with tab");
}

TEST(ConvAlgoFile, MalformedLinesAreCountedAndIgnored) {
  const fs::path f = fresh_dir("malformed") / "algos.tsv";
  const std::string good = algo_file_line("id", "k", sample(0));
  std::ofstream(f) << "# comment\n"
                   << good                                // line 2
                   << "id\tk2\t1 1 1 1 1\n"               // 3: five numbers
                   << "id\tk3\t1 1 1 1 1 1 9\n"           // 4: seven
                   << "id\tk4\t8 1 0 0 0 0\n"             // 5: no forward algorithm 8
                   << "id\tk5\t0 4 0 0 0 0\n"             // 6: no math type 4
                   << "id\tk6\t-1 0 0 0 0 0\n"            // 7: negative
                   << "id\tk10\t0 0 0 2 0 0\n"            // 8: fp32 converted to fp16 (math 2)
                   << "id k7 0 0 0 0 0 0\n"               // 9: no tabs
                   << "\tk8\t0 0 0 0 0 0\n"               // 10: no identity
                   << "id\t\t0 0 0 0 0 0\n"               // 11: no key
                   << "\n"                                // empty lines are skipped
                   << "id\tk9\t0 1 x 0 0 0\n"             // 13: not a number
                   << good.substr(0, good.size() / 2);   // 14: torn by a killed process
  const AlgoFileContents c = read_algo_file(f, "id");
  EXPECT_EQ(c.lines, 1);
  EXPECT_EQ(c.malformed, 11);
  EXPECT_EQ(c.first_malformed, 3);
  ASSERT_EQ(c.choices.size(), 1u);
  EXPECT_TRUE(same(c.choices.at("k"), sample(0)));
}

TEST(ConvAlgoFile, MissingFileReadsEmptyAndUnusablePathsAreNamed) {
  const fs::path d = fresh_dir("errors");
  const AlgoFileContents none = read_algo_file(d / "absent.tsv", "id");
  EXPECT_TRUE(none.choices.empty());
  EXPECT_EQ(none.lines, 0);
  prepare_algo_file(d / "new" / "folders" / "algos.tsv");  // made, as a cache under ~/.cache
  EXPECT_TRUE(fs::is_regular_file(d / "new" / "folders" / "algos.tsv"));
  std::ofstream(d / "plain") << "a file, not a folder\n";
  std::string e = error_of([&] { prepare_algo_file(d / "plain" / "algos.tsv"); });
  EXPECT_NE(e.find("algorithm cache " + (d / "plain" / "algos.tsv").string() + ": cannot create its folder"),
            std::string::npos) << e;
  e = error_of([&] { prepare_algo_file(d); });
  EXPECT_NE(e.find("algorithm cache " + d.string() + ": cannot append"), std::string::npos) << e;
  e = error_of([&] { read_algo_file(d, "id"); });  // a directory
  EXPECT_NE(e.find("algorithm cache " + d.string()), std::string::npos) << e;
  e = error_of([&] { append_algo_file(d / "no" / "algos.tsv", "x\n"); });
  EXPECT_NE(e.find("algorithm cache " + (d / "no" / "algos.tsv").string() + ": cannot append"),
            std::string::npos) << e;
}

// The cache appends each new choice and counts what the file gave; a file's choices wait in
// stored() until the caller has checked them against its descriptors (conv_choose_algos).
TEST(ConvAlgoFile, CacheAppendsNewChoicesOnly) {
  const fs::path f = fresh_dir("cache") / "algos.tsv";
  {
    ConvAlgoCache c;
    c.use_file(f, "gpu A");
    EXPECT_EQ(c.stored("k1"), nullptr);
    c.add("k1", sample(1));
    c.add("k2", sample(2));
    EXPECT_NE(c.find("k1"), nullptr);
    EXPECT_EQ(c.loaded(), 0);
    EXPECT_EQ(c.summary(), "2 convolution shapes for 3 layers; 0 choices read from " + f.string() +
                               ", 2 added to it");
  }
  ConvAlgoCache next;
  next.use_file(f, "gpu A");
  ASSERT_NE(next.stored("k1"), nullptr);
  EXPECT_TRUE(same(*next.stored("k2"), sample(2)));
  EXPECT_EQ(next.find("k1"), nullptr);  // not in use until added
  next.add("k1", *next.stored("k1"), /*from_file=*/true);
  next.add("k3", sample(3));
  EXPECT_EQ(next.loaded(), 1);
  EXPECT_EQ(read_algo_file(f, "gpu A").lines, 3);  // k3 appended; k1 not again
  std::ofstream(f, std::ios::app) << "garbage\n";
  ConvAlgoCache third;
  third.use_file(f, "gpu A");
  third.add("k1", *third.stored("k1"), true);
  EXPECT_EQ(third.summary(), "1 convolution shape for 1 layer; 1 choice read from " + f.string() +
                                 " (1 malformed line ignored, the first at line 5), 0 added to it");
  // A file that cannot take more (here: replaced by a directory) does not stop the run; the
  // summary says the choices were not kept.
  ConvAlgoCache lost;
  lost.use_file(f, "gpu A");
  fs::remove(f);
  fs::create_directory(f);
  lost.add("k4", sample(0));
  lost.add("k5", sample(1));
  EXPECT_EQ(lost.summary(), "2 convolution shapes for 2 layers; 0 choices read from " + f.string() +
                                " (1 malformed line ignored, the first at line 5), 2 new, not kept: "
                                "algorithm cache " + f.string() +
                                ": cannot append: Is a directory");
  ConvAlgoCache plain;  // without a file: nothing written anywhere
  plain.add("k1", sample(1));
  EXPECT_EQ(plain.summary(), "1 convolution shape for 1 layer");
}

}  // namespace
}  // namespace rt::cuda

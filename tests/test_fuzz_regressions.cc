// Every saved fuzzer input goes through the same entry function as the fuzzer (tools/fuzz): the
// seed corpora (valid inputs: each must be accepted) and the inputs that once crashed a reader
// (tests/fuzz_inputs/<target>/: each must now be accepted or refused with a clean rt::Error, and
// refused when its name starts with "refused_"). The file format of each target's inputs is
// described in tools/fuzz/targets.h.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "../tools/fuzz/targets.cc"  // the entry functions the fuzzer programs call

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = fs::path(__FILE__).parent_path().parent_path();

std::vector<fs::path> inputs_in(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class FuzzInputs : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzInputs, seed_corpus_is_accepted) {
  const auto entry = rt::fuzz::fuzz_entry(GetParam());
  ASSERT_NE(entry, nullptr);
  const auto seeds = inputs_in(kRoot / "tools/fuzz/corpus" / GetParam());
  EXPECT_FALSE(seeds.empty()) << "no seeds in tools/fuzz/corpus/" << GetParam();
  for (const fs::path& p : seeds) {
    const auto b = bytes_of(p);
    bool ok = false;
    EXPECT_NO_THROW(ok = entry(b.data(), b.size())) << p;
    EXPECT_TRUE(ok) << p << " is a valid input the reader refused";
  }
}

TEST_P(FuzzInputs, saved_inputs_give_clean_errors) {
  const auto entry = rt::fuzz::fuzz_entry(GetParam());
  ASSERT_NE(entry, nullptr);
  for (const fs::path& p : inputs_in(kRoot / "tests/fuzz_inputs" / GetParam())) {
    const auto b = bytes_of(p);
    bool ok = false;
    EXPECT_NO_THROW(ok = entry(b.data(), b.size())) << p;
    if (p.filename().string().rfind("refused_", 0) == 0) {
      EXPECT_FALSE(ok) << p << " was accepted";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(fuzz_regressions, FuzzInputs,
                         ::testing::ValuesIn(rt::fuzz::fuzz_target_names()),
                         [](const auto& info) { return info.param; });

}  // namespace

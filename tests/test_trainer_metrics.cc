// The metrics file: records appended as JSON lines, a half record left by a killed run closed on
// a line of its own, and a file deleted during the run (its run folder removed) made anew.
#include "trainer/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace rt::trainer {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(trainer_metrics, HalfRecordEndedAndDeletedFileMadeAgain) {
  const fs::path dir = fs::temp_directory_path() / ("rt_metrics_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path file = dir / "run" / "metrics.jsonl";
  fs::create_directories(file.parent_path());
  std::ofstream(file) << "{\"type\":\"step\",\"st";  // a run killed mid-record
  {
    Metrics m(file.string());
    m.write(JsonLine("start").add("rank", int64_t(0)));
    EXPECT_EQ(read(file), "{\"type\":\"step\",\"st\n{\"type\":\"start\",\"rank\":0}\n");
    fs::remove_all(dir / "run");  // the run folder removed under the run
    m.write(JsonLine("epoch").add("epoch", int64_t(1)));
    m.write(JsonLine("epoch").add("epoch", int64_t(2)));
  }
  EXPECT_EQ(read(file), "{\"type\":\"epoch\",\"epoch\":1}\n{\"type\":\"epoch\",\"epoch\":2}\n");
  fs::remove_all(dir);
}

// A metrics file no record reached (a job refused at start) goes, with the folders made for
// it; one that existed before is left as it was, and so is a folder that holds something else.
TEST(trainer_metrics, AFileWithoutRecordsIsNotLeftBehind) {
  const fs::path dir = fs::temp_directory_path() / ("rt_metrics_empty_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  { Metrics m((dir / "runs/a/metrics.jsonl").string()); }
  EXPECT_FALSE(fs::exists(dir / "runs"));
  {
    Metrics m((dir / "runs/b/metrics.jsonl").string());
    m.write(JsonLine("start"));
  }
  EXPECT_TRUE(fs::exists(dir / "runs/b/metrics.jsonl"));
  { Metrics m((dir / "runs/b/metrics.jsonl").string()); }  // there before: kept
  EXPECT_TRUE(fs::exists(dir / "runs/b/metrics.jsonl"));
  {
    Metrics m((dir / "runs/c/metrics.jsonl").string());
    std::ofstream((dir / "runs/c/other").string()) << "x";
  }
  EXPECT_FALSE(fs::exists(dir / "runs/c/metrics.jsonl"));
  EXPECT_TRUE(fs::exists(dir / "runs/c/other"));
  fs::remove_all(dir);
}

// A live bar wider than its terminal wraps, and '\r' then rewrites only its last row: the fields
// that matter least are left out first, the ETA kept; only then is the text cut.
TEST(trainer_metrics, ProgressFieldsFitTheTerminal) {
  const std::vector<std::pair<std::string, int>> f = {{"epoch 1/90", 0}, {"loss 6.9", 0}, {"lr 0.1", 2},
                                                      {"12.5 img/s", 1}, {"ETA 1:02", 0}};
  EXPECT_EQ(fit_fields(f, std::string::npos), "epoch 1/90 loss 6.9 lr 0.1 12.5 img/s ETA 1:02");
  EXPECT_EQ(fit_fields(f, 46), "epoch 1/90 loss 6.9 lr 0.1 12.5 img/s ETA 1:02");
  EXPECT_EQ(fit_fields(f, 45), "epoch 1/90 loss 6.9 12.5 img/s ETA 1:02");
  EXPECT_EQ(fit_fields(f, 38), "epoch 1/90 loss 6.9 ETA 1:02");
  EXPECT_EQ(fit_fields(f, 10), "epoch 1/90");
  EXPECT_EQ(terminal_columns(-1, 77), 77);  // no terminal: the fallback
}

}  // namespace
}  // namespace rt::trainer

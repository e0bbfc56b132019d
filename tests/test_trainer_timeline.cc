// log.timeline's writer: the file is a JSON array of trace events that Python's json module
// reads, complete after close() and after one "]" when the writer stopped early (a job that
// died); a failed write ends the timeline, not the job; an unwritable path names the key and the
// path.
#include "trainer/timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/error_of.h"

namespace rt::trainer {
namespace {

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Python's json module parses the file and counts its complete and instant events.
int python_events(const std::string& path, const char* ph) {
  const std::string cmd = "/usr/bin/python3 -c \"import json,sys; print(sum(e.get('ph') == sys.argv[2] "
                          "for e in json.load(open(sys.argv[1]))))\" " + path + " " + ph + " > " + path + ".n";
  if (std::system(cmd.c_str()) != 0) return -1;
  return std::atoi(read(path + ".n").c_str());
}

std::string tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("rt_timeline_" + std::to_string(getpid()) + name)).string();
}

TEST(Timeline, WritesTraceEventsThatParse) {
  const std::string path = tmp("a.json");
  {
    Timeline tl(path, "log.timeline", 3, 100.0);
    tl.span(Timeline::kMain, "forward", 100.5, 100.75, "\"step\":1");
    tl.instant(Timeline::kMain, "bucket ready", 100.6, "\"step\":1,\"bucket\":0");
    tl.span(Timeline::kComm, "allreduce", 100.6, 100.5);  // end before start: zero length
    tl.flush();
    // What a job that stops here leaves: every event whole, the array not yet closed.
    std::ofstream(path + ".cut") << read(path) << "\n]\n";
    EXPECT_EQ(python_events(path + ".cut", "X"), 2);
  }  // the destructor closes it
  const std::string s = read(path);
  EXPECT_EQ(python_events(path, "X"), 2);
  EXPECT_EQ(python_events(path, "i"), 1);
  EXPECT_EQ(python_events(path, "M"), 4);  // process name, sort index, two thread names
  EXPECT_NE(s.find("{\"name\":\"forward\",\"ph\":\"X\",\"pid\":3,\"tid\":0,\"ts\":500000.000,"
                   "\"dur\":250000.000,\"args\":{\"step\":1}}"), std::string::npos) << s;
  EXPECT_NE(s.find("\"name\":\"allreduce\",\"ph\":\"X\",\"pid\":3,\"tid\":1,\"ts\":600000.000,\"dur\":0.000}"),
            std::string::npos) << s;
  EXPECT_NE(s.find("\"s\":\"t\""), std::string::npos) << s;
  EXPECT_NE(s.find("\"args\":{\"name\":\"rank 3\"}"), std::string::npos) << s;
  for (const char* p : {"a.json", "a.json.cut", "a.json.n", "a.json.cut.n"}) std::remove(tmp(p).c_str());
}

TEST(Timeline, ClosedWritesNothingMore) {
  const std::string path = tmp("b.json");
  Timeline tl(path, "log.timeline", 0, 0);
  tl.close();
  EXPECT_TRUE(tl.closed());
  tl.span(Timeline::kMain, "late", 1, 2);
  tl.close();
  EXPECT_EQ(python_events(path, "X"), 0);
  EXPECT_EQ(read(path).find("late"), std::string::npos);
  std::remove(path.c_str());
  std::remove((path + ".n").c_str());
}

// A write that fails (here /dev/full: no space) closes the timeline and says why, instead of
// stopping the training.
TEST(Timeline, AFailedWriteStopsTheTimelineOnly) {
  Timeline tl("/dev/full", "log.timeline", 0, 0);
  tl.span(Timeline::kMain, "step", 0, 1);
  EXPECT_NO_THROW(tl.flush());
  EXPECT_TRUE(tl.closed());
  EXPECT_NE(tl.error().find("writing '/dev/full' failed: No space left on device"), std::string::npos)
      << tl.error();
  tl.span(Timeline::kMain, "step", 1, 2);  // ignored
  tl.close();
}

TEST(Timeline, UnwritablePathNamesTheKeyAndThePath) {
  const std::string e = rt_test::error_of([] { Timeline("/no/such/dir/t.json", "log.timeline", 0, 0); });
  EXPECT_NE(e.find("log.timeline: cannot write the timeline '/no/such/dir/t.json'"), std::string::npos) << e;
}

}  // namespace
}  // namespace rt::trainer

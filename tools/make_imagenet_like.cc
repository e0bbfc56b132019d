// make_imagenet_like: writes an ImageNet-layout folder of JPEGs whose classes are learnable but
// not trivial — each class is a combination of shape, stripe orientation and colour palette,
// drawn at a random position, size and rotation over a cluttered, noisy background.
//
//   make_imagenet_like --out DIR [--classes 10] [--train-per-class 260] [--val-per-class 50]
//                      [--width 64 --height 64] [--max-width W2 --max-height H2] [--seed 0]
//                      [--quality 90] [--threads 0] [--force]
//
// Sizes: each image is width x height, or drawn uniformly from [width, max-width] x
// [height, max-height] when a maximum is given. Same arguments give byte-identical files (each
// image's randomness is keyed by (seed, split, class, index), whatever the thread count). The
// folder is written under DIR.tmp-<pid> and renamed to DIR at the end, with DIR/DATASET.txt
// recording the arguments: an interrupted run never leaves a DIR that looks complete, and a rerun
// with the same arguments on a finished DIR does nothing.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "data/rng.h"
#include "tools/cli_args.h"

namespace fs = std::filesystem;
using rt::data::hash_key;

namespace {

struct Args {
  std::string out;
  int classes = 10, train_per_class = 260, val_per_class = 50;
  int width = 64, height = 64, max_width = 0, max_height = 0;
  uint64_t seed = 0;
  int quality = 90, threads = 0;
  bool force = false;
};

constexpr int kShapes = 6, kOrients = 4;
const char* const kShapeNames[kShapes] = {"circle", "square", "triangle", "star", "ring", "cross"};

struct ClassDef {
  int shape, orient, palette, palettes;
  std::string name;
};

// All (shape, orientation, palette) combinations in a seeded order; the first `classes` are used,
// so neighbouring classes may share one or two attributes and must be told apart by the third.
std::vector<ClassDef> make_classes(int classes, uint64_t seed) {
  const int palettes = std::max(5, (classes + kShapes * kOrients - 1) / (kShapes * kOrients));
  std::vector<ClassDef> all;
  for (int p = 0; p < palettes; ++p)
    for (int o = 0; o < kOrients; ++o)
      for (int s = 0; s < kShapes; ++s) all.push_back({s, o, p, palettes, ""});
  rt::data::Rng rng(hash_key(seed, 0x636c6173ULL));
  for (size_t i = all.size() - 1; i > 0; --i) std::swap(all[i], all[rng.below(i + 1)]);
  all.resize(static_cast<size_t>(classes));
  for (int c = 0; c < classes; ++c) {
    char name[96];
    std::snprintf(name, sizeof(name), "%03d_%s_stripes%d_hue%03d", c, kShapeNames[all[c].shape],
                  all[c].orient * 45, all[c].palette * 180 / all[c].palettes);
    all[c].name = name;
  }
  return all;
}

cv::Scalar hsv_to_bgr(double h, double s, double v) {
  cv::Mat3b px(1, 1, cv::Vec3b(cv::saturate_cast<uchar>(std::fmod(h + 180.0, 180.0)),
                               cv::saturate_cast<uchar>(s), cv::saturate_cast<uchar>(v)));
  cv::cvtColor(px, px, cv::COLOR_HSV2BGR);
  return cv::Scalar(px(0)[0], px(0)[1], px(0)[2]);
}

// Outline of a shape of radius r at (cx, cy) rotated by a radians (the ring is drawn separately).
std::vector<cv::Point> shape_points(int shape, double cx, double cy, double r, double a) {
  std::vector<std::pair<double, double>> pts;  // unit-radius polygon
  auto regular = [&](int n, double rad, double phase) {
    for (int k = 0; k < n; ++k) pts.emplace_back(rad * std::cos(phase + 2 * M_PI * k / n), rad * std::sin(phase + 2 * M_PI * k / n));
  };
  switch (shape) {
    case 0: case 4: regular(48, 1.0, 0); break;           // circle (ring: circle minus a hole)
    case 1: regular(4, 1.0, M_PI / 4); break;               // square
    case 2: regular(3, 1.0, -M_PI / 2); break;              // triangle
    case 3:                                                 // five-pointed star
      for (int k = 0; k < 10; ++k) {
        const double rad = k % 2 ? 0.42 : 1.0, t = -M_PI / 2 + M_PI * k / 5;
        pts.emplace_back(rad * std::cos(t), rad * std::sin(t));
      }
      break;
    default: {                                              // cross
      const double w = 0.33;
      const double xy[12][2] = {{-w, -1}, {w, -1}, {w, -w}, {1, -w}, {1, w}, {w, w},
                                {w, 1}, {-w, 1}, {-w, w}, {-1, w}, {-1, -w}, {-w, -w}};
      for (auto& p : xy) pts.emplace_back(p[0], p[1]);
    }
  }
  std::vector<cv::Point> out;
  const double ca = std::cos(a), sa = std::sin(a);
  for (auto [x, y] : pts)
    out.emplace_back(cvRound(cx + r * (x * ca - y * sa)), cvRound(cy + r * (x * sa + y * ca)));
  return out;
}

void fill_shape(cv::Mat& mask, int shape, double cx, double cy, double r, double a) {
  cv::fillPoly(mask, std::vector<std::vector<cv::Point>>{shape_points(shape, cx, cy, r, a)}, 255, cv::LINE_AA);
  if (shape == 4) cv::circle(mask, cv::Point(cvRound(cx), cvRound(cy)), cvRound(r * 0.55), 0, -1, cv::LINE_AA);
}

cv::Mat draw_image(const ClassDef& cls, int w, int h, uint64_t key) {
  cv::RNG rng(key);
  const double base_hue = 180.0 * cls.palette / cls.palettes;
  // Background: a vertical gradient between two random low-saturation colours.
  cv::Mat img(h, w, CV_8UC3);
  const cv::Scalar top = hsv_to_bgr(rng.uniform(0.0, 180.0), rng.uniform(0.0, 90.0), rng.uniform(60.0, 230.0));
  const cv::Scalar bottom = hsv_to_bgr(rng.uniform(0.0, 180.0), rng.uniform(0.0, 90.0), rng.uniform(60.0, 230.0));
  for (int y = 0; y < h; ++y) {
    const double t = h > 1 ? double(y) / (h - 1) : 0;
    img.row(y).setTo(top * (1 - t) + bottom * t);
  }
  // Clutter: lines, ellipses and boxes in arbitrary colours.
  const int side = std::min(w, h);
  const int clutter = rng.uniform(3, 9);
  for (int k = 0; k < clutter; ++k) {
    const cv::Scalar c = hsv_to_bgr(rng.uniform(0.0, 180.0), rng.uniform(0.0, 255.0), rng.uniform(40.0, 255.0));
    const cv::Point p(rng.uniform(0, w), rng.uniform(0, h)), q(rng.uniform(0, w), rng.uniform(0, h));
    const int thick = std::max(1, side / rng.uniform(30, 80));
    switch (rng.uniform(0, 3)) {
      case 0: cv::line(img, p, q, c, thick, cv::LINE_AA); break;
      case 1: cv::ellipse(img, p, cv::Size(rng.uniform(1, side / 4 + 2), rng.uniform(1, side / 4 + 2)),
                          rng.uniform(0.0, 180.0), 0, 360, c, thick, cv::LINE_AA); break;
      default: cv::rectangle(img, p, q, c, thick, cv::LINE_AA);
    }
  }
  // A distractor: another shape, plain, smaller, in a random colour.
  if (rng.uniform(0.0, 1.0) < 0.5) {
    cv::Mat m = cv::Mat::zeros(h, w, CV_8U);
    fill_shape(m, (cls.shape + rng.uniform(1, kShapes)) % kShapes, rng.uniform(0.0, double(w)),
               rng.uniform(0.0, double(h)), side * rng.uniform(0.08, 0.18), rng.uniform(0.0, 2 * M_PI));
    img.setTo(hsv_to_bgr(rng.uniform(0.0, 180.0), rng.uniform(60.0, 255.0), rng.uniform(60.0, 255.0)), m);
  }
  // The class object: shape in the palette's colour, striped at the class orientation.
  const double r = side * rng.uniform(0.2, 0.42);
  const double cx = w * rng.uniform(0.3, 0.7), cy = h * rng.uniform(0.3, 0.7);
  cv::Mat mask = cv::Mat::zeros(h, w, CV_8U);
  fill_shape(mask, cls.shape, cx, cy, r, rng.uniform(0.0, 2 * M_PI));
  const cv::Scalar fg = hsv_to_bgr(base_hue + rng.uniform(-6.0, 6.0), rng.uniform(150.0, 255.0), rng.uniform(150.0, 255.0));
  const cv::Scalar stripe = hsv_to_bgr(base_hue + 90 + rng.uniform(-6.0, 6.0), rng.uniform(100.0, 255.0), rng.uniform(30.0, 120.0));
  const double theta = (cls.orient * 45.0 + rng.uniform(-10.0, 10.0)) * M_PI / 180.0;
  const double period = std::max(3.0, r * rng.uniform(0.25, 0.45)), phase = rng.uniform(0.0, period);
  const double dx = std::cos(theta), dy = std::sin(theta), inv_period = 1.0 / period;
  const cv::Vec3b fgv(cv::saturate_cast<uchar>(fg[0]), cv::saturate_cast<uchar>(fg[1]), cv::saturate_cast<uchar>(fg[2]));
  const cv::Vec3b stv(cv::saturate_cast<uchar>(stripe[0]), cv::saturate_cast<uchar>(stripe[1]), cv::saturate_cast<uchar>(stripe[2]));
  const int x0 = std::max(0, int(cx - r) - 2), x1 = std::min(w, int(cx + r) + 3);
  const int y0 = std::max(0, int(cy - r) - 2), y1 = std::min(h, int(cy + r) + 3);
  for (int y = y0; y < y1; ++y) {
    const uchar* m = mask.ptr<uchar>(y);
    cv::Vec3b* p = img.ptr<cv::Vec3b>(y);
    for (int x = x0; x < x1; ++x) {
      if (!m[x]) continue;
      const double t = (x * dx + y * dy + phase) * inv_period;
      const cv::Vec3b& c = t - std::floor(t) < 0.5 ? fgv : stv;
      const int a = m[x];  // anti-aliased edge: blend
      for (int k = 0; k < 3; ++k) p[x][k] = static_cast<uchar>((c[k] * a + p[x][k] * (255 - a)) / 255);
    }
  }
  // Sensor-like noise (uniform: much cheaper to draw than Gaussian), and sometimes a little blur.
  cv::Mat noise(h, w, CV_16SC3);
  const int amp = rng.uniform(5, 21);
  rng.fill(noise, cv::RNG::UNIFORM, -amp, amp + 1);
  cv::Mat out;
  img.convertTo(out, CV_16SC3);
  out += noise;
  out.convertTo(img, CV_8UC3);
  if (rng.uniform(0.0, 1.0) < 0.3) cv::GaussianBlur(img, img, cv::Size(3, 3), 0);
  return img;
}

constexpr const char* kUsage =
    "usage: make_imagenet_like --out DIR [--classes 10] [--train-per-class 260] [--val-per-class 50] "
    "[--width 64 --height 64] [--max-width W2 --max-height H2] [--seed 0] [--quality 90] [--threads 0] "
    "[--force]\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "make_imagenet_like: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (k == "--force") { a.force = true; continue; }
    // Bounds far past any use: a stray digit is refused here, not met as an allocation failure.
    static const std::map<std::string, std::pair<long long, long long>> range = {
        {"--classes", {1, 100000}},     {"--train-per-class", {1, 100000000}}, {"--val-per-class", {0, 100000000}},
        {"--width", {8, 16384}},        {"--height", {8, 16384}},             {"--max-width", {8, 16384}},
        {"--max-height", {8, 16384}},   {"--quality", {1, 100}},              {"--threads", {0, 1024}}};
    if (k != "--out" && k != "--seed" && !range.count(k)) usage("unknown flag " + k);
    if (i + 1 >= argc) usage("missing value for " + k);
    const std::string v = argv[++i];
    if (k == "--out") {
      a.out = v;
      continue;
    }
    if (k == "--seed") {
      const auto seed = rt::tools::parse_u64(v);
      if (!seed) usage("--seed takes an integer in [0, 2^64), not '" + v + "'");
      a.seed = *seed;
      continue;
    }
    const auto [lo, hi] = range.at(k);
    const auto x = rt::tools::parse_int(v, lo, hi);
    if (!x) usage(k + " takes an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not '" + v + "'");
    const int n = int(*x);
    if (k == "--classes") a.classes = n;
    else if (k == "--train-per-class") a.train_per_class = n;
    else if (k == "--val-per-class") a.val_per_class = n;
    else if (k == "--width") a.width = n;
    else if (k == "--height") a.height = n;
    else if (k == "--max-width") a.max_width = n;
    else if (k == "--max-height") a.max_height = n;
    else if (k == "--quality") a.quality = n;
    else a.threads = n;
  }
  if (a.out.empty()) usage("--out is required");
  a.max_width = std::max(a.max_width, a.width);
  a.max_height = std::max(a.max_height, a.height);
  return a;
}

// The stop signal caught, 0 while none: a lock-free atomic, safe to set from the handler.
std::atomic<int> g_stop{0};
extern "C" void on_stop(int sig) { g_stop = sig; }

// This machine's name, in the temporary folder's: on a shared file system, other machines'
// generators are not this machine's to judge.
std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || !host[0]) return "host";
  return host;
}

// Folders <out>.tmp-<this host>-<pid> that a generator killed outright (SIGKILL, a power cut)
// left behind: each is removed once no process of its pid lives here (a live one may be another
// generator's).
void remove_abandoned(const fs::path& out) {
  std::error_code ec;
  const std::string prefix = out.filename().string() + ".tmp-" + host_name() + "-";
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(pid_t(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    fs::remove_all(it->path(), rm);
  }
}

}  // namespace

int generate(const Args& a);

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    return generate(a);
  } catch (const std::exception& e) {  // a folder that cannot be made, memory, threads
    std::fprintf(stderr, "make_imagenet_like: %s\n", e.what());
    return 1;
  }
}

// Writes into DIR.tmp-<pid> and renames it over DIR at the end; removes it on any failure.
int generate(const Args& a) {
  std::ostringstream desc;
  desc << "make_imagenet_like classes=" << a.classes << " train-per-class=" << a.train_per_class
       << " val-per-class=" << a.val_per_class << " width=" << a.width << ".." << a.max_width
       << " height=" << a.height << ".." << a.max_height << " seed=" << a.seed << " quality=" << a.quality << "\n";
  const fs::path out(a.out), marker = out / "DATASET.txt";
  if (fs::exists(out)) {
    std::ifstream in(marker);
    const std::string have((std::istreambuf_iterator<char>(in)), {});
    if (!a.force && have == desc.str()) {
      std::printf("make_imagenet_like: %s is up to date\n", a.out.c_str());
      return 0;
    }
    if (!a.force) usage(a.out + " exists with other contents (use --force to replace it)");
  }
  const fs::path tmp = out.string() + ".tmp-" + host_name() + "-" + std::to_string(getpid());
  fs::remove_all(tmp);
  remove_abandoned(out);
  // Asked to stop (a job's end, Ctrl-C), the workers finish their image and the half-made folder
  // goes: the default action would end the process before any cleanup runs.
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) std::signal(sig, on_stop);
  struct Cleanup {  // the half-made folder goes, however this ends before the rename
    const fs::path& dir;
    bool done = false;
    ~Cleanup() {
      std::error_code ec;
      if (!done) fs::remove_all(dir, ec);
    }
  } cleanup{tmp};
  const std::vector<ClassDef> classes = make_classes(a.classes, a.seed);
  struct Job { int split, cls, index; };
  std::vector<Job> jobs;
  for (int s = 0; s < 2; ++s)
    for (int c = 0; c < a.classes; ++c) {
      fs::create_directories(tmp / (s ? "val" : "train") / classes[c].name);
      for (int i = 0; i < (s ? a.val_per_class : a.train_per_class); ++i) jobs.push_back({s, c, i});
    }
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
  const int threads = a.threads > 0 ? a.threads : cores;
  cv::setNumThreads(1);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const auto t0 = std::chrono::steady_clock::now();
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < jobs.size() && !failed && !g_stop;) {
      const Job& job = jobs[j];
      const uint64_t key = hash_key(a.seed, uint64_t(job.split) + 1, uint64_t(job.cls), uint64_t(job.index));
      rt::data::Rng size_rng(key ^ 0x5157ULL);
      const int w = int(size_rng.range(a.width, a.max_width + 1)), h = int(size_rng.range(a.height, a.max_height + 1));
      char name[32];
      std::snprintf(name, sizeof(name), "%06d.jpg", job.index);
      const fs::path p = tmp / (job.split ? "val" : "train") / classes[job.cls].name / name;
      try {  // an exception must not leave a worker thread (that would abort the process)
        const cv::Mat img = draw_image(classes[job.cls], w, h, key);
        if (!cv::imwrite(p.string(), img, {cv::IMWRITE_JPEG_QUALITY, a.quality})) {
          std::fprintf(stderr, "make_imagenet_like: cannot write %s\n", p.c_str());
          failed = true;
        }
      } catch (const std::exception& e) {
        if (!failed.exchange(true))
          std::fprintf(stderr, "make_imagenet_like: %s (%d x %d): %s\n", p.c_str(), w, h, e.what());
      }
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  } catch (...) {  // no more threads to be had: stop the ones started, then report
    failed = true;
    for (auto& t : pool) t.join();
    throw;
  }
  for (auto& t : pool) t.join();
  if (g_stop) {
    std::fprintf(stderr, "make_imagenet_like: stopped by signal %d: %s not made\n", int(g_stop), a.out.c_str());
    return 128 + g_stop;
  }
  if (failed) return 1;
  std::ofstream(tmp / "DATASET.txt") << desc.str();
  fs::remove_all(out);
  fs::rename(tmp, out);  // complete only now
  cleanup.done = true;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("make_imagenet_like: %zu images (%d classes) in %s in %.2f s on %d threads\n", jobs.size(),
              a.classes, a.out.c_str(), s, threads);
  return 0;
}

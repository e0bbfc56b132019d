// bench_data: decoded + augmented images/s of the input pipeline, from a folder or a shard set.
//
//   bench_data --root DIR [--split train|val] [--shards INDEX] [--threads T] [--batch 64]
//              [--size 224] [--batches N] [--passes P] [--queue 4] [--output float|u8|both]
//              [--mixup ALPHA] [--cutmix ALPHA] [--auto-augment POLICY]
//              [--interpolation bilinear|bicubic|random]
//
// Each pass starts a new epoch (so the samples and crops differ), takes one batch untimed (the
// threads start and fill the queue) and times the next N - 1; the first pass only warms up (page
// cache, allocations). Prints the median and min-max images/s over the timed passes, the same
// protocol as the torchvision DataLoader peer (/work/shared/peers/torch_dataloader.py).
// --output both measures float and 8-bit batches in alternating passes of one run (each pass a
// fresh loader, so no prefetch thread of the other output competes), one RESULT line each: on a
// shared machine the two see the same load.
// --mixup / --cutmix ALPHA mix every timed batch as train.mixup / train.cutmix do, on the thread
// that takes the batches (the trainer's), and print that mixing's own time per batch beside the
// rate (which includes it).
// --auto-augment POLICY applies data.auto_augment's policy (autoaugment, randaugment with its
// default 2 ops at magnitude 9, trivialaugment) to the training crops.
// --interpolation sets the crops' resize taps (data.interpolation, or data.eval_interpolation with
// --split val).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/mixup.h"
#include "nn/error.h"
#include "tools/cli_args.h"

namespace {
constexpr const char* kUsage =
    "usage: bench_data --root DIR [--split train|val] [--shards INDEX] [--threads T] [--batch 64] [--size 224] "
    "[--batches 20] [--passes 3] [--queue 4] [--output float|u8|both] [--mixup ALPHA] [--cutmix ALPHA] "
    "[--auto-augment POLICY] [--interpolation bilinear|bicubic|random]\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_data: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One pass: a fresh loader at epoch `epoch`, one batch untimed, then batches - 1 timed, each
// mixed when mixup or cutmix > 0 (each mixing's seconds appended to mix_s).
double pass_rate(const rt::data::DataConfig& cfg, rt::data::Split sp, int batch, int batches, int epoch,
                 double mixup, double cutmix, std::vector<double>& mix_s) {
  auto loader = rt::data::make_loader(cfg, sp, 0, 1, batch);
  if (loader->steps_per_epoch() < batches)
    throw rt::Error(rt::str_cat("bench_data: ", loader->size(), " images give ", loader->steps_per_epoch(),
                                " batches per epoch; --batches ", batches, " needs more"));
  rt::data::Batch b;
  loader->start_epoch({epoch, 0});
  loader->next(b);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t images = 0;
  for (int s = 1; s < batches; ++s) {
    loader->next(b);
    images += b.n;
    if (mixup > 0 || cutmix > 0) {
      const auto m0 = std::chrono::steady_clock::now();
      const int64_t size = cfg.image_size;
      rt::data::mix_batch(b, rt::data::draw_mix(mixup, cutmix, size, cfg.seed, s, 0, 0), size);
      mix_s.push_back(seconds_since(m0));
    }
  }
  return images / seconds_since(t0);
}
}  // namespace

int main(int argc, char** argv) {
  rt::data::DataConfig cfg;
  std::string split = "train", shards, output = "float";
  int batch = 64, batches = 20, passes = 3;
  double mixup = 0, cutmix = 0;
  // Integer flags and their ranges (far past any use: a stray digit is refused, not wrapped).
  static const std::map<std::string, std::pair<long long, long long>> ints = {
      {"--threads", {0, 1024}}, {"--batch", {1, 1 << 16}},  {"--size", {8, 4096}},
      {"--batches", {2, 1 << 20}}, {"--passes", {1, 1000}}, {"--queue", {1, 1024}}};
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!ints.count(k) && k != "--root" && k != "--split" && k != "--shards" && k != "--output" && k != "--mixup" &&
        k != "--cutmix" && k != "--auto-augment" && k != "--interpolation")
      usage("unknown flag " + k);
    if (i + 1 >= argc) usage("missing value for " + k);
    const std::string v = argv[++i];
    int n = 0;
    if (const auto it = ints.find(k); it != ints.end()) {
      const auto x = rt::tools::parse_int(v, it->second.first, it->second.second);
      if (!x)
        usage(k + " takes an integer in [" + std::to_string(it->second.first) + ", " +
              std::to_string(it->second.second) + "], not '" + v + "'");
      n = int(*x);
    }
    const auto real = [&] {
      const auto x = rt::tools::parse_real(v, 0, 1e6);
      if (!x) usage(k + " takes a number >= 0, not '" + v + "'");
      return *x;
    };
    if (k == "--root") cfg.root = v;
    else if (k == "--split") split = v;
    else if (k == "--shards") shards = v;
    else if (k == "--threads") cfg.threads = n;
    else if (k == "--batch") batch = n;
    else if (k == "--size") cfg.image_size = n;
    else if (k == "--batches") batches = n;
    else if (k == "--passes") passes = n;
    else if (k == "--queue") cfg.queue_depth = n;
    else if (k == "--output") output = v;
    else if (k == "--mixup") mixup = real();
    else if (k == "--cutmix") cutmix = real();
    else if (k == "--auto-augment") {
      try {
        cfg.auto_augment.policy = rt::data::auto_augment_from_string(v);
      } catch (const rt::Error& e) {
        usage(e.what());
      }
    }
    else if (k == "--interpolation") {
      using rt::data::Interpolation;
      if (v != "bilinear" && v != "bicubic" && v != "random") usage("--interpolation must be bilinear, bicubic or random");
      cfg.interpolation = v == "bicubic" ? Interpolation::bicubic : v == "random" ? Interpolation::random
                                                                                  : Interpolation::bilinear;
      if (cfg.interpolation != Interpolation::random) cfg.eval_interpolation = cfg.interpolation;
    }
    else usage("unknown flag " + k);
  }
  if (split != "train" && split != "val") usage("--split must be train or val");
  if (output != "float" && output != "u8" && output != "both") usage("--output must be float, u8 or both");
  if (cfg.root.empty() && shards.empty()) usage("--root or --shards is required");
  if (batches < 2 || passes < 1 || batch < 1 || mixup < 0 || cutmix < 0)
    usage("need --batches >= 2, --passes >= 1, --batch >= 1, --mixup and --cutmix >= 0");
  const rt::data::Split sp = split == "train" ? rt::data::Split::train : rt::data::Split::val;
  (sp == rt::data::Split::train ? cfg.train_shards : cfg.val_shards) = shards;
  std::vector<std::string> outputs;
  if (output != "u8") outputs.push_back("float");
  if (output != "float") outputs.push_back("u8");
  try {
    const auto probe = rt::data::make_loader(cfg, sp, 0, 1, batch);  // size, and errors before timing
    std::vector<std::vector<double>> rates(outputs.size()), mix_s(outputs.size());
    for (int p = 0; p <= passes; ++p)
      for (size_t o = 0; o < outputs.size(); ++o) {
        rt::data::DataConfig c = cfg;
        c.output = outputs[o] == "u8" ? rt::data::Output::u8 : rt::data::Output::f32;
        std::vector<double> mixes;
        const double r = pass_rate(c, sp, batch, batches, p, mixup, cutmix, mixes);
        if (p) {  // pass 0 warms up
          rates[o].push_back(r);
          mix_s[o].insert(mix_s[o].end(), mixes.begin(), mixes.end());
        }
      }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      const size_t m = v.size();
      return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
    };
    for (size_t o = 0; o < outputs.size(); ++o) {
      const auto [lo, hi] = std::minmax_element(rates[o].begin(), rates[o].end());
      std::printf("RESULT ringtrain_data source=%s threads=%d batch=%d size=%d mode=%s output=%s images=%lld "
                  "img_per_s_median=%.1f min=%.1f max=%.1f",
                  shards.empty() ? "folder" : "shards", cfg.threads, batch, cfg.image_size, split.c_str(),
                  outputs[o].c_str(), static_cast<long long>(probe->size()), median(rates[o]), *lo, *hi);
      if (cfg.auto_augment.policy != rt::data::AutoAugment::none)
        std::printf(" auto_augment=%s", rt::data::auto_augment_name(cfg.auto_augment.policy));
      if (mixup > 0 || cutmix > 0) {
        const auto [mlo, mhi] = std::minmax_element(mix_s[o].begin(), mix_s[o].end());
        std::printf(" mixup=%g cutmix=%g mix_ms_per_batch_median=%.2f min=%.2f max=%.2f", mixup, cutmix,
                    1e3 * median(mix_s[o]), 1e3 * *mlo, 1e3 * *mhi);
      }
      std::printf("\n");
    }
  } catch (const std::exception& e) {  // rt::Error, and memory for batches this large
    std::fprintf(stderr, "bench_data: %s\n", e.what());
    return 1;
  }
  return 0;
}

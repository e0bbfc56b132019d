// bench_data: decoded + augmented images/s of the input pipeline, from a folder or a shard set.
//
//   bench_data --root DIR [--split train|val] [--shards INDEX] [--threads T] [--batch 64]
//              [--size 224] [--batches N] [--passes P] [--queue 4] [--u8]
//
// Each pass starts a new epoch (so the samples and crops differ), takes one batch untimed (the
// threads start and fill the queue) and times the next N - 1; the first pass only warms up (page
// cache, allocations). Prints the median and min-max images/s over the timed passes, the same
// protocol as the torchvision DataLoader peer (/work/shared/peers/torch_dataloader.py).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/loader.h"
#include "nn/error.h"

namespace {
[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_data: %s\nusage: bench_data --root DIR [--split train|val] [--shards INDEX] "
               "[--threads T] [--batch 64] [--size 224] [--batches 20] [--passes 3] [--queue 4] [--u8]\n", why.c_str());
  std::exit(2);
}
}  // namespace

int main(int argc, char** argv) {
  rt::data::DataConfig cfg;
  std::string split = "train", shards;
  int batch = 64, batches = 20, passes = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--u8") { cfg.output_u8 = true; continue; }
    if (i + 1 >= argc) usage("missing value for " + k);
    const std::string v = argv[++i];
    const int n = std::atoi(v.c_str());
    if (k == "--root") cfg.root = v;
    else if (k == "--split") split = v;
    else if (k == "--shards") shards = v;
    else if (k == "--threads") cfg.threads = n;
    else if (k == "--batch") batch = n;
    else if (k == "--size") cfg.image_size = n;
    else if (k == "--batches") batches = n;
    else if (k == "--passes") passes = n;
    else if (k == "--queue") cfg.queue_depth = n;
    else usage("unknown flag " + k);
  }
  if (split != "train" && split != "val") usage("--split must be train or val");
  if (cfg.root.empty() && shards.empty()) usage("--root or --shards is required");
  if (batches < 2 || passes < 1 || batch < 1) usage("need --batches >= 2, --passes >= 1, --batch >= 1");
  const rt::data::Split sp = split == "train" ? rt::data::Split::train : rt::data::Split::val;
  (sp == rt::data::Split::train ? cfg.train_shards : cfg.val_shards) = shards;
  try {
    auto loader = rt::data::make_loader(cfg, sp, 0, 1, batch);
    if (loader->steps_per_epoch() < batches)
      throw rt::Error(rt::str_cat("bench_data: ", loader->size(), " images give ", loader->steps_per_epoch(),
                                  " batches per epoch; --batches ", batches, " needs more"));
    std::vector<double> rates;
    double waited = 0;
    rt::data::Batch b;
    for (int p = 0; p <= passes; ++p) {
      loader->start_epoch({p, 0});
      loader->next(b);
      const auto t0 = std::chrono::steady_clock::now();
      int64_t images = 0;
      for (int s = 1; s < batches; ++s) {
        loader->next(b);
        images += b.n;
        if (p) waited += loader->last_wait_s();
      }
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (p) rates.push_back(images / dt);
    }
    std::vector<double> sorted = rates;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                            : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
    std::printf("RESULT ringtrain_data source=%s threads=%d batch=%d size=%d mode=%s images=%lld "
                "img_per_s_median=%.1f min=%.1f max=%.1f skipped=%lld\n",
                shards.empty() ? "folder" : "shards", cfg.threads, batch, cfg.image_size, split.c_str(),
                static_cast<long long>(loader->size()), median, sorted.front(), sorted.back(),
                static_cast<long long>(loader->skipped()));
  } catch (const rt::Error& e) {
    std::fprintf(stderr, "bench_data: %s\n", e.what());
    return 1;
  }
  return 0;
}

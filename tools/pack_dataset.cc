// pack_dataset: packs an ImageNet-layout folder split into a shard set (format in data/shard.h).
//
//   pack_dataset --root DIR --split train|val --out PREFIX [--shard-mib 256]
//
// Writes PREFIX-00000.shard, ... and PREFIX.index (name the index in the config's train_shards /
// val_shards). Sample order, bytes and labels equal the folder's, so both give the same batches.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "data/dataset.h"
#include "data/shard.h"
#include "nn/error.h"

namespace {
[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "pack_dataset: %s\nusage: pack_dataset --root DIR --split train|val --out PREFIX [--shard-mib 256]\n",
               why.c_str());
  std::exit(2);
}
}  // namespace

int main(int argc, char** argv) {
  std::string root, split, out;
  long long shard_mib = 256;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage("missing value for " + k);
    const std::string v = argv[++i];
    if (k == "--root") root = v;
    else if (k == "--split") split = v;
    else if (k == "--out") out = v;
    else if (k == "--shard-mib") shard_mib = std::atoll(v.c_str());
    else usage("unknown flag " + k);
  }
  if (root.empty() || out.empty()) usage("--root and --out are required");
  if (split != "train" && split != "val") usage("--split must be train or val");
  if (shard_mib < 1) usage("--shard-mib must be >= 1");
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ds = rt::data::open_folder(root, split == "train" ? rt::data::Split::train : rt::data::Split::val);
    const rt::data::PackStats st = rt::data::pack_shards(*ds, split, out, shard_mib << 20, root);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("pack_dataset: %lld samples, %d classes, %.1f MiB in %lld shard(s) in %.2f s -> %s%s\n",
                static_cast<long long>(st.samples), ds->num_classes(), st.bytes / 1048576.0,
                static_cast<long long>(st.shards), s, st.index_path.c_str(),
                st.unreadable ? " (some files unreadable: packed empty, skipped when loading)" : "");
  } catch (const rt::Error& e) {
    std::fprintf(stderr, "pack_dataset: %s\n", e.what());
    return 1;
  }
  return 0;
}

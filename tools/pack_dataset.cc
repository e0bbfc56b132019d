// pack_dataset: packs an ImageNet-layout folder split into a shard set (format in data/shard.h).
//
//   pack_dataset --root DIR --split train|val --out PREFIX [--shard-mib 256]
//
// Writes PREFIX-00000.shard, ... and PREFIX.index (name the index in the config's train_shards /
// val_shards). Sample order, bytes and labels equal the folder's, so both give the same batches.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "data/dataset.h"
#include "data/shard.h"
#include "nn/error.h"
#include "tools/cli_args.h"

namespace {
constexpr const char* kUsage = "usage: pack_dataset --root DIR --split train|val --out PREFIX [--shard-mib 256]\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "pack_dataset: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}
}  // namespace

int main(int argc, char** argv) {
  std::string root, split, out;
  long long shard_mib = 256;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (k != "--root" && k != "--split" && k != "--out" && k != "--shard-mib") usage("unknown flag " + k);
    if (i + 1 >= argc) usage("missing value for " + k);
    const std::string v = argv[++i];
    if (k == "--root") root = v;
    else if (k == "--split") split = v;
    else if (k == "--out") out = v;
    else {
      const auto mib = rt::tools::parse_int(v, 1, 1 << 20);  // up to 1 TiB a shard
      if (!mib) usage("--shard-mib takes an integer in [1, 1048576], not '" + v + "'");
      shard_mib = *mib;
    }
  }
  if (root.empty() || out.empty()) usage("--root and --out are required");
  if (split != "train" && split != "val") usage("--split must be train or val");
  if (std::filesystem::path(out).filename().empty())
    usage("--out " + out + " names a folder: give a file name prefix in it, e.g. " + out + "train");
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ds = rt::data::open_folder(root, split == "train" ? rt::data::Split::train : rt::data::Split::val);
    const rt::data::PackStats st = rt::data::pack_shards(*ds, split, out, shard_mib << 20, root);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("pack_dataset: %lld samples, %d classes, %.1f MiB in %lld shard(s) in %.2f s -> %s%s\n",
                static_cast<long long>(st.samples), ds->num_classes(), st.bytes / 1048576.0,
                static_cast<long long>(st.shards), s, st.index_path.c_str(),
                st.unreadable ? " (some files unreadable: packed empty, skipped when loading)" : "");
  } catch (const std::exception& e) {  // rt::Error, and the file system's own
    std::fprintf(stderr, "pack_dataset: %s\n", e.what());
    return 1;
  }
  return 0;
}

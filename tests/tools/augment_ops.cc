// ringtrain's side of tests/tools/test_autoaugment.py: the augmentation ops, magnitudes and policy
// draws of data/autoaugment.h, driven by commands on stdin, one per line:
//   apply OP MAGNITUDE     the op on a fresh copy of the input image, appended to OUT
//   magnitude POLICY OP BIN BINS WIDTH HEIGHT
//                          prints aug_magnitude (%.17g)
//   draw POLICY OPS MAGNITUDE WIDTH HEIGHT N SEED
//                          prints "op magnitude count" for every step drawn over N images
//   erase WIDTH HEIGHT N SEED
//                          prints "x y w h" of random_erasing_box for N images
//   augment_ops IN.u8 WIDTH HEIGHT RED OUT.u8
// IN holds HEIGHT x WIDTH x 3 bytes, red at byte RED of each pixel.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "data/autoaugment.h"
#include "data/image.h"

using namespace rt::data;

namespace {

AugOp op_from(const std::string& s) {
  for (int i = 0; i <= static_cast<int>(AugOp::invert); ++i)
    if (s == aug_op_name(static_cast<AugOp>(i))) return static_cast<AugOp>(i);
  throw std::runtime_error("unknown op " + s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: augment_ops IN.u8 WIDTH HEIGHT RED OUT.u8 < commands\n");
    return 2;
  }
  const int w = std::stoi(argv[2]), h = std::stoi(argv[3]), red = std::stoi(argv[4]);
  std::vector<uint8_t> input(static_cast<size_t>(w) * h * 3);
  std::ifstream in(argv[1], std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(input.data()), static_cast<std::streamsize>(input.size()))) {
    std::fprintf(stderr, "augment_ops: %s: too short\n", argv[1]);
    return 1;
  }
  std::ofstream out(argv[5], std::ios::binary);
  std::vector<uint8_t> img, scratch;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream ls(line);
    std::string cmd;
    ls >> cmd;
    if (cmd == "apply") {
      std::string op;
      double m = 0;
      ls >> op >> m;
      img = input;
      apply_aug_step({op_from(op), m}, Image8{img.data(), w, h, static_cast<size_t>(w) * 3, red}, scratch);
      out.write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    } else if (cmd == "magnitude") {
      std::string policy, op;
      int bin = 0, bins = 0, mw = 0, mh = 0;
      ls >> policy >> op >> bin >> bins >> mw >> mh;
      std::printf("%.17g\n", aug_magnitude(auto_augment_from_string(policy), op_from(op), bin, bins, mw, mh));
    } else if (cmd == "draw") {
      std::string policy;
      AutoAugmentSpec s;
      int dw = 0, dh = 0;
      int64_t n = 0;
      uint64_t seed = 0;
      ls >> policy >> s.ops >> s.magnitude >> dw >> dh >> n >> seed;
      s.policy = auto_augment_from_string(policy);
      std::map<std::pair<std::string, double>, int64_t> counts;
      AugStep steps[kMaxAugSteps];
      for (int64_t i = 0; i < n; ++i) {
        Rng rng(seed, 0, i, Stream::augment);
        const int k = draw_aug_steps(s, dw, dh, rng, steps);
        for (int j = 0; j < k; ++j) ++counts[{aug_op_name(steps[j].op), steps[j].magnitude}];
      }
      for (const auto& [key, c] : counts)
        std::printf("%s %.17g %lld\n", key.first.c_str(), key.second, static_cast<long long>(c));
    } else if (cmd == "erase") {
      int ew = 0, eh = 0;
      int64_t n = 0;
      uint64_t seed = 0;
      ls >> ew >> eh >> n >> seed;
      for (int64_t i = 0; i < n; ++i) {
        Rng rng(seed, 0, i, Stream::augment);
        const Box b = random_erasing_box(ew, eh, rng);
        std::printf("%d %d %d %d\n", b.x, b.y, b.w, b.h);
      }
    } else if (!cmd.empty()) {
      std::fprintf(stderr, "augment_ops: unknown command %s\n", cmd.c_str());
      return 2;
    }
    std::fflush(stdout);
  }
  return out ? 0 : 1;
}

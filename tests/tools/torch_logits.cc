// Eval-mode logits of a ResNet whose every tensor comes, by name, from a ringtrain checkpoint or
// weights file, for tests/tools/test_torch_weights.py: PyTorch's logits on the same weights and
// input must agree with these.
//   torch_logits MODEL CLASSES SIZE BACKEND WEIGHTS.rtck INPUT.f32 OUTPUT.f32
// INPUT holds N x 3 x SIZE x SIZE floats (NCHW, already normalised); OUTPUT gets N x CLASSES.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "nn/net.h"
#include "nn/resnet.h"
#include "trainer/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: torch_logits MODEL CLASSES SIZE BACKEND WEIGHTS.rtck INPUT.f32 OUTPUT.f32\n");
    return 2;
  }
  try {
    rt::ResNetConfig c;
    c.name = argv[1];
    c.num_classes = std::stoll(argv[2]);
    c.image_size = std::stoll(argv[3]);
    std::ifstream in(argv[6], std::ios::binary | std::ios::ate);
    const size_t image = 3 * size_t(c.image_size) * size_t(c.image_size);
    const size_t n = size_t(in.tellg()) / sizeof(float);
    if (!in || n == 0 || n % image) throw rt::Error(std::string(argv[6]) + ": not a whole number of images");
    std::vector<float> x(n);
    in.seekg(0);
    in.read(reinterpret_cast<char*>(x.data()), std::streamsize(n * sizeof(float)));
    c.batch = int64_t(n / image);
    auto net = rt::build_resnet<float>(c, rt::make_backend<float>(argv[4]));

    const rt::trainer::Checkpoint ck = rt::trainer::checkpoint_read(argv[5]);
    auto& arena = net->arena();
    rt::HostView<float> params = arena.host_params(), state = arena.host_state();
    const auto missing = rt::trainer::checkpoint_copy_matching(ck, arena, params.span(), state.span());
    for (const auto& m : missing) std::fprintf(stderr, "torch_logits: not in %s: %s\n", argv[5], m.c_str());
    if (!missing.empty()) return 1;
    params.commit();
    state.commit();

    net->forward(x.data(), nullptr, /*train=*/false);
    std::vector<float> y(size_t(net->shape(net->logits()).numel()));
    net->export_tensor(net->logits(), y.data());
    std::ofstream out(argv[7], std::ios::binary);
    out.write(reinterpret_cast<const char*>(y.data()), std::streamsize(y.size() * sizeof(float)));
    if (!out) throw rt::Error(std::string(argv[7]) + ": cannot write");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_logits: %s\n", e.what());
    return 1;
  }
  return 0;
}

// ringtrain's side of tests/tools/test_torch_weights.py: a ResNet whose every tensor comes, by name,
// from a ringtrain checkpoint or weights file, run on a given input; PyTorch on the same weights
// and input must agree.
//   torch_compare MODEL CLASSES SIZE BACKEND WEIGHTS.rtck INPUT.f32 OUTPUT.f32
//       eval-mode forward: OUTPUT gets the N x CLASSES logits (f32)
//   torch_compare ... OUTPUT.f32 LABELS.i32 SMOOTHING STEP.rtck
//       one training forward and backward with the mean softmax cross-entropy: OUTPUT gets the
//       logits, stdout the loss, and STEP.rtck (a weights file, with the arena's layout) the
//       gradients as "params" and the BN running statistics after the step as "state"
// INPUT holds N x 3 x SIZE x SIZE floats (NCHW, already normalised), LABELS N int32. BACKEND
// "reference-double" runs the reference backend in double: gradients then have no float rounding
// that could flip a ReLU whose input is within rounding of 0 (which moves a gradient by the whole
// of that element's share), so they can be held to PyTorch's in double.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "nn/net.h"
#include "nn/resnet.h"
#include "trainer/checkpoint.h"

namespace {

template <class T>
std::vector<float> to_float(const std::vector<T>& v) {
  return std::vector<float>(v.begin(), v.end());
}

template <class T>
int run(rt::ResNetConfig c, const std::string& backend, char** argv, bool train) {
  std::ifstream in(argv[6], std::ios::binary | std::ios::ate);
  const size_t image = 3 * size_t(c.image_size) * size_t(c.image_size);
  const size_t n = size_t(in.tellg()) / sizeof(float);
  if (!in || n == 0 || n % image) throw rt::Error(std::string(argv[6]) + ": not a whole number of images");
  std::vector<float> xf(n);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(xf.data()), std::streamsize(n * sizeof(float)));
  const std::vector<T> x(xf.begin(), xf.end());
  c.batch = int64_t(n / image);
  auto net = rt::build_resnet<T>(c, rt::make_backend<T>(backend));

  // Every tensor by name and dims, as --eval --weights takes them.
  const rt::trainer::Checkpoint ck = rt::trainer::checkpoint_read(argv[5]);
  auto& arena = net->arena();
  rt::HostView<T> params = arena.host_params(), state = arena.host_state();
  const auto missing = rt::trainer::checkpoint_copy_matching(ck, arena, params.span(), state.span());
  for (const auto& m : missing) std::fprintf(stderr, "torch_compare: not in %s: %s\n", argv[5], m.c_str());
  if (!missing.empty()) return 1;
  params.commit();
  state.commit();

  std::vector<int32_t> labels(size_t(c.batch));
  if (train) {
    std::ifstream l(argv[8], std::ios::binary);
    if (!l.read(reinterpret_cast<char*>(labels.data()), std::streamsize(labels.size() * sizeof(int32_t))))
      throw rt::Error(std::string(argv[8]) + ": fewer labels than images");
  }
  const double loss = net->forward(x.data(), train ? labels.data() : nullptr, train);
  std::vector<T> y(size_t(net->shape(net->logits()).numel()));
  net->export_tensor(net->logits(), y.data());
  const std::vector<float> yf = to_float(y);
  std::ofstream out(argv[7], std::ios::binary);
  out.write(reinterpret_cast<const char*>(yf.data()), std::streamsize(yf.size() * sizeof(float)));
  if (!out) throw rt::Error(std::string(argv[7]) + ": cannot write");
  if (!train) return 0;

  net->backward();
  std::printf("%.17g\n", loss);
  std::vector<T> grads(arena.size()), after(arena.state().size());
  arena.grads_to_host(grads);
  arena.state_to_host(after);
  rt::trainer::CheckpointMeta meta;
  meta.model.grad_elems = grads.size();
  meta.model.state_elems = after.size();
  rt::trainer::checkpoint_write(argv[10], meta, "", to_float(grads), to_float(after), {}, {},
                                rt::trainer::checkpoint_layout(arena));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8 && argc != 11) {
    std::fprintf(stderr, "usage: torch_compare MODEL CLASSES SIZE BACKEND WEIGHTS.rtck INPUT.f32 OUTPUT.f32 "
                         "[LABELS.i32 SMOOTHING STEP.rtck]\n");
    return 2;
  }
  try {
    const bool train = argc == 11;
    rt::ResNetConfig c;
    c.name = argv[1];
    c.num_classes = std::stoll(argv[2]);
    c.image_size = std::stoll(argv[3]);
    if (train) c.loss.label_smoothing = std::stod(argv[9]);
    const std::string backend = argv[4];
    if (backend == "reference-double") return run<double>(c, "reference", argv, train);
    return run<float>(c, backend, argv, train);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_compare: %s\n", e.what());
    return 1;
  }
}

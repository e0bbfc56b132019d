// The oneDNN convolution against the reference backend, forward and backward, through
// act_import/act_export so that the blocked layouts are exercised (as test_onednn_vs_ref.cc does
// for the other ops), and the kernels oneDNN runs for the shapes ResNets have: no reference loops
// on tiny maps, Winograd where the rule picks it, optimised grouped convolutions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "nn/onednn/onednn_common.h"
#include "nn/resnet.h"
#include "onednn_vs_ref.h"

namespace rt {
namespace {

using namespace test;

// ---------------------------------------------------------------- convolution

struct ConvCase {
  Shape in;
  int64_t out_c, kh, kw, sh, sw, ph, pw;
  bool bias;
  int64_t groups = 1;
};
void PrintTo(const ConvCase& c, std::ostream* os) {
  *os << c.in.str() << " -> " << c.out_c << " k" << c.kh << "x" << c.kw << " s" << c.sh << "x" << c.sw << " p"
      << c.ph << "x" << c.pw << (c.bias ? " bias" : "") << (c.groups > 1 ? " groups " : "")
      << (c.groups > 1 ? std::to_string(c.groups) : "");
}

class ConvVsRef : public OnednnVsRef, public ::testing::WithParamInterface<ConvCase> {};

TEST_P(ConvVsRef, ForwardBackward) {
  const ConvCase& p = GetParam();
  ConvDesc d{.name = "conv", .in = p.in, .out_c = p.out_c, .kernel_h = p.kh, .kernel_w = p.kw,
             .stride_h = p.sh, .stride_w = p.sw, .pad_h = p.ph, .pad_w = p.pw, .bias = p.bias,
             .groups = p.groups};
  const Shape out = d.out();
  auto fast = fast_->make_conv(d);
  auto ref = ref_->make_conv(d);
  const float wscale = 1.f / std::sqrt(float(d.in_per_group() * p.kh * p.kw));
  // Two steps with the weights changed in place in between, as the optimizer does.
  Vec w = rand(size_t(d.weight_count()), -wscale, wscale);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step == 1)
      for (auto& v : w) v = 0.5f * v + 0.01f;
    Vec x = rand(size_t(p.in.numel())), b = rand(size_t(p.out_c)), dy = rand(size_t(out.numel()));
    const float* bp = p.bias ? b.data() : nullptr;

    Vec y_ref(size_t(out.numel()));
    ref->forward(x.data(), w.data(), bp, y_ref.data());
    Vec xf = to_fast(x, p.in), yf = fast_buf(out);
    fast->forward(xf.data(), w.data(), bp, yf.data());
    expect_close(from_fast(yf, out), y_ref, "y");

    Vec dx_ref(x.size()), dw_ref(w.size()), db_ref(b.size());
    ref->backward(x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(),
                  p.bias ? db_ref.data() : nullptr);
    Vec dyf = to_fast(dy, out), dxf = fast_buf(p.in), dw(w.size(), kNaN), db(b.size(), kNaN);
    fast->backward(xf.data(), w.data(), dyf.data(), dxf.data(), dw.data(), p.bias ? db.data() : nullptr);
    expect_close(from_fast(dxf, p.in), dx_ref, "dx");
    expect_close(dw, dw_ref, "dw");
    if (p.bias) expect_close(db, db_ref, "db");

    // Without dx (a first layer) the weight gradients are unchanged.
    Vec dw2(w.size(), kNaN), db2(b.size(), kNaN);
    fast->backward(xf.data(), w.data(), dyf.data(), nullptr, dw2.data(), p.bias ? db2.data() : nullptr);
    expect_close(dw2, dw_ref, "dw without dx");
    if (p.bias) expect_close(db2, db_ref, "db without dx");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvVsRef,
    ::testing::Values(
        ConvCase{{2, 3, 9, 9}, 8, 3, 3, 1, 1, 1, 1, true},          // plain input, blocked output
        ConvCase{{3, 3, 13, 13}, 16, 7, 7, 2, 2, 3, 3, false},      // stem-like 7x7 stride 2
        ConvCase{{2, 16, 8, 8}, 24, 3, 3, 2, 2, 1, 1, false},       // stride 2, even input
        ConvCase{{2, 16, 9, 9}, 16, 3, 3, 2, 2, 1, 1, true},        // stride 2, odd input
        ConvCase{{1, 24, 7, 7}, 16, 1, 1, 1, 1, 0, 0, false},       // batch 1, 1x1
        ConvCase{{2, 16, 10, 10}, 32, 1, 1, 2, 2, 0, 0, false},     // 1x1 stride-2 downsample
        ConvCase{{2, 5, 11, 11}, 16, 7, 7, 2, 2, 3, 3, true},       // C=5 input
        ConvCase{{2, 16, 7, 9}, 5, 3, 3, 1, 1, 1, 1, true},         // non-square, C=5 output
        ConvCase{{2, 64, 6, 6}, 64, 3, 3, 1, 1, 1, 1, false},       // 64 channels
        // Winograd's (ours on 8-channel blocks, oneDNN's F(4x4, 3x3) on 16): many tiles, deep
        ConvCase{{2, 64, 29, 27}, 96, 3, 3, 1, 1, 1, 1, false},
        ConvCase{{1, 256, 7, 7}, 256, 3, 3, 1, 1, 1, 1, false},
        ConvCase{{2, 8, 9, 7}, 8, 3, 1, 2, 1, 1, 0, true},          // non-square kernel, stride
        ConvCase{{2, 16, 3, 3}, 8, 3, 3, 1, 1, 0, 0, true},         // 1x1 output (plain)
        ConvCase{{2, 5, 6, 6}, 3, 3, 3, 1, 1, 1, 1, false},         // plain to plain
        // Tiny maps, where oneDNN has only reference kernels for the blocked layouts and the op
        // runs on plain copies instead (see NoReferenceKernelsOnTinyMaps).
        ConvCase{{2, 16, 2, 2}, 16, 3, 3, 1, 1, 1, 1, false},       // 3x3 on 2x2 maps
        ConvCase{{3, 16, 2, 2}, 24, 3, 3, 2, 2, 1, 1, false},       // blocked 2x2 -> plain 1x1
        ConvCase{{2, 16, 2, 2}, 32, 1, 1, 2, 2, 0, 0, true},        // 1x1 downsample to 1x1
        // Grouped (ResNeXt's 3x3: 32 groups of 4; stride 2), depthwise, groups of one channel's
        // width that blocked layouts cannot hold whole, a grouped 1x1.
        ConvCase{{2, 128, 8, 8}, 128, 3, 3, 1, 1, 1, 1, false, 32},
        ConvCase{{2, 64, 9, 9}, 64, 3, 3, 2, 2, 1, 1, false, 32},
        ConvCase{{2, 16, 6, 6}, 16, 3, 3, 1, 1, 1, 1, true, 16},
        ConvCase{{2, 12, 7, 5}, 6, 3, 3, 1, 1, 1, 1, false, 3},
        ConvCase{{2, 32, 5, 5}, 64, 1, 1, 1, 1, 0, 0, true, 4},
        ConvCase{{2, 256, 2, 2}, 256, 3, 3, 1, 1, 1, 1, false, 32}));  // ResNeXt's layer4 at 64x64

// oneDNN 2.6 falls back to its reference loops (100-1000x slower) for some blocked convolutions
// on tiny maps; the op must route them to a real kernel. Shapes: ResNet-50 at 64x64 (3x3 on 2x2
// maps) and ResNet-18 at 32x32 (stride-2 3x3 and 1x1 from 2x2 to 1x1).
TEST_F(OnednnVsRef, NoReferenceKernelsOnTinyMaps) {
  const std::vector<ConvDesc> descs = {
      {.name = "r50.layer4.conv2", .in = {2, 512, 2, 2}, .out_c = 512, .kernel_h = 3, .kernel_w = 3,
       .pad_h = 1, .pad_w = 1},
      {.name = "r18.layer4.0.conv1", .in = {2, 256, 2, 2}, .out_c = 512, .kernel_h = 3, .kernel_w = 3,
       .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.name = "r18.layer4.0.downsample", .in = {2, 256, 2, 2}, .out_c = 512, .stride_h = 2,
       .stride_w = 2},
      {.name = "r18.layer3.conv", .in = {2, 256, 2, 2}, .out_c = 256, .kernel_h = 3, .kernel_w = 3,
       .pad_h = 1, .pad_w = 1}};
  auto direct = make_backend<float>("onednn-direct", onednn_options());  // "onednn" picks Winograd for some
  for (const ConvDesc& d : descs) {
    auto op = direct->make_conv(d);
    const std::string impls = rt::dnn::conv_impls(*op);
    EXPECT_EQ(impls.find("ref"), std::string::npos) << d.name << ": " << impls;
  }
}

// The automatic rule's 3x3 layers (stride 1, at least 64 channels in and out) run Winograd: ours
// on 8-channel blocks, oneDNN's own on 16-channel blocks where it has it (AVX-512).
TEST_F(OnednnVsRef, WideThreeByThreeLayersRunWinograd) {
  const ConvDesc d{.name = "conv", .in = {2, 64, 14, 14}, .out_c = 128, .kernel_h = 3, .kernel_w = 3,
                   .pad_h = 1, .pad_w = 1};
  const std::string impls = rt::dnn::conv_impls(*fast_->make_conv(d));
  const bool block16 = fast_->setup_note().find("nChw16c") != std::string::npos;
  if (!block16) EXPECT_EQ(impls, "winograd");
  else if (dnn::native_block() == 16) EXPECT_NE(impls.find("wino_4x3"), std::string::npos) << impls;
  else GTEST_SKIP() << "16-channel blocks without AVX-512: oneDNN has no Winograd here (" << impls << ")";
  // Narrower or strided layers stay direct.
  ConvDesc narrow = d, strided = d;
  narrow.in.c = 32;
  strided.stride_h = strided.stride_w = 2;
  for (const ConvDesc& o : {narrow, strided}) {
    const std::string i = rt::dnn::conv_impls(*fast_->make_conv(o));
    EXPECT_EQ(i.find("wino"), std::string::npos) << o.in.str() << ": " << i;
    EXPECT_NE(i, "winograd") << o.in.str();
  }
}

// ResNeXt-50's grouped 3x3 convolutions at 224x224 (32 groups of 4, 8, 16, 32 channels; the
// first of each stage strided) must run on oneDNN's optimised kernels, not its reference loops.
TEST_F(OnednnVsRef, GroupedConvolutionsOfResNeXtUseOptimisedKernels) {
  struct G { int64_t c, hw, stride; };
  for (const G g : {G{128, 56, 1}, G{256, 56, 2}, G{256, 28, 1}, G{512, 28, 2}, G{512, 14, 1},
                    G{1024, 14, 2}, G{1024, 7, 1}}) {
    const ConvDesc d{.name = "conv2", .in = {2, g.c, g.hw, g.hw}, .out_c = g.c, .kernel_h = 3,
                     .kernel_w = 3, .stride_h = g.stride, .stride_w = g.stride, .pad_h = 1,
                     .pad_w = 1, .groups = 32};
    auto op = fast_->make_conv(d);
    const std::string impls = rt::dnn::conv_impls(*op);
    EXPECT_EQ(impls.find("ref"), std::string::npos)
        << d.in.str() << " stride " << g.stride << ": " << impls;
  }
}

}  // namespace
}  // namespace rt

// The oneDNN backend object: layout conversion, gradient accumulation, op factories, and the
// shared execution plumbing (checked execution, scratchpad, reorders, element-wise loops).
#include "nn/onednn/onednn_backend.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include <oneapi/dnnl/dnnl_debug.h>

#include "nn/onednn/clones.h"
#include "nn/onednn/onednn_common.h"
#include "nn/onednn/winograd.h"

namespace rt {
namespace dnn {

void dnnl_check(dnnl_status_t st, const std::string& layer, const char* what) {
  if (st == dnnl_success) return;
  throw Error(str_cat("layer ", layer, ": oneDNN ", what, " failed: ", dnnl_status2str(st)));
}

// (The ISA values are bit sets, not an order: AVX2 VNNI's is above AVX-512's.)
int native_block() {
  const unsigned isa = unsigned(dnnl::get_effective_cpu_isa()), avx512 = unsigned(dnnl::cpu_isa::avx512_core);
  return (isa & avx512) == avx512 ? 16 : 8;
}

namespace {
// What oneDNN dispatches to on this processor, for the set-up line.
const char* dnnl_cpu_isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "SSE4.1";
    case dnnl::cpu_isa::avx: return "AVX";
    case dnnl::cpu_isa::avx2: return "AVX2";
    case dnnl::cpu_isa::avx2_vnni: return "AVX2 VNNI";
    case dnnl::cpu_isa::avx512_core: return "AVX-512";
    case dnnl::cpu_isa::avx512_core_vnni: return "AVX-512 VNNI";
    case dnnl::cpu_isa::avx512_core_bf16: return "AVX-512 BF16";
    case dnnl::cpu_isa::avx512_core_amx: return "AMX";
    default: return "baseline";
  }
}
}  // namespace

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

Prim::Prim(dnnl::primitive p, const dnnl::primitive_desc_base& pd, Context& ctx) : p_(std::move(p)) {
  memory::desc sd = pd.scratchpad_desc();
  if (sd.get_size() == 0) return;
  ctx.reserve_scratch(sd.get_size());
  scratch_ = Mem(sd, ctx.eng);
  args_.push_back({DNNL_ARG_SCRATCHPAD, scratch_.get()});
}

void Prim::run(Context& ctx, const std::string& layer) {
  if (scratch_) scratch_.bind(ctx.scratch.data());
  dnnl_check(dnnl_primitive_execute(p_.get(), ctx.strm.get(), int(args_.size()), args_.data()), layer,
             "execute");
  dnnl_check(dnnl_stream_wait(ctx.strm.get()), layer, "stream wait");
}

Reorder::Reorder(const memory::desc& from, const memory::desc& to, Context& ctx) {
  dnnl::reorder::primitive_desc pd(ctx.eng, from, ctx.eng, to, user_scratchpad_attr());
  src = Mem(from, ctx.eng);
  dst = Mem(to, ctx.eng);
  prim = Prim(dnnl::reorder(pd), pd, ctx);
  prim.arg(DNNL_ARG_FROM, src).arg(DNNL_ARG_TO, dst);
}

void Reorder::run(Context& ctx, const std::string& layer, const void* from, void* to) {
  src.bind(from);
  dst.bind(to);
  prim.run(ctx, layer);
}

// Element-wise kernels: branch-free bodies so that they vectorise, cloned for AVX2 (the build
// targets baseline x86-64 unless RT_NATIVE), run on contiguous per-thread chunks.

namespace {

// ReLU passes NaN on, as the reference, the GPU kernels and PyTorch do (a diverging run shows in
// its loss, not only in its gradients): !(x <= 0) holds for NaN, and costs what x > 0 did.
RT_CLONES void relu_kernel(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = !(x[i] <= 0.f) ? x[i] : 0.f;
}
RT_CLONES void relu_backward_kernel(const float* y, const float* dy, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = dy[i];
    dx[i] = y[i] > 0.f ? g : 0.f;
  }
}
RT_CLONES void add_kernel(const float* a, const float* b, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
RT_CLONES void add_relu_kernel(const float* a, const float* b, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float s = a[i] + b[i];
    y[i] = !(s <= 0.f) ? s : 0.f;
  }
}
RT_CLONES void accumulate_kernel(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

// Calls f(begin, end) on contiguous 64-byte aligned shares of [0, n), one per thread; small n
// is not worth waking the thread team for.
template <class F>
void parallel_chunks(size_t n, F&& f) {
  constexpr size_t kParallelMin = 1 << 15;
  if (n < kParallelMin) {
    f(size_t(0), n);
    return;
  }
#pragma omp parallel
  {
    const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
    const size_t per = (n / nt + 15) / 16 * 16;
    const size_t b = std::min(n, t * per), e = t + 1 == nt ? n : std::min(n, b + per);
    if (b < e) f(b, e);
  }
}

}  // namespace

void relu_forward(const float* x, float* y, size_t n) {
  parallel_chunks(n, [&](size_t b, size_t e) { relu_kernel(x + b, y + b, e - b); });
}

void relu_backward(const float* y, const float* dy, float* dx, size_t n) {
  parallel_chunks(n, [&](size_t b, size_t e) { relu_backward_kernel(y + b, dy + b, dx + b, e - b); });
}

void add_forward(const float* a, const float* b, float* y, size_t n, bool relu) {
  parallel_chunks(n, [&](size_t i, size_t e) {
    relu ? add_relu_kernel(a + i, b + i, y + i, e - i) : add_kernel(a + i, b + i, y + i, e - i);
  });
}

namespace {

// nChw<B>c <-> NCHW: blocked[n][cb][hw][B] = nchw[n][cb*B + k][hw].
template <int B>
void import_blocked(const float* nchw, const Shape& s, float* dst) {
  const int64_t cb_n = s.c / B, hw = s.h * s.w;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t cb = 0; cb < cb_n; ++cb) {
      const float* src = nchw + (n * s.c + cb * B) * hw;
      float* out = dst + (n * cb_n + cb) * hw * B;
      for (int64_t p = 0; p < hw; ++p)
        for (int64_t k = 0; k < B; ++k) out[p * B + k] = src[k * hw + p];
    }
}
template <int B>
void export_blocked(const float* src, const Shape& s, float* nchw) {
  const int64_t cb_n = s.c / B, hw = s.h * s.w;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t cb = 0; cb < cb_n; ++cb) {
      const float* in = src + (n * cb_n + cb) * hw * B;
      float* out = nchw + (n * s.c + cb * B) * hw;
      for (int64_t k = 0; k < B; ++k)
        for (int64_t p = 0; p < hw; ++p) out[k * hw + p] = in[p * B + k];
    }
}

class OnednnBackend final : public Backend<float> {
 public:
  OnednnBackend(std::string name, ConvAlgo algo, int block)
      : ctx_(std::make_shared<Context>(block)), name_(std::move(name)), algo_(algo) {}
  std::string name() const override { return name_; }
  std::string setup_note() const override {
    return str_cat("oneDNN activations in nChw", ctx_->block, "c (", dnnl_cpu_isa_name(), ")");
  }

  size_t act_size(const Shape& s) const override { return size_t(s.numel()); }

  void act_import(const float* nchw, const Shape& s, float* dst) const override {
    if (!act_blocked(s, ctx_->block)) std::memcpy(dst, nchw, sizeof(float) * size_t(s.numel()));
    else if (ctx_->block == 16) import_blocked<16>(nchw, s, dst);
    else import_blocked<8>(nchw, s, dst);
  }

  void act_export(const float* src, const Shape& s, float* nchw) const override {
    if (!act_blocked(s, ctx_->block)) std::memcpy(nchw, src, sizeof(float) * size_t(s.numel()));
    else if (ctx_->block == 16) export_blocked<16>(src, s, nchw);
    else export_blocked<8>(src, s, nchw);
  }

  void accumulate(float* y, const float* x, size_t n) const override {
    parallel_chunks(n, [&](size_t b, size_t e) { accumulate_kernel(y + b, x + b, e - b); });
  }

  std::unique_ptr<ConvOp<float>> make_conv(const ConvDesc& d) override {
    d.validate();
    return make_conv_op(ctx_, d, algo_);
  }
  std::unique_ptr<BatchNormOp<float>> make_batchnorm(const BatchNormDesc& d) override {
    d.validate();
    return make_batchnorm_op(ctx_, d);
  }
  std::unique_ptr<ReluOp<float>> make_relu(const ReluDesc& d) override { return make_relu_op(ctx_, d); }
  std::unique_ptr<MaxPoolOp<float>> make_maxpool(const MaxPoolDesc& d) override {
    d.validate();
    return make_maxpool_op(ctx_, d);
  }
  std::unique_ptr<AvgPoolOp<float>> make_avgpool(const AvgPoolDesc& d) override {
    d.validate();
    return make_avgpool_op(ctx_, d);
  }
  std::unique_ptr<GlobalAvgPoolOp<float>> make_global_avgpool(const GlobalAvgPoolDesc& d) override {
    return make_global_avgpool_op(ctx_, d);
  }
  std::unique_ptr<LinearOp<float>> make_linear(const LinearDesc& d) override {
    d.validate();
    return make_linear_op(ctx_, d);
  }
  std::unique_ptr<AddOp<float>> make_add(const AddDesc& d) override { return make_add_op(ctx_, d); }
  std::unique_ptr<PadShortcutOp<float>> make_pad_shortcut(const PadShortcutDesc& d) override {
    d.validate();
    return make_pad_shortcut_op(ctx_, d);
  }
  std::unique_ptr<SoftmaxXentOp<float>> make_softmax_xent(const SoftmaxXentDesc& d) override {
    d.validate();
    return make_softmax_xent_op(ctx_, d);
  }
  std::unique_ptr<ChannelGateOp<float>> make_channel_gate(const ChannelGateDesc& d) override {
    return make_channel_gate_op(ctx_, d);
  }

 private:
  ContextPtr ctx_;
  std::string name_;
  ConvAlgo algo_;
};

}  // namespace
}  // namespace dnn

std::unique_ptr<Backend<float>> make_onednn_backend(const std::string& name, int block) {
  dnn::ConvAlgo algo;
  if (name == "onednn" || name == "cpu") algo = dnn::ConvAlgo::automatic;
  else if (name == "onednn-direct") algo = dnn::ConvAlgo::direct;
  else if (name == "onednn-winograd") algo = dnn::ConvAlgo::winograd;
  else return nullptr;
  if (block != 0 && block != 8 && block != 16)
    throw Error(str_cat("backend ", name, ": the activation channel block must be 8 or 16 (0: the processor's), got ",
                        block));
  if (algo == dnn::ConvAlgo::winograd) {  // its kernels read 8-channel blocks
    if (block == 16) throw Error("backend onednn-winograd: Winograd convolutions need 8-channel blocks, not 16");
    block = 8;
  }
  return std::make_unique<dnn::OnednnBackend>(name, algo, block ? block : dnn::native_block());
}

}  // namespace rt

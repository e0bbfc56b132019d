// Shape validation of layer descriptions and the backend registry.
#include "nn/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#ifndef RT_NO_ONEDNN  // GPU-only builds (RT_GPU_ONLY) have no oneDNN
#include "nn/onednn/onednn_backend.h"
#endif
#include "nn/ref/ref_backend.h"

#include <map>
#include <mutex>

namespace rt {

void ConvDesc::validate() const {
  RT_SHAPE_CHECK(in.numel() > 0 && out_c > 0, "layer ", name, ": convolution needs a non-empty input ",
                 in.str(), " and out_c > 0 (got ", out_c, ")");
  RT_SHAPE_CHECK(kernel_h > 0 && kernel_w > 0 && stride_h > 0 && stride_w > 0 && pad_h >= 0 && pad_w >= 0,
                 "layer ", name, ": bad convolution geometry kernel ", kernel_h, "x", kernel_w,
                 " stride ", stride_h, "x", stride_w, " pad ", pad_h, "x", pad_w);
  RT_SHAPE_CHECK(kernel_h <= in.h + 2 * pad_h && kernel_w <= in.w + 2 * pad_w, "layer ", name,
                 ": kernel ", kernel_h, "x", kernel_w, " is larger than the padded input ",
                 in.h + 2 * pad_h, "x", in.w + 2 * pad_w, " (input ", in.str(), ", pad ", pad_h, "x",
                 pad_w, ")");
  RT_SHAPE_CHECK(groups > 0 && in.c % groups == 0 && out_c % groups == 0, "layer ", name,
                 ": ", groups, " groups must divide the input's ", in.c, " and the output's ", out_c,
                 " channels");
}

void BatchNormDesc::validate() const {
  RT_SHAPE_CHECK(in.numel() > 0, "layer ", name, ": batch norm of an empty input ", in.str());
  RT_SHAPE_CHECK(eps > 0 && momentum >= 0 && momentum <= 1, "layer ", name,
                 ": batch norm needs eps > 0 and momentum in [0, 1] (got eps ", eps, ", momentum ",
                 momentum, ")");
}

void MaxPoolDesc::validate() const {
  RT_SHAPE_CHECK(in.numel() > 0 && kernel > 0 && stride > 0 && pad >= 0 && pad < kernel, "layer ",
                 name, ": bad max pool kernel ", kernel, " stride ", stride, " pad ", pad,
                 " for input ", in.str());
  RT_SHAPE_CHECK(kernel <= in.h + 2 * pad && kernel <= in.w + 2 * pad, "layer ", name,
                 ": max pool kernel ", kernel, " is larger than the padded input ", in.str(),
                 " (pad ", pad, ")");
}

void ChannelConvDesc::validate() const {
  RT_SHAPE_CHECK(in.numel() > 0 && in.h == 1 && in.w == 1, "layer ", name,
                 ": a channel convolution takes an (n, c, 1, 1) tensor, got ", in.str());
  RT_SHAPE_CHECK(kernel > 0 && kernel % 2 == 1, "layer ", name, ": channel convolution kernel ", kernel,
                 " must be odd and positive");
}

void AvgPoolDesc::validate() const {
  RT_SHAPE_CHECK(in.numel() > 0 && kernel > 0 && stride > 0 && pad >= 0 && 2 * pad <= kernel, "layer ",
                 name, ": bad average pool kernel ", kernel, " stride ", stride, " pad ", pad,
                 " for input ", in.str(), " (PyTorch's rule: pad at most half the kernel)");
  RT_SHAPE_CHECK(kernel <= in.h + 2 * pad && kernel <= in.w + 2 * pad, "layer ", name,
                 ": average pool kernel ", kernel, " is larger than the padded input ", in.str(),
                 " (pad ", pad, ")");
}

void LinearDesc::validate() const {
  RT_SHAPE_CHECK(in.numel() > 0 && out_features > 0, "layer ", name,
                 ": fully connected layer needs a non-empty input ", in.str(),
                 " and out_features > 0 (got ", out_features, ")");
}

void PadShortcutDesc::validate() const {
  RT_SHAPE_CHECK(in.numel() > 0 && stride > 0 && out_c >= in.c, "layer ", name,
                 ": zero-padded shortcut from ", in.str(), " to ", out_c,
                 " channels with stride ", stride, " is impossible");
}

void SoftmaxXentDesc::validate() const {
  RT_SHAPE_CHECK(in.n > 0 && in.c > 0 && in.h == 1 && in.w == 1, "layer ", name,
                 ": softmax cross-entropy needs logits (n, classes, 1, 1) with classes > 0, got ",
                 in.str());
  RT_SHAPE_CHECK(loss.label_smoothing >= 0 && loss.label_smoothing < 1, "layer ", name,
                 ": label smoothing must be in [0, 1), got ", loss.label_smoothing);
  RT_SHAPE_CHECK(loss.kind == LossKind::softmax || loss.kind == LossKind::bce, "layer ", name,
                 ": unknown loss kind ", int(loss.kind));
  RT_SHAPE_CHECK(loss.bce_threshold < 1, "layer ", name, ": a BCE target threshold must be below 1, got ",
                 loss.bce_threshold);
}

void DropPathDesc::validate() const {
  RT_SHAPE_CHECK(in.numel() > 0, "layer ", name, ": drop path needs a non-empty input, got ", in.str());
}

void ChannelGateDesc::validate() const {
  RT_SHAPE_CHECK(in.numel() > 0, "layer ", name, ": channel gate needs a non-empty input, got ", in.str());
}

const char* loss_kind_name(LossKind k) { return k == LossKind::bce ? "bce" : "cross_entropy"; }

void SoftmaxXentDesc::check_mix(const Targets& t) const {
  if (!t.labels) throw Error(str_cat("layer ", name, ": the loss needs labels"));
  if (t.mixed && !(t.mix >= 0 && t.mix <= 1))
    throw Error(str_cat("layer ", name, ": blend weight ", t.mix, " is outside [0, 1]"));
}

void SoftmaxXentDesc::check_targets(const Targets& t) const {
  check_mix(t);
  for (const int32_t* labels : {t.labels, t.mixed})
    for (int64_t i = 0; labels && i < in.n; ++i)
      if (labels[i] < 0 || labels[i] >= in.c)
        throw Error(str_cat("layer ", name, ": ", labels == t.mixed ? "mixed-in label " : "label ", labels[i],
                            " at batch index ", i, " is outside [0, ", in.c, ") for logits ", in.str()));
}

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
};
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

// The default DropPathOp: host loops over each sample's share of the backend's layout.
template <class T>
class HostDropPath final : public DropPathOp<T> {
 public:
  HostDropPath(const DropPathDesc& d, size_t per_sample)
      : per_sample_(per_sample), scales_(size_t(d.in.n), 1.0f) {}
  void forward(const T* x, const float* scales, T* y) override {
    if (scales) std::copy(scales, scales + scales_.size(), scales_.begin());
    else std::fill(scales_.begin(), scales_.end(), 1.0f);
    apply(x, y);
  }
  void backward(const T* dy, T* dx) override { apply(dy, dx); }

 private:
  // Each element alone: the same bits for any thread count.
  void apply(const T* x, T* y) const {
    const int64_t samples = int64_t(scales_.size()), per = int64_t(per_sample_);
#pragma omp parallel for collapse(2) schedule(static) if (samples * per > (1 << 15))
    for (int64_t n = 0; n < samples; ++n)
      for (int64_t c = 0; c < per; c += 4096) {
        const T s = T(scales_[size_t(n)]);
        for (int64_t i = n * per + c, e = n * per + std::min(per, c + 4096); i < e; ++i) y[i] = x[i] * s;
      }
  }
  size_t per_sample_;
  std::vector<float> scales_;  // the last forward's
};

template <class T>
std::unique_ptr<DropPathOp<T>> Backend<T>::make_drop_path(const DropPathDesc& d) {
  d.validate();
  if (const MemorySpace* m = act_memory(); m && !m->host_accessible())
    throw Error(str_cat("layer ", d.name, ": backend ", name(), " has no drop path (stochastic depth)"));
  return std::make_unique<HostDropPath<T>>(d, act_size(d.in) / size_t(d.in.n));
}

// The default ChannelConvOp: host loops over the rows, each sum in double in tap order (dw's over
// the rows, then the channels, in order): the same bits for any thread count.
template <class T>
class HostChannelConv final : public ChannelConvOp<T> {
 public:
  explicit HostChannelConv(const ChannelConvDesc& d) : n_(d.in.n), c_(d.in.c), k_(d.kernel) {}
  void forward(const T* x, const T* w, const T*, T* y) override { mix(x, w, y, 1); }
  void backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T*) override {
    if (dx) mix(dy, w, dx, -1);  // the transpose: the kernel reversed
    const int64_t p = (k_ - 1) / 2;
    for (int64_t j = 0; j < k_; ++j) {
      double s = 0;
      for (int64_t n = 0; n < n_; ++n)
        for (int64_t i = std::max<int64_t>(0, p - j); i < std::min(c_, c_ + p - j); ++i)
          s += double(dy[n * c_ + i]) * double(x[n * c_ + i + j - p]);
      dw[j] = T(s);
    }
  }

 private:
  // out[i] = sum_j w[j] in[i + dir (j - p)]: forward (dir 1), or dx from dy (dir -1).
  void mix(const T* in, const T* w, T* out, int dir) const {
    const int64_t p = (k_ - 1) / 2;
#pragma omp parallel for schedule(static) if (n_ * c_ > (1 << 15))
    for (int64_t n = 0; n < n_; ++n)
      for (int64_t i = 0; i < c_; ++i) {
        double s = 0;
        for (int64_t j = 0; j < k_; ++j) {
          const int64_t src = i + dir * (j - p);
          if (src >= 0 && src < c_) s += double(w[j]) * double(in[n * c_ + src]);
        }
        out[n * c_ + i] = T(s);
      }
  }
  int64_t n_, c_, k_;
};

template <class T>
std::unique_ptr<ChannelConvOp<T>> Backend<T>::make_channel_conv(const ChannelConvDesc& d) {
  d.validate();
  if (const MemorySpace* m = act_memory(); m && !m->host_accessible())
    throw Error(str_cat("layer ", d.name, ": backend ", name(), " has no channel convolution (ECA)"));
  return std::make_unique<HostChannelConv<T>>(d);
}

template <class T>
std::unique_ptr<AvgPoolOp<T>> Backend<T>::make_avgpool(const AvgPoolDesc& d) {
  throw Error(str_cat("layer ", d.name, ": backend ", name(), " has no average pooling (ResNet-D's shortcut)"));
}

template <class T>
std::unique_ptr<ChannelGateOp<T>> Backend<T>::make_channel_gate(const ChannelGateDesc& d) {
  throw Error(str_cat("layer ", d.name, ": backend ", name(),
                      " has no channel gate (squeeze-and-excitation)"));
}

template <class T>
std::unique_ptr<Optimizer<T>> Backend<T>::make_sgd(std::vector<ParamInfo> layout, SgdConfig cfg) {
  auto host = make_host_optimizer<T>(std::move(layout), cfg);
  if (const MemorySpace* m = param_memory(); m && !m->host_accessible())
    return std::make_unique<StagedOptimizer<T>>(std::move(host), *m);
  return host;
}

template <class T>
size_t Backend<T>::scale_count_nonfinite(T* v, size_t n, float s, bool count) {
  if (const MemorySpace* m = param_memory(); m && !m->host_accessible()) {
    // A backend without a device pass of its own: through a host copy (allocates; a slow path).
    std::vector<T> host(n);
    m->to_host(host.data(), v, n * sizeof(T));
    const size_t bad = scale_count_host(host.data(), n, s, count);
    if (s != 1.0f) m->from_host(v, host.data(), n * sizeof(T));
    return bad;
  }
  return scale_count_host(v, n, s, count);
}

template <class T>
size_t Backend<T>::scale_count_host(T* v, size_t n, float s, bool count) {
  if (s != 1.0f)
    for (size_t i = 0; i < n; ++i) v[i] *= T(s);
  if (!count) return 0;
  // On the bits (an all-ones exponent is inf or NaN): integer work the compiler vectorises.
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr Bits exp = sizeof(T) == 4 ? Bits(0x7f800000u) : Bits(0x7ff0000000000000ull);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, v + i, sizeof b);
    bad += (b & exp) == exp;
  }
  return bad;
}

template <class T>
void Backend<T>::ema_update(T* avg, const T* x, size_t n, T w) const {
  if (const MemorySpace* m = param_memory(); m && !m->host_accessible()) {
    // A backend without a device pass of its own: through host copies (allocates; a slow path).
    std::vector<T> a(n), b(n);
    m->to_host(a.data(), avg, n * sizeof(T));
    m->to_host(b.data(), x, n * sizeof(T));
    ema_update_host(a.data(), b.data(), n, w);
    m->from_host(avg, a.data(), n * sizeof(T));
    return;
  }
  ema_update_host(avg, x, n, w);
}

template <class T>
void Backend<T>::ema_update_host(T* avg, const T* x, size_t n, T w) {
  // std::fma is a library call per element where the build has no FMA instructions
  // (-DRT_NATIVE=ON gives them): ResNet-50's 25.6M weights take ~50 ms on one core here, ~26 ms
  // on two, beside seconds of forward and backward.
#pragma omp parallel for schedule(static) if (n > (size_t(1) << 16))
  for (size_t i = 0; i < n; ++i) avg[i] = std::fma(w, x[i] - avg[i], avg[i]);
}

template <class T>
double Backend<T>::sum_squares(const T* v, size_t n) const {
  if (const MemorySpace* m = param_memory(); m && !m->host_accessible()) {
    std::vector<T> host(n);  // a backend without a device pass of its own (allocates; a slow path)
    m->to_host(host.data(), v, n * sizeof(T));
    return sum_squares_host(host.data(), n);
  }
  return sum_squares_host(v, n);
}

template <class T>
double Backend<T>::sum_squares_host(const T* v, size_t n) {
  const size_t chunks = (n + kSquaresChunk - 1) / kSquaresChunk;
  std::vector<double> part(chunks);  // ResNet-50's gradients: 6,250 of them
#pragma omp parallel for schedule(static) if (chunks > 16)
  for (size_t c = 0; c < chunks; ++c)
    part[c] = warp_order_squares<T, 1>({v + c * kSquaresChunk}, std::min(kSquaresChunk, n - c * kSquaresChunk))[0];
  double sum = 0;
  for (double p : part) sum += p;
  return sum;
}

template <class T>
void Backend<T>::act_import_u8(const uint8_t* nhwc, const Shape& s, const NormParams& p, T* dst) const {
  RT_SHAPE_CHECK(s.c == 3, "8-bit input needs 3 channels (RGB), got shape ", s.str());
  u8_scratch_.resize(size_t(s.numel()));  // the input shape is fixed: allocates on the first call only
  normalize_u8_nchw(nhwc, s.n, s.h, s.w, norm_table(p), u8_scratch_.data());
  act_import(u8_scratch_.data(), s, dst);
}

template class Backend<float>;
template class Backend<double>;

template <class T>
void BatchNormOp<T>::forward_train_add(const T*, const T*, const T*, const T*, T*, T*, T*) {
  throw Error("batch norm with a residual add: not fused by this backend (Backend::fuses_bn_add)");
}
template <class T>
void BatchNormOp<T>::forward_eval_add(const T*, const T*, const T*, const T*, const T*, const T*, T*) {
  throw Error("batch norm with a residual add: not fused by this backend (Backend::fuses_bn_add)");
}
template <class T>
void BatchNormOp<T>::backward_add_relu(const T*, const T*, const T*, T*, T*, T*, T*) {
  throw Error("batch norm with a residual add: this backend's op does not mask the add's ReLU (masks_add_relu)");
}
template class BatchNormOp<float>;
template class BatchNormOp<double>;

void register_backend(const std::string& name, BackendFactory make) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.factories[name] = make;
}

bool backend_registered(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.factories.count(name) != 0;
}

template <>
std::unique_ptr<Backend<float>> make_backend<float>(const std::string& name, const BackendOptions& options) {
  if (name == "reference") return make_reference_backend<float>();
#ifndef RT_NO_ONEDNN
  if (auto be = make_onednn_backend(name, options.onednn_block)) return be;
#endif
  BackendFactory make = nullptr;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    if (auto it = r.factories.find(name); it != r.factories.end()) make = it->second;
  }
  if (make) return make(options);
  if (name == "cuda" || name == "cuda-tf32" || name == "cuda-bf16" || name == "cuda-fp16") {
#ifdef RT_HAVE_CUDA
    throw Error("backend '" + name + "' is not linked into this program: run its _cuda build "
                "(build/bin/trainer_cuda, build/bin/bench_train_step_cuda), which links rt_cuda "
                "and calls rt::cuda::register_backend()");
#else
    throw Error("backend '" + name + "' is not available: ringtrain was built without CUDA");
#endif
  }
  throw Error("unknown backend '" + name +
              "' (known: reference, onednn or cpu, onednn-direct, onednn-winograd, cuda, cuda-tf32, "
              "cuda-bf16, cuda-fp16)");
}

template <>
std::unique_ptr<Backend<double>> make_backend<double>(const std::string& name, const BackendOptions&) {
  if (name == "reference") return make_reference_backend<double>();
  throw Error("backend '" + name + "' has no double precision (only 'reference' does)");
}

}  // namespace rt

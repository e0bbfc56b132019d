// The reference backend: plain NCHW activations and the loop implementations of every op.
#include "nn/ref/ref_backend.h"

#include <cstring>

#include "nn/ref/ref_ops.h"

namespace rt {
namespace {

template <class T>
class ReferenceBackend final : public Backend<T> {
 public:
  std::string name() const override { return "reference"; }
  size_t act_size(const Shape& s) const override { return size_t(s.numel()); }
  void act_import(const T* nchw, const Shape& s, T* dst) const override {
    if (s.numel() > 0 && dst != nchw) std::memmove(dst, nchw, size_t(s.numel()) * sizeof(T));
  }
  void act_export(const T* src, const Shape& s, T* nchw) const override {
    if (s.numel() > 0 && src != nchw) std::memmove(nchw, src, size_t(s.numel()) * sizeof(T));
  }
  void accumulate(T* y, const T* x, size_t n) const override {
    for (size_t i = 0; i < n; ++i) y[i] += x[i];
  }

  std::unique_ptr<ConvOp<T>> make_conv(const ConvDesc& d) override { return ref::make_conv<T>(d); }
  std::unique_ptr<BatchNormOp<T>> make_batchnorm(const BatchNormDesc& d) override {
    return ref::make_batchnorm<T>(d);
  }
  std::unique_ptr<ReluOp<T>> make_relu(const ReluDesc& d) override { return ref::make_relu<T>(d); }
  std::unique_ptr<MaxPoolOp<T>> make_maxpool(const MaxPoolDesc& d) override {
    return ref::make_maxpool<T>(d);
  }
  std::unique_ptr<AvgPoolOp<T>> make_avgpool(const AvgPoolDesc& d) override { return ref::make_avgpool<T>(d); }
  std::unique_ptr<GlobalAvgPoolOp<T>> make_global_avgpool(const GlobalAvgPoolDesc& d) override {
    return ref::make_global_avgpool<T>(d);
  }
  std::unique_ptr<LinearOp<T>> make_linear(const LinearDesc& d) override {
    return ref::make_linear<T>(d);
  }
  std::unique_ptr<AddOp<T>> make_add(const AddDesc& d) override { return ref::make_add<T>(d); }
  std::unique_ptr<PadShortcutOp<T>> make_pad_shortcut(const PadShortcutDesc& d) override {
    return ref::make_pad_shortcut<T>(d);
  }
  std::unique_ptr<SoftmaxXentOp<T>> make_softmax_xent(const SoftmaxXentDesc& d) override {
    return ref::make_softmax_xent<T>(d);
  }
  std::unique_ptr<ChannelGateOp<T>> make_channel_gate(const ChannelGateDesc& d) override {
    return ref::make_channel_gate<T>(d);
  }
};

}  // namespace

template <class T>
std::unique_ptr<Backend<T>> make_reference_backend() {
  return std::make_unique<ReferenceBackend<T>>();
}

template std::unique_ptr<Backend<float>> make_reference_backend<float>();
template std::unique_ptr<Backend<double>> make_reference_backend<double>();

}  // namespace rt

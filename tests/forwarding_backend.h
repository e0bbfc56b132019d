// A Backend that hands its required calls (the layouts, copies and op factories) to another, the
// reference by default: test backends derive from it and override only what they change. The
// calls with a default in Backend keep that default, as they would in a real backend (the
// default act_import_u8, for one, then goes through the derived act_import); accumulate_arena,
// the inner backend's arena arithmetic, is forwarded too.
#pragma once
#include <memory>
#include <string>
#include <utility>

#include "nn/ops.h"

namespace rt::test {

template <class T>
class ForwardingBackend : public Backend<T> {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend<T>> in = make_backend<T>("reference"))
      : in_(std::move(in)) {}
  std::string name() const override { return "forwarding-" + in_->name(); }
  size_t act_size(const Shape& s) const override { return in_->act_size(s); }
  void act_import(const T* x, const Shape& s, T* d) const override { in_->act_import(x, s, d); }
  void act_export(const T* x, const Shape& s, T* d) const override { in_->act_export(x, s, d); }
  void accumulate(T* y, const T* x, size_t n) const override { in_->accumulate(y, x, n); }
  void accumulate_arena(T* y, const T* x, size_t n) const override { in_->accumulate_arena(y, x, n); }
  std::unique_ptr<ConvOp<T>> make_conv(const ConvDesc& d) override { return in_->make_conv(d); }
  std::unique_ptr<BatchNormOp<T>> make_batchnorm(const BatchNormDesc& d) override {
    return in_->make_batchnorm(d);
  }
  std::unique_ptr<ReluOp<T>> make_relu(const ReluDesc& d) override { return in_->make_relu(d); }
  std::unique_ptr<MaxPoolOp<T>> make_maxpool(const MaxPoolDesc& d) override { return in_->make_maxpool(d); }
  std::unique_ptr<GlobalAvgPoolOp<T>> make_global_avgpool(const GlobalAvgPoolDesc& d) override {
    return in_->make_global_avgpool(d);
  }
  std::unique_ptr<AvgPoolOp<T>> make_avgpool(const AvgPoolDesc& d) override { return in_->make_avgpool(d); }
  std::unique_ptr<LinearOp<T>> make_linear(const LinearDesc& d) override { return in_->make_linear(d); }
  std::unique_ptr<AddOp<T>> make_add(const AddDesc& d) override { return in_->make_add(d); }
  std::unique_ptr<PadShortcutOp<T>> make_pad_shortcut(const PadShortcutDesc& d) override {
    return in_->make_pad_shortcut(d);
  }
  std::unique_ptr<SoftmaxXentOp<T>> make_softmax_xent(const SoftmaxXentDesc& d) override {
    return in_->make_softmax_xent(d);
  }
  std::unique_ptr<ChannelGateOp<T>> make_channel_gate(const ChannelGateDesc& d) override {
    return in_->make_channel_gate(d);
  }
  std::unique_ptr<ChannelConvOp<T>> make_channel_conv(const ChannelConvDesc& d) override {
    return in_->make_channel_conv(d);
  }

 protected:
  const Backend<T>& inner() const { return *in_; }

 private:
  std::unique_ptr<Backend<T>> in_;
};

}  // namespace rt::test

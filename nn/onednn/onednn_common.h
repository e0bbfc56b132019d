// Shared pieces of the oneDNN backend: the activation layout rule, the engine/stream context,
// memory objects rebound without reallocation, and allocation-free primitive execution.
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/ops.h"

namespace rt::dnn {

using dnnl::memory;
using Tag = memory::format_tag;
using Dims = memory::dims;

// Activation layout, a function of the logical shape and of the backend's channel block only,
// so that producer and consumer agree without negotiation. Channel-blocked nChw8c or nChw16c
// (the native convolution layouts of oneDNN's AVX2 and AVX-512 kernels: on an AVX-512 core the
// 16-channel blocks run its convolutions 1.8x as fast) when C is a multiple of the block and
// there is spatial extent; plain NCHW otherwise (network input with C=3, other channel counts,
// and (n, c, 1, 1) vectors such as pooled features and logits). No layout ever has padded
// channels, so no op has to keep padding zero.
inline bool act_blocked(const Shape& s, int block) { return s.c % block == 0 && s.h * s.w > 1; }
inline Tag act_tag(const Shape& s, int block) {
  return !act_blocked(s, block) ? Tag::nchw : block == 16 ? Tag::nChw16c : Tag::nChw8c;
}
inline memory::desc act_md(const Shape& s, int block) {
  return memory::desc({s.n, s.c, s.h, s.w}, memory::data_type::f32, act_tag(s, block));
}
inline memory::desc vec_md(int64_t n) { return memory::desc({n}, memory::data_type::f32, Tag::x); }

// Element offset of logical (n, c, h, w) in the layout of s.
struct ActIndex {
  ActIndex(const Shape& s, int block) : s_(s), b_(act_blocked(s, block) ? block : 0) {}
  int64_t operator()(int64_t n, int64_t c, int64_t h, int64_t w) const {
    if (!b_) return ((n * s_.c + c) * s_.h + h) * s_.w + w;
    return (((n * (s_.c / b_) + c / b_) * s_.h + h) * s_.w + w) * b_ + c % b_;
  }
  Shape s_;
  int64_t b_;  // 0: plain
};

// The channel block a backend uses when not told: 16 where oneDNN dispatches AVX-512 kernels,
// else 8.
int native_block();

// Engine, stream, and the buffers shared by all ops of one backend (ops of one backend never run
// concurrently, so one buffer sized for the hungriest user serves all of them): the primitives'
// scratchpad, the staging area for weights in a primitive's layout, and two for activations
// copied into another layout for one primitive call.
struct Context {
  explicit Context(int block) : block(block) {}
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  const int block;  // channels per block of the activation layout: 8 or 16 (act_tag)
  Buffer<float> scratch, weights, stage[2];
  void reserve_scratch(size_t bytes) { grow(scratch, bytes); }
  void reserve_weights(size_t bytes) { grow(weights, bytes); }
  void reserve_stage(int slot, size_t bytes) { grow(stage[slot], bytes); }

 private:
  static void grow(Buffer<float>& b, size_t bytes) {
    size_t n = (bytes + sizeof(float) - 1) / sizeof(float);
    if (n > b.size()) b.resize(n);
  }
};
using ContextPtr = std::shared_ptr<Context>;

// Throws rt::Error naming the layer when a oneDNN call fails.
void dnnl_check(dnnl_status_t st, const std::string& layer, const char* what);

// A memory object whose data pointer is rebound only when the caller's pointer changes
// (activation buffers are usually fixed, so steady-state steps rebind nothing).
class Mem {
 public:
  Mem() = default;
  Mem(const memory::desc& md, const dnnl::engine& eng) : m_(md, eng, DNNL_MEMORY_NONE) {}
  Mem(const memory::desc& md, const dnnl::engine& eng, void* p) : m_(md, eng, p), cur_(p) {}
  void bind(const void* p) {
    if (p != cur_) {
      m_.set_data_handle(const_cast<void*>(p));
      cur_ = p;
    }
  }
  dnnl_memory_t get() const { return m_.get(); }
  memory::desc desc() const { return m_.get_desc(); }
  explicit operator bool() const { return bool(m_); }

 private:
  memory m_;
  const void* cur_ = nullptr;
};

// A primitive with its argument list built once; run() goes through the C API so that no
// std::unordered_map is built per call. The scratchpad (Context::scratch, which may move while
// later layers are set up) is rebound on each run.
class Prim {
 public:
  Prim() = default;
  Prim(dnnl::primitive p, const dnnl::primitive_desc_base& pd, Context& ctx);
  Prim& arg(int kind, const Mem& m) {
    args_.push_back({kind, m.get()});
    return *this;
  }
  void run(Context& ctx, const std::string& layer);
  explicit operator bool() const { return bool(p_); }

 private:
  dnnl::primitive p_;
  Mem scratch_;
  std::vector<dnnl_exec_arg_t> args_;
};

// Primitive attributes used everywhere: the scratchpad is ours (Context::scratch).
dnnl::primitive_attr user_scratchpad_attr();

// Reorder between two descs, set up once (src and dst memories rebound per call).
struct Reorder {
  Mem src, dst;
  Prim prim;
  Reorder() = default;
  Reorder(const memory::desc& from, const memory::desc& to, Context& ctx);
  void run(Context& ctx, const std::string& layer, const void* from, void* to);
};

// Element-wise helpers over n contiguous floats (OpenMP, vectorised).
void relu_forward(const float* x, float* y, size_t n);
void relu_backward(const float* y, const float* dy, float* dx, size_t n);
void add_forward(const float* a, const float* b, float* y, size_t n, bool relu);

// Op factories, one per file. Convolution: oneDNN direct, or Winograd (winograd.h) where algo
// and the layer allow it.
enum class ConvAlgo;
std::unique_ptr<ConvOp<float>> make_conv_op(const ContextPtr& ctx, const ConvDesc& d, ConvAlgo algo);
// The oneDNN kernels a convolution op from make_conv_op runs, forward / backward data / backward
// weights, "(plain)" where it runs on plain-layout copies; "winograd" for the Winograd op. For
// tests and benchmarks.
std::string conv_impls(const ConvOp<float>& op);
std::unique_ptr<LinearOp<float>> make_linear_op(const ContextPtr& ctx, const LinearDesc& d);
std::unique_ptr<BatchNormOp<float>> make_batchnorm_op(const ContextPtr& ctx, const BatchNormDesc& d);
std::unique_ptr<MaxPoolOp<float>> make_maxpool_op(const ContextPtr& ctx, const MaxPoolDesc& d);
std::unique_ptr<AvgPoolOp<float>> make_avgpool_op(const ContextPtr& ctx, const AvgPoolDesc& d);
std::unique_ptr<GlobalAvgPoolOp<float>> make_global_avgpool_op(const ContextPtr& ctx,
                                                               const GlobalAvgPoolDesc& d);
std::unique_ptr<ReluOp<float>> make_relu_op(const ContextPtr& ctx, const ReluDesc& d);
std::unique_ptr<AddOp<float>> make_add_op(const ContextPtr& ctx, const AddDesc& d);
std::unique_ptr<PadShortcutOp<float>> make_pad_shortcut_op(const ContextPtr& ctx,
                                                           const PadShortcutDesc& d);
std::unique_ptr<SoftmaxXentOp<float>> make_softmax_xent_op(const ContextPtr& ctx,
                                                           const SoftmaxXentDesc& d);
std::unique_ptr<ChannelGateOp<float>> make_channel_gate_op(const ContextPtr& ctx, const ChannelGateDesc& d);

}  // namespace rt::dnn

// Layer descriptions and the backend interface: every layer is set up once for its shapes, then
// its forward/backward only execute (no allocation in the step).
//
// Conventions shared by every backend:
// - Activations and their gradients are in the backend's own layout for their logical Shape
//   (Backend::act_size elements; Backend::act_import/act_export convert from/to plain NCHW).
// - Parameters live in the model's flat arena in canonical (torchvision) layouts:
//   convolution weights OIHW, linear weights [out][in] with `in` flattened C,H,W; bias, BN gamma,
//   beta, running mean/var are [C]. A backend may keep private reordered copies.
// - backward() overwrites its outputs (dx, dw, ...). Null dx means "not needed" (first layer).
// - Inputs and outputs of one call never alias unless the op documents it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "nn/error.h"
#include "nn/host_memory.h"
#include "nn/normalize.h"
#include "nn/optimizer.h"
#include "nn/tensor.h"

namespace rt {

struct ConvDesc {
  std::string name;
  Shape in;
  int64_t out_c = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  bool bias = false;
  // Grouped convolution (ResNeXt): input and output channels in `groups` equal slices, output
  // slice g computed from input slice g only. Weights [out_c, in.c / groups, kh, kw].
  int64_t groups = 1;
  // False when backward is never asked for dx (Net sets it for a layer reading the network's
  // input): a backend need not prepare for it (the CUDA backends choose no backward-data
  // algorithm, and refuse a dx then).
  bool input_grad = true;
  Shape out() const {
    return {in.n, out_c, (in.h + 2 * pad_h - kernel_h) / stride_h + 1,
            (in.w + 2 * pad_w - kernel_w) / stride_w + 1};
  }
  int64_t in_per_group() const { return in.c / groups; }
  int64_t weight_count() const { return out_c * in_per_group() * kernel_h * kernel_w; }
  void validate() const;  // throws ShapeError naming the layer and shapes
};

// Synchronised batch norm (PyTorch's SyncBatchNorm, NVIDIA's bn_group): training statistics, and
// backward's two sums, taken over the batches of a group of ranks, so that N ranks of batch b
// normalise as one rank of batch N*b would. sum() adds v[0, n) over the group's ranks in place,
// leaving the same bits on every rank of it. A collective: every rank of the group calls it at
// the same layers in the same order. comm/bn_sync.h implements it over MPI; ops only call it.
class BnSync {
 public:
  virtual ~BnSync() = default;
  virtual void sum(double* v, size_t n) = 0;
  virtual int ranks() const = 0;  // the group's size
};

// Batch normalisation over N,H,W per channel (PyTorch semantics: biased variance normalises,
// unbiased variance enters running_var; running = (1 - momentum) * running + momentum * batch).
// relu fuses a ReLU on the output. Training needs more than one value per channel (N*H*W > 1,
// over the group's batches with sync): forward_train throws ShapeError otherwise, as PyTorch does.
struct BatchNormDesc {
  std::string name;
  Shape in;
  double eps = 1e-5;
  double momentum = 0.1;
  bool relu = false;      // applied last: after the residual, when there is one
  bool residual = false;  // y = relu?(bn(x) + r): the forward_*_add calls (Backend::fuses_bn_add)
  // Non-null: forward_train and backward take their sums over sync's group (not owned; outlives
  // the op). Evaluation never synchronises: it uses the running statistics.
  BnSync* sync = nullptr;
  void validate() const;
};

struct ReluDesc {
  std::string name;
  Shape in;
};

struct MaxPoolDesc {
  std::string name;
  Shape in;
  int64_t kernel = 3, stride = 2, pad = 1;
  Shape out() const {
    return {in.n, in.c, (in.h + 2 * pad - kernel) / stride + 1, (in.w + 2 * pad - kernel) / stride + 1};
  }
  void validate() const;
};

// Average pooling over kernel x kernel windows, each averaged over the input elements it covers
// (padding and, with ceil_mode, the part of the last window past the input are not counted:
// PyTorch's count_include_pad=False). ceil_mode rounds the output size up, as PyTorch's, but
// never starts a window in the right padding. ResNet-D's shortcut is kernel 2, stride 2, ceil.
struct AvgPoolDesc {
  std::string name;
  Shape in;
  int64_t kernel = 2, stride = 2, pad = 0;
  bool ceil_mode = true;
  Shape out() const { return {in.n, in.c, out_extent(in.h), out_extent(in.w)}; }
  int64_t out_extent(int64_t len) const {
    const int64_t span = len + 2 * pad - kernel;
    int64_t o = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
    if (ceil_mode && (o - 1) * stride >= len + pad) --o;
    return o;
  }
  void validate() const;
};

struct GlobalAvgPoolDesc {
  std::string name;
  Shape in;
  Shape out() const { return {in.n, in.c, 1, 1}; }
};

// Fully connected: y[n][o] = sum_i x[n][i] w[o][i] + b[o], i over C*H*W of the input.
struct LinearDesc {
  std::string name;
  Shape in;
  int64_t out_features = 0;
  bool bias = true;
  Shape out() const { return {in.n, out_features, 1, 1}; }
  void validate() const;
};

// y = a + b (then ReLU when relu): the join of a residual block.
struct AddDesc {
  std::string name;
  Shape in;
  bool relu = false;
};

// He et al. 2016 CIFAR shortcut "A": y = x subsampled by stride, channels zero-padded to out_c
// with (out_c - in.c) / 2 zero channels before and the rest after (as the torchvision-style
// reference script pads).
struct PadShortcutDesc {
  std::string name;
  Shape in;
  int64_t out_c = 0;
  int64_t stride = 1;
  Shape out() const { return {in.n, out_c, (in.h - 1) / stride + 1, (in.w - 1) / stride + 1}; }
  void validate() const;
};

// Stochastic depth (Huang et al. 2016) on a residual branch: y = s_n x for each sample n, s_n = 0
// (the branch dropped for that sample) or 1 / keep (kept, scaled so that its expectation is x).
struct DropPathDesc {
  std::string name;
  Shape in;
  void validate() const;
};

// The excitation of a squeeze-and-excitation block (Hu et al. 2018): y = x * sigmoid(g), g one
// value per sample and channel, shape (in.n, in.c, 1, 1), scaling each channel of the branch.
// The squeeze (global average pooling) and the two 1x1 convolutions that make g are ops of their
// own.
struct ChannelGateDesc {
  std::string name;
  Shape in;
  Shape gate() const { return {in.n, in.c, 1, 1}; }
  void validate() const;
};

// Efficient channel attention's mixing (Wang et al. 2020, ECA-Net; timm's EcaModule): a 1-D
// convolution across the channels of an (n, c, 1, 1) tensor, one odd kernel of k weights shared
// by every channel and sample, zero padding (k - 1) / 2, no bias:
// y[n][i] = sum_j w[j] x[n][i + j - (k - 1) / 2]. Every backend keeps an (n, c, 1, 1) tensor as n
// rows of c values one after another (in its activation type). The squeeze (global average
// pooling) before it and the gate after it are ops of their own.
struct ChannelConvDesc {
  std::string name;
  Shape in;
  int64_t kernel = 3;
  void validate() const;
};

// What the loss compares the logits with: a class per sample (host memory, in.n of them), or
// (mixup, CutMix) a blend of two, weight `mix` on `labels` and 1 - mix on `mixed`. A plain label
// pointer converts to one; null is no targets (inference).
struct Targets {
  Targets(const int32_t* l = nullptr) : labels(l) {}  // NOLINT: implicit, labels are the usual case
  Targets(const int32_t* l, const int32_t* m, double w) : labels(l), mixed(m), mix(w) {}
  explicit operator bool() const { return labels != nullptr; }
  const int32_t* labels = nullptr;
  const int32_t* mixed = nullptr;  // null: not blended
  double mix = 1.0;                // in [0, 1]
};

// The classifier's loss. Both kinds compare the logits with one target per class,
//   t[n][k] = (1 - eps) (mix [k == label_n] + (1 - mix) [k == mixed_n]) + eps / K
// (label smoothing eps; not blended: mix = 1), a distribution over the K classes.
//   softmax: softmax cross-entropy, mean over the batch: loss_n = -sum_k t[n][k] log p[n][k]
//            with p the row's softmax.
//   bce:     each class a yes/no question of its own (ResNet strikes back's loss, timm's
//            BinaryCrossEntropy): binary cross-entropy of sigmoid(z[n][k]) against t[n][k], mean
//            over batch and classes; with bce_threshold >= 0 each target is first made 1 when above
//            it and 0 otherwise (so both images of a blend count as present).
enum class LossKind : uint8_t { softmax, bce };
const char* loss_kind_name(LossKind k);  // "cross_entropy", "bce"

struct LossSpec {
  LossKind kind = LossKind::softmax;
  double label_smoothing = 0.0;
  double bce_threshold = -1;  // bce only; < 0: soft targets
};

// The loss layer (named for its first kind; loss.kind chooses).
struct SoftmaxXentDesc {
  std::string name;
  Shape in;  // (n, classes, 1, 1)
  LossSpec loss = {};
  void validate() const;
  // t[n][k] above, thresholded for bce: one element, for backends that build targets as they go.
  double target(const Targets& t, int64_t n, int64_t k) const {
    double hot = k == t.labels[n] ? 1.0 : 0.0;
    if (t.mixed) hot = t.mix * hot + (1 - t.mix) * (k == t.mixed[n] ? 1.0 : 0.0);
    return target_of(hot);
  }
  // The same from the blended one-hot part alone (0 for a class neither label names).
  double target_of(double hot) const {
    const double eps = loss.label_smoothing, v = (1 - eps) * hot + eps / double(in.c);
    return loss.kind == LossKind::bce && loss.bce_threshold >= 0 ? (v > loss.bce_threshold ? 1.0 : 0.0) : v;
  }
  // Throws rt::Error naming the layer for targets without labels, a mix outside [0, 1], or
  // (check_targets) a label outside [0, classes).
  void check_mix(const Targets& t) const;
  void check_targets(const Targets& t) const;
};

template <class T>
class ConvOp {
 public:
  virtual ~ConvOp() = default;
  virtual void forward(const T* x, const T* w, const T* b, T* y) = 0;
  // dw and db (when the layer has a bias) are overwritten; dx may be null.
  virtual void backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db) = 0;
  // Where adds_dx(): backward with this layer's input gradient added to what dx holds (cuDNN's
  // beta = 1) rather than written over it. A tensor read by two layers (a residual block's input)
  // then gets its gradient summed inside the second convolution's backward instead of through a
  // scratch buffer and a separate sum: one pass over the tensor instead of three. The default
  // refuses.
  virtual bool adds_dx() const { return false; }
  virtual void backward_add_dx(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db);
};

template <class T>
void ConvOp<T>::backward_add_dx(const T*, const T*, const T*, T*, T*, T*) {
  throw Error("this backend's convolution cannot add its input gradient in place (adds_dx)");
}

template <class T>
class BatchNormOp {
 public:
  virtual ~BatchNormOp() = default;
  // Normalises with batch statistics, remembers them for backward, updates running stats.
  virtual void forward_train(const T* x, const T* gamma, const T* beta, T* y, T* running_mean,
                             T* running_var) = 0;
  virtual void forward_eval(const T* x, const T* gamma, const T* beta, const T* running_mean,
                            const T* running_var, T* y) = 0;
  // After forward_train on the same x. y (that call's output) is read only with a fused ReLU,
  // for its mask, and only where backward_reads_y(): otherwise y is null and the network may
  // reuse y's memory before backward (a ResNet stem's output, which max pooling does not keep:
  // 411 MB at batch 256 in bf16). With
  // desc.residual, dy is the gradient of bn(x) itself (the ReLU after the add is the caller's to
  // mask, as the residual's gradient is the same) and y is not read.
  virtual void backward(const T* x, const T* gamma, const T* y, const T* dy, T* dx, T* dgamma,
                        T* dbeta) = 0;
  // Whether backward needs y for the fused ReLU's mask; false where it recomputes the mask.
  virtual bool backward_reads_y() const { return true; }
  // desc.residual: the forwards with r added, y = relu?(T(bn(x)) + r), the normalised value
  // rounded to the storage type first, so bit for bit a batch norm and then a residual add. Made
  // only by backends whose fuses_bn_add() is true; the defaults refuse.
  virtual void forward_train_add(const T* x, const T* r, const T* gamma, const T* beta, T* y,
                                 T* running_mean, T* running_var);
  virtual void forward_eval_add(const T* x, const T* r, const T* gamma, const T* beta,
                                const T* running_mean, const T* running_var, T* y);
  // desc.residual with desc.relu: whether backward_add_relu does the add's part of backward too.
  // It takes dy, the gradient of the block's output y = relu(T(bn(x)) + r), and masks it by
  // y > 0 in place (dy is then the residual's gradient, as after the add's own backward) in the
  // same pass that sums it, instead of a pass of its own before backward. The default refuses.
  virtual bool masks_add_relu() const { return false; }
  virtual void backward_add_relu(const T* x, const T* gamma, const T* y, T* dy, T* dx, T* dgamma,
                                 T* dbeta);
};

template <class T>
class ReluOp {
 public:
  virtual ~ReluOp() = default;
  virtual void forward(const T* x, T* y) = 0;
  virtual void backward(const T* y, const T* dy, T* dx) = 0;
};

template <class T>
class MaxPoolOp {
 public:
  virtual ~MaxPoolOp() = default;
  virtual void forward(const T* x, T* y, bool train) = 0;
  // After forward(x, y, true) on the same x. Ties go to the first maximum in window order. x and
  // y are null where !backward_reads_xy() (an op that recorded its argmax in forward): the network
  // then need not keep them for backward.
  virtual void backward(const T* x, const T* y, const T* dy, T* dx) = 0;
  virtual bool backward_reads_xy() const { return true; }
};

template <class T>
class AvgPoolOp {
 public:
  virtual ~AvgPoolOp() = default;
  virtual void forward(const T* x, T* y) = 0;
  virtual void backward(const T* dy, T* dx) = 0;
};

template <class T>
class GlobalAvgPoolOp {
 public:
  virtual ~GlobalAvgPoolOp() = default;
  virtual void forward(const T* x, T* y) = 0;
  virtual void backward(const T* dy, T* dx) = 0;
};

template <class T>
class LinearOp {
 public:
  virtual ~LinearOp() = default;
  virtual void forward(const T* x, const T* w, const T* b, T* y) = 0;
  virtual void backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db) = 0;
};

template <class T>
class AddOp {
 public:
  virtual ~AddOp() = default;
  virtual void forward(const T* a, const T* b, T* y) = 0;
  // The gradient is the same for both inputs: written once to dx. dx may alias dy. y is read
  // only with the fused ReLU.
  virtual void backward(const T* y, const T* dy, T* dx) = 0;
};

template <class T>
class PadShortcutOp {
 public:
  virtual ~PadShortcutOp() = default;
  virtual void forward(const T* x, T* y) = 0;
  virtual void backward(const T* dy, T* dx) = 0;
};

template <class T>
class DropPathOp {
 public:
  virtual ~DropPathOp() = default;
  // scales: in.n factors in host memory, read before this returns; nullptr: all 1 (evaluation).
  virtual void forward(const T* x, const float* scales, T* y) = 0;
  // dx = s_n dy with the last forward's factors; dx may be dy.
  virtual void backward(const T* dy, T* dx) = 0;
};

template <class T>
class ChannelGateOp {
 public:
  virtual ~ChannelGateOp() = default;
  virtual void forward(const T* x, const T* g, T* y) = 0;
  // dx = dy * sigmoid(g); dg = sigmoid'(g) * (sum over h, w of dy * x), both overwritten.
  virtual void backward(const T* x, const T* g, const T* dy, T* dx, T* dg) = 0;
};

template <class T>
class SoftmaxXentOp {
 public:
  virtual ~SoftmaxXentOp() = default;
  // A label outside [0, classes) (either of a mixed pair) throws rt::Error naming it (here, or
  // from loss() on a device backend). Queues the mean loss and remembers the probabilities for
  // backward; nothing here waits for a device.
  virtual void forward(const T* logits, const Targets& t) = 0;
  // The mean loss of the last forward: a device backend waits for it here (only for it, not for
  // work queued after), so a caller that reads it once backward is queued stalls nothing.
  virtual double loss() = 0;
  // Gradient of the mean loss (times scale, for loss scaling) w.r.t. the logits; t as in the
  // last forward.
  virtual void backward(const Targets& t, T* dlogits, double scale = 1.0) = 0;
};

// The signatures of a layer with a weight (as ConvOp's), so that the network runs it as one: b and
// db are always null (no bias). backward writes dw, and dx unless it is null (no gradient wanted).
template <class T>
class ChannelConvOp {
 public:
  virtual ~ChannelConvOp() = default;
  virtual void forward(const T* x, const T* w, const T* b, T* y) = 0;
  virtual void backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db) = 0;
};

// forward, then loss(): for callers that want the value at once.
template <class T>
double forward_loss(SoftmaxXentOp<T>& op, const T* logits, const Targets& t) {
  op.forward(logits, t);
  return op.loss();
}

// A compute backend: makes set-up layer ops and converts activations to and from NCHW.
template <class T>
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Elements needed to hold an activation of logical shape s in this backend's layout.
  virtual size_t act_size(const Shape& s) const = 0;
  virtual void act_import(const T* nchw, const Shape& s, T* dst) const = 0;
  virtual void act_export(const T* src, const Shape& s, T* nchw) const = 0;
  // act_export without waiting: nchw holds the tensor after the next sync(). Into input_memory()
  // a device backend copies while the host goes on (elsewhere the copy may wait). Default: the
  // synchronous act_export.
  virtual void act_export_queued(const T* src, const Shape& s, T* nchw) const { act_export(src, s, nchw); }
  // The input from 8-bit pixels: s.n images of s.h x s.w x 3 bytes (NHWC, RGB; s.c must be 3),
  // normalized per channel with norm_value (nn/normalize.h) into dst as act_import would place
  // them. Default: normalizes on the host into a scratch buffer kept for the next call, then
  // act_import; the floats equal the loader's float output bit for bit. A device backend
  // overrides it to upload the bytes (a quarter of the floats) and normalize there.
  virtual void act_import_u8(const uint8_t* nhwc, const Shape& s, const NormParams& p, T* dst) const;
  // Input prefetch, for backends whose import copies to a device: stage_input takes the bytes of
  // a host input (the next step's batch, handed over while the current step still runs) and
  // starts their copy; the next act_import or act_import_u8 of that same host pointer then uses
  // the staged copy instead of reading the host again (one use per staging). The copy may run
  // while the host goes on (it does from input_memory()), so the host bytes must stay unchanged
  // until the next sync(). Default: not supported (imports always read the host).
  virtual bool can_stage_input() const { return false; }
  virtual void stage_input(const void* host, size_t bytes) {}
  // Where input batches should live for imports and stage_input to copy them fastest, without
  // the host waiting (page-locked memory); it outlives every backend. nullptr: the heap is as good.
  virtual HostMemory* input_memory() const { return nullptr; }
  // y[i] += x[i] for i < n (gradient accumulation in the backend layout).
  virtual void accumulate(T* y, const T* x, size_t n) const = 0;
  // y[i] += x[i] for i < n over arena memory (gradient accumulation across passes). The arena
  // is fp32 even where activations are 16-bit; those backends override this.
  virtual void accumulate_arena(T* y, const T* x, size_t n) const { accumulate(y, x, n); }
  // Where a Net keeps activations and gradients (act_memory) and its arena (param_memory; host
  // code reaches an arena it may not dereference through copies). nullptr, the CPU backends'
  // answer, is plain host memory.
  virtual const MemorySpace* act_memory() const { return nullptr; }
  virtual const MemorySpace* param_memory() const { return nullptr; }
  // Waits until the ops' queued work is done, so that the host sees their results in the arena.
  // The CPU backends compute synchronously: nothing to wait for.
  virtual void sync() const {}
  // The queue the ops run on (a cudaStream_t for the CUDA backends), for the gradient reducer's
  // fences; nullptr for backends that compute synchronously.
  virtual void* stream() const { return nullptr; }
  // The device's own time for a stretch of queued work, for backends whose host calls return
  // before the work is done (the host's clock would time the queueing): mark_compute(0) and
  // mark_compute(1) put marks in the queue; after a sync() that follows both, compute_seconds()
  // is the time between them. -1 without marks, and always for backends that compute
  // synchronously (the host's clock is the truth there).
  virtual void mark_compute(int which) {}
  virtual double compute_seconds() const { return -1; }
  // The optimizer cfg.kind names for an arena in param_memory(). Default: make_host_optimizer's
  // (Sgd<T> or Adam<T>) on the host, StagedOptimizer<T> around it (host copies) when the host may
  // not dereference param_memory().
  virtual std::unique_ptr<Optimizer<T>> make_sgd(std::vector<ParamInfo> layout, SgdConfig cfg);
  // The training loop's pass over the averaged gradients in param_memory(): v[i] *= s (skipped
  // when s is 1), then, when count, the number of inf and NaN values among the results (a device
  // backend may answer 0 or some positive count, then counts exactly only when something is
  // non-finite). Default: a host loop (on a host copy when the host may not dereference
  // param_memory()).
  virtual size_t scale_count_nonfinite(T* v, size_t n, float s, bool count);
  // That host loop over host memory, for overrides that count on a copy of their own.
  static size_t scale_count_host(T* v, size_t n, float s, bool count);
  // The weights' moving average over param_memory(): avg[i] = fma(w, x[i] - avg[i], avg[i]) for
  // i < n (avg moves the fraction w of the way to x; w = 1 - decay). Explicitly fused, so that
  // every backend computes the same bits. Default: ema_update_host (on host copies when the host
  // may not dereference param_memory()).
  virtual void ema_update(T* avg, const T* x, size_t n, T w) const;
  static void ema_update_host(T* avg, const T* x, size_t n, T w);
  // Σ v[i]² over i < n of param_memory(), in double, in one fixed order: chunks of
  // kSquaresChunk elements, each summed in a warp's order (warp_order_squares, nn/optimizer.h),
  // the chunks' sums then added in order. So the same bits for any thread count and on the CUDA
  // backends, and every rank that holds the same gradients gets the same norm. Default:
  // sum_squares_host (on a host copy when the host may not dereference param_memory()).
  virtual double sum_squares(const T* v, size_t n) const;
  static double sum_squares_host(const T* v, size_t n);
  static constexpr size_t kSquaresChunk = 4096;

  // What set-up decided that a job's log should show (one line, after the model is built), or
  // "": the CUDA backends say how their convolution algorithms were chosen.
  virtual std::string setup_note() const { return {}; }

  virtual std::unique_ptr<ConvOp<T>> make_conv(const ConvDesc&) = 0;
  virtual std::unique_ptr<BatchNormOp<T>> make_batchnorm(const BatchNormDesc&) = 0;
  // Whether a Net should run a batch norm without ReLU whose only reader is a residual add as one
  // node (BatchNormDesc::residual): one pass over memory fewer, and no tensor between them. The
  // backend's batch norm ops then implement forward_train_add and forward_eval_add.
  virtual bool fuses_bn_add() const { return false; }
  virtual std::unique_ptr<ReluOp<T>> make_relu(const ReluDesc&) = 0;
  virtual std::unique_ptr<MaxPoolOp<T>> make_maxpool(const MaxPoolDesc&) = 0;
  virtual std::unique_ptr<GlobalAvgPoolOp<T>> make_global_avgpool(const GlobalAvgPoolDesc&) = 0;
  // Default: refuses (throws rt::Error naming the backend and the layer), for backends without
  // windowed average pooling (ResNet-D's shortcut).
  virtual std::unique_ptr<AvgPoolOp<T>> make_avgpool(const AvgPoolDesc&);
  virtual std::unique_ptr<LinearOp<T>> make_linear(const LinearDesc&) = 0;
  virtual std::unique_ptr<AddOp<T>> make_add(const AddDesc&) = 0;
  virtual std::unique_ptr<PadShortcutOp<T>> make_pad_shortcut(const PadShortcutDesc&) = 0;
  virtual std::unique_ptr<SoftmaxXentOp<T>> make_softmax_xent(const SoftmaxXentDesc&) = 0;
  // Default: refuses (throws rt::Error naming the backend and the layer), for backends without
  // squeeze-and-excitation.
  virtual std::unique_ptr<ChannelGateOp<T>> make_channel_gate(const ChannelGateDesc&);
  // Default: host loops (sums in double: also the reference), for backends whose activations the
  // host may dereference; others must override it (this one refuses them).
  virtual std::unique_ptr<ChannelConvOp<T>> make_channel_conv(const ChannelConvDesc&);
  // Default: a loop over each sample's act_size(in) / in.n elements (every layout here keeps a
  // sample's values together), for backends whose activations the host may dereference; others
  // must override it (this one refuses them).
  virtual std::unique_ptr<DropPathOp<T>> make_drop_path(const DropPathDesc&);

 private:
  mutable std::vector<T> u8_scratch_;  // act_import_u8's host NCHW floats, reused
};

// What a job may choose about a GPU backend (the trainer's `cuda.*` keys). The CPU backends
// take none of it: their algorithms are fixed per shape and their results the same every run.
struct BackendOptions {
  // Convolution algorithms: "timed" (each candidate run once per shape at set-up, the fastest
  // kept), "heuristic" (cuDNN's ranking, no device time) or "auto" (the backend's own: heuristic
  // for cuda, timed for cuda-tf32, cuda-bf16 and cuda-fp16).
  std::string conv_algos = "auto";
  // The same bits every run (same GPU model, libraries and rank count): only deterministic
  // algorithms, chosen by heuristics, as timing may choose differently from one run to the next.
  bool deterministic = false;
  int64_t workspace_mib = 1024;  // per operation; algorithms that need more are skipped
  // A file that keeps the algorithm choices across runs (read at start, each new choice
  // appended), so that timed choice runs once per GPU model, software and configuration; "" for
  // none.
  std::string algo_cache;
  // This process's rank among those of its node, and their number, as an MPI program learns them
  // (MPI_COMM_TYPE_SHARED): local rank k takes GPU k. -1 / 0: from the launcher's variables.
  int local_rank = -1;
  int local_size = 0;
  // The oneDNN backend's activation channel block: 8 (nChw8c) or 16 (nChw16c); 0 picks the
  // processor's (16 where oneDNN runs AVX-512 kernels). Winograd convolutions need 8.
  int onednn_block = 0;

  // The rules every reader of these options applies (the trainer's config check names the key,
  // the cuda backends the backend): conv_algos is one of the three, and deterministic results
  // cannot come from timed choice.
  bool conv_algos_known() const {
    return conv_algos == "auto" || conv_algos == "timed" || conv_algos == "heuristic";
  }
  bool deterministic_but_timed() const { return deterministic && conv_algos == "timed"; }
};

// "reference" (plain loops, NCHW; float or double), "onednn" (float only; alias "cpu";
// "onednn-direct" and "onednn-winograd" force the 3x3 convolution algorithm) or a registered one
// ("cuda", float only, which takes `options`). Throws rt::Error naming the backend when unknown
// or unavailable for T, or when a registered one refuses the options.
template <class T>
std::unique_ptr<Backend<T>> make_backend(const std::string& name, const BackendOptions& options = {});

// Backends outside nn/ (cuda/ depends on nn/, not the other way round) register a factory under
// their name; a program linking them calls their registration once (rt::cuda::register_backend).
using BackendFactory = std::unique_ptr<Backend<float>> (*)(const BackendOptions&);
void register_backend(const std::string& name, BackendFactory make);
// Whether register_backend has been called for `name` in this program.
bool backend_registered(const std::string& name);

}  // namespace rt

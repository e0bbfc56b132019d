// Running a built Net: forward and backward (with per-node profiling), the gradient buffer
// slots they reuse, partial backward and frozen statistics, the search for the first
// non-finite output, tensor export.
#include <algorithm>
#include <cmath>

#include "nn/clock.h"
#include "nn/net.h"
#include "nn/net_nodes.h"

namespace rt {
using namespace detail;
template <class T>
void Net<T>::queue_forward(const T* input_nchw, const Targets& targets, bool train) {
  if (!finalized_) throw Error("network used before finalize()");
  backend_->act_import(input_nchw, shapes_[0], act_ptr_[0]);
  run_forward(targets, train);
}

template <class T>
void Net<T>::queue_forward_u8(const uint8_t* pixels_nhwc, const NormParams& norm, const Targets& targets,
                              bool train) {
  if (!finalized_) throw Error("network used before finalize()");
  backend_->act_import_u8(pixels_nhwc, shapes_[0], norm, act_ptr_[0]);
  run_forward(targets, train);
}

template <class T>
double Net<T>::forward(const T* input_nchw, const Targets& targets, bool train) {
  queue_forward(input_nchw, targets, train);
  return last_loss();
}

template <class T>
double Net<T>::forward_u8(const uint8_t* pixels_nhwc, const NormParams& norm, const Targets& targets,
                          bool train) {
  queue_forward_u8(pixels_nhwc, norm, targets, train);
  return last_loss();
}

template <class T>
double Net<T>::last_loss() {
  return targets_ ? loss_op_->loss() : 0.0;
}

// A device backend only queues work: waiting for it makes the host's clock the device's, each
// node's time its own work (plus a wait's latency).
template <class T>
double Net<T>::profile_clock() const {
  backend_->sync();
  return now_s();
}

template <class T>
void Net<T>::run_forward(const Targets& targets, bool train) {
  targets_ = targets;
  if (!profiling_) {
    for (auto& n : nodes_) n->forward(*this, train);
    return;
  }
  node_times_.resize(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const double t0 = profile_clock();
    nodes_[i]->forward(*this, train);
    node_times_[i].forward_s += profile_clock() - t0;
    ++node_times_[i].calls;
  }
}

template <class T>
void Net<T>::backward(const std::function<void(size_t)>& on_ready, double loss_scale, const T* addend) {
  if (inference_only_) throw Error("backward() on a network set up for inference only");
  if (!targets_) throw Error("backward() needs a forward() with labels first");
  loss_scale_ = loss_scale;
  std::fill(grad_slot_.begin(), grad_slot_.end(), -1);
  size_t added = 0;  // grads()[0, added) hold the addend
  auto add_upto = [&](size_t n) {
    if (!addend || n <= added) return;
    backend_->accumulate_arena(arena_.grads().data() + added, addend + added, n - added);
    added = n;
  };
  for (size_t i = nodes_.size(); i-- > backward_from_;) {
    Node<T>& n = *nodes_[i];
    const double t0 = profiling_ ? profile_clock() : 0.0;
    n.backward(*this);
    if (profiling_) node_times_[i].backward_s += profile_clock() - t0;
    if (n.output >= 0 && grad_slot_[n.output] >= 0) {
      slot_release(grad_slot_[n.output]);
      grad_slot_[n.output] = -1;
    }
    if (!n.params.empty()) add_upto(ready_after_[i]);
    if (on_ready && !n.params.empty()) {
      if (ready_sync_) backend_->sync();
      on_ready(ready_after_[i]);
    }
  }
  add_upto(arena_.size());
  for (int& s : grad_slot_) {  // the input's gradient is never requested; nothing else remains
    if (s >= 0) slot_release(s);
    s = -1;
  }
  if (ready_sync_ || !on_ready) backend_->sync();  // the caller may read the gradients next
  if (on_ready) on_ready(arena_.size());
}

template <class T>
void Net<T>::set_backward_from(size_t first) {
  if (first > nodes_.size())
    throw Error(str_cat("set_backward_from: node ", first, " of ", nodes_.size()));
  if (first < frozen_stats_end_)
    throw Error(str_cat("set_backward_from: node ", first, " would run the backward of ",
                        nodes_[frozen_stats_end_ - 1]->name, ", whose statistics are frozen"));
  backward_from_ = first;
}

template <class T>
void Net<T>::freeze_statistics(size_t node) {
  if (node >= nodes_.size()) throw Error(str_cat("freeze_statistics: node ", node, " of ", nodes_.size()));
  Node<T>* n = nodes_[node].get();
  if (node >= backward_from_)
    throw Error(str_cat("layer ", n->name, ": its batch statistics can be frozen only where backward does not run "
                        "(before node ", backward_from_, ", ", nodes_[backward_from_]->name, ")"));
  if (auto* bn = dynamic_cast<BatchNormNode<T>*>(n)) bn->frozen_stats = true;
  else if (auto* f = dynamic_cast<BnAddNode<T>*>(n)) f->frozen_stats = true;
  else throw Error(str_cat("layer ", n->name, ": not a batch norm, no statistics to freeze"));
  frozen_stats_end_ = std::max(frozen_stats_end_, node + 1);
}

template <class T>
size_t Net<T>::first_node_training(const std::function<bool(const ParamInfo&)>& trains) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    for (int p : nodes_[i]->params)
      if (trains(arena_.info(p))) return i;
  return nodes_.size();
}

template <class T>
int Net<T>::slot_alloc(size_t elems) {
  // Best fit among free slots; a new slot only while the first step discovers the sizes.
  int best = -1;
  for (size_t k = 0; k < free_slots_.size(); ++k) {
    int s = free_slots_[k];
    if (slots_[s].buf.size() >= elems && (best < 0 || slots_[s].buf.size() < slots_[free_slots_[best]].buf.size()))
      best = int(k);
  }
  int s;
  if (best >= 0) {
    s = free_slots_[best];
    free_slots_.erase(free_slots_.begin() + best);
  } else {
    slots_.emplace_back(backend_->act_memory());
    s = int(slots_.size()) - 1;
    slots_[s].buf.resize(elems);
  }
  slots_[s].refs = 1;
  return s;
}

template <class T>
void Net<T>::slot_release(int s) {
  if (--slots_[s].refs == 0) free_slots_.push_back(s);
}

template <class T>
int Net<T>::slot_unshare(int id) {
  int s = grad_slot_[id];
  if (slots_[s].refs > 1) {  // still another tensor's gradient: copy before accumulating into it
    size_t n = backend_->act_size(shapes_[id]);
    int c = slot_alloc(n);
    slots_[c].buf.copy_from(slots_[s].buf, n);
    slot_release(s);
    grad_slot_[id] = s = c;
  }
  return s;
}

template <class T>
T* Net<T>::grad_target(int id) {
  size_t n = backend_->act_size(shapes_[id]);
  if (grad_slot_[id] < 0) {
    grad_slot_[id] = slot_alloc(n);
    return slots_[grad_slot_[id]].buf.data();
  }
  scratch_slot_[id] = slot_alloc(n);
  return slots_[scratch_slot_[id]].buf.data();
}

template <class T>
T* Net<T>::grad_to_add(int id) {
  if (grad_slot_[id] < 0) return nullptr;
  return slots_[slot_unshare(id)].buf.data();
}

template <class T>
void Net<T>::grad_done(int id) {
  int sc = scratch_slot_[id];
  if (sc < 0) return;
  int s = slot_unshare(id);
  backend_->accumulate(slots_[s].buf.data(), slots_[sc].buf.data(), backend_->act_size(shapes_[id]));
  slot_release(sc);
  scratch_slot_[id] = -1;
}

template <class T>
void Net<T>::grad_alias(int id, int from) {
  if (!needs_grad(id)) return;
  int src = grad_slot_[from];
  if (grad_slot_[id] < 0) {
    grad_slot_[id] = src;
    ++slots_[src].refs;
    return;
  }
  int s = slot_unshare(id);
  backend_->accumulate(slots_[s].buf.data(), slots_[src].buf.data(), backend_->act_size(shapes_[id]));
}

template <class T>
int Net<T>::first_nonfinite_node(const T* input_nchw, const Targets& targets) {
  if (!finalized_) throw Error("network used before finalize()");
  backend_->act_import(input_nchw, shapes_[0], act_ptr_[0]);
  return run_nonfinite_search(targets);
}

template <class T>
int Net<T>::first_nonfinite_node_u8(const uint8_t* pixels_nhwc, const NormParams& norm,
                                    const Targets& targets) {
  if (!finalized_) throw Error("network used before finalize()");
  backend_->act_import_u8(pixels_nhwc, shapes_[0], norm, act_ptr_[0]);
  return run_nonfinite_search(targets);
}

// Runs every node even after the first non-finite output: with synchronised batch norms each
// layer is a collective, and every rank of the group must reach all of them.
template <class T>
int Net<T>::run_nonfinite_search(const Targets& targets) {
  targets_ = targets;
  // The input as the backend holds it: 16-bit storage, or a data.std near 0, can make it
  // non-finite before any layer; the first layer is then not at fault.
  std::vector<T> out(size_t(shapes_[0].numel()));
  export_tensor(0, out.data());
  int first = -1;
  const bool input_bad = std::any_of(out.begin(), out.end(), [](T v) { return !std::isfinite(double(v)); });
  for (size_t i = 0; i < nodes_.size(); ++i) {
    Node<T>& n = *nodes_[i];
    n.forward(*this, true);
    if (first >= 0) continue;
    if (n.output < 0) {
      if (!std::isfinite(last_loss())) first = int(i);
      continue;
    }
    out.resize(size_t(shapes_[n.output].numel()));
    export_tensor(n.output, out.data());
    for (T v : out)
      if (!std::isfinite(double(v))) {
        first = int(i);
        break;
      }
  }
  return input_bad ? kNonFiniteInput : first;
}

template <class T>
void Net<T>::export_tensor(int id, T* nchw) const {
  backend_->act_export(act_ptr_[id], shapes_[id], nchw);
}

template <class T>
void Net<T>::export_tensor_queued(int id, T* nchw) const {
  backend_->act_export_queued(act_ptr_[id], shapes_[id], nchw);
}


// The members defined in this file (nn/net.cc instantiates its own).
template class Net<float>;
template class Net<double>;

}  // namespace rt

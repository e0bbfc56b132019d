// What a step does to the averaged gradients between the allreduce and the update: the loss
// scale's division and the count of non-finite values (unscale_gradients), frozen tensors'
// gradients set to zero (optimizer.freeze), the norm and its limit (train.clip_grad_norm).
#include <algorithm>
#include <cmath>
#include <string>

#include "trainer/trainer.h"

namespace rt::trainer {

size_t Trainer::unscale_gradients() {
  auto g = net_->arena().grads();
  const bool count = cfg_.check.finite || scaler_.dynamic();
  size_t bad = net_->backend().scale_count_nonfinite(g.data(), g.size(), float(1.0 / scaler_.scale()), count);
  // A device backend may only say "some": the message wants the number (rare path).
  if (bad > 0) {
    net_->backend().sync();
    HostView<float> h = net_->arena().host_grads();
    bad = count_nonfinite(h.data(), h.size());
  }
  return bad;
}

// As torch.nn.utils.clip_grad_norm_ over all parameters: above the limit, every gradient is
// scaled by limit / (norm + 1e-6). After the allreduce and the unscaling, on the step's whole
// gradient (all passes of an accumulated step). Every rank holds the same gradients bit for bit
// and sums them in one fixed order (Backend::sum_squares), so every rank scales them alike. A
// non-finite norm is left to check.finite and loss scaling: nothing is scaled by it. The norm is
// also what log.grad_norm reports without clipping.
double Trainer::clip_gradients(bool& clipped) {
  clipped = false;
  const double limit = cfg_.train.clip_grad_norm;
  if (limit <= 0 && !cfg_.log.grad_norm) return -1;
  auto g = net_->arena().grads();
  const double norm = std::sqrt(net_->backend().sum_squares(g.data(), g.size()));
  const double coef = limit / (norm + 1e-6);
  if (limit > 0 && std::isfinite(norm) && coef < 1) {
    net_->backend().scale_count_nonfinite(g.data(), g.size(), float(coef), false);
    clipped = true;
  }
  return norm;
}

// optimizer.freeze and optimizer.lr_mult against the model: every entry must name a tensor (a
// misspelt name would otherwise freeze or scale nothing, silently), and something must be left
// to train. The frozen tensors' runs of the gradient buffer, neighbours merged (the alignment
// padding between them is zero).
void Trainer::plan_freeze() {
  const auto& freeze = cfg_.optimizer.sgd.freeze;
  averaged_elems_ = net_->arena().size();
  const auto& layout = net_->arena().layout();
  std::string parts;  // the model's top-level names in forward order (the layout's is backward's)
  for (auto p = layout.rbegin(); p != layout.rend(); ++p) {
    const std::string top = p->name.substr(0, p->name.find('.'));
    if (parts.find(" " + top + ",") == std::string::npos) parts += " " + top + ",";
  }
  auto check_named = [&](const char* key, const std::string& f) {
    const bool named =
        std::any_of(layout.begin(), layout.end(), [&](const ParamInfo& p) { return freeze_entry_matches(f, p.name); });
    if (!named)
      throw ConfigError(str_cat(config_origin(cfg_, key), ": key '", key, "': '", f, "' names no tensor of ",
                                cfg_.model.name,
                                " (a tensor's name, or a prefix ending before a '.'; its parts:",
                                parts.substr(0, parts.size() - 1), ")"));
  };
  for (const auto& entry : cfg_.optimizer.sgd.lr_mult) check_named("optimizer.lr_mult", entry.first);
  if (freeze.empty()) return;
  for (const std::string& f : freeze) check_named("optimizer.freeze", f);
  size_t trained = 0;
  bool after_frozen = false;
  for (const ParamInfo& p : layout) {  // in offset order
    const bool frozen = sgd_frozen(cfg_.optimizer.sgd, p.name);
    if (!frozen) trained += p.count;
    else if (after_frozen) frozen_.back().second = p.offset + p.count;  // the padding between too
    else frozen_.push_back({p.offset, p.offset + p.count});
    after_frozen = frozen;
  }
  if (trained == 0)
    throw ConfigError(str_cat(config_origin(cfg_, "optimizer.freeze"),
                              ": key 'optimizer.freeze' freezes every tensor of ", cfg_.model.name,
                              ": nothing left to train"));
  // A frozen stem (the first layers, whose gradients come last: the arena is in backward order)
  // needs neither backward nor averaging, as PyTorch's autograd and DDP skip parameters that
  // require no gradient; their gradients stay zero. Frozen tensors between trained ones still
  // pass their gradients through and ride in the buckets, zeroed after.
  net_->set_backward_from(net_->first_node_training(
      [&](const ParamInfo& p) { return !sgd_frozen(cfg_.optimizer.sgd, p.name); }));
  if (cfg_.optimizer.freeze_bn_stats) freeze_bn_statistics();
  if (after_frozen) {  // the last tensor is frozen: the run it ends is the stem's, padding included
    frozen_.back().second = net_->arena().size();
    averaged_elems_ = frozen_.back().first;
    net_->arena().grads_zero(averaged_elems_, net_->arena().size() - averaged_elems_);
  }
}

// optimizer.freeze_bn_stats: every batch norm whose γ and β are frozen runs in inference mode
// (PyTorch's .eval() on it). Only in the frozen stem, whose backward never runs: a frozen batch
// norm between trained layers would need a backward through fixed statistics, which the backends
// do not have.
void Trainer::freeze_bn_statistics() {
  const auto& arena = net_->arena();
  for (size_t i = 0; i < net_->num_nodes(); ++i) {
    const auto& node = net_->node(i);
    const bool bn = !node.params.empty() && arena.info(node.params[0]).kind == ParamKind::bn_gamma;
    const bool all_frozen = std::all_of(node.params.begin(), node.params.end(), [&](int p) {
      return sgd_frozen(cfg_.optimizer.sgd, arena.info(p).name);
    });
    if (!bn || !all_frozen) continue;
    if (i >= net_->backward_from())
      throw ConfigError(str_cat(config_origin(cfg_, "optimizer.freeze_bn_stats"),
                                ": key 'optimizer.freeze_bn_stats': the frozen batch norm ", node.name,
                                " comes after the trained ", net_->node(net_->backward_from()).name,
                                "; fixed statistics are kept only in a frozen stem (freeze a leading run of "
                                "layers, or leave this key false)"));
    net_->freeze_statistics(i);
    ++bn_frozen_;
  }
  if (bn_frozen_ == 0)  // the key would do nothing: a name frozen that is not the batch norm meant
    throw ConfigError(str_cat(config_origin(cfg_, "optimizer.freeze_bn_stats"),
                              ": key 'optimizer.freeze_bn_stats': no batch norm is frozen whole by optimizer.freeze "
                              "(its weight and bias), so none would keep its statistics; freeze the stem's batch "
                              "norms too (e.g. [conv1, bn1]), or leave this key false"));
}

// As PyTorch, where a frozen parameter has no gradient: none counts in the norm or reaches the
// update. Backward still computes those between trained layers (the layers before need their
// input gradients); the stem's stay zero.
void Trainer::zero_frozen_gradients() {
  for (const auto& [begin, end] : frozen_) net_->arena().grads_zero(begin, end - begin);
}

}  // namespace rt::trainer

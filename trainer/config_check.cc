// Config validation (ranges, names, combinations) and the values derived from a config.
#include <cctype>
#include <cmath>
#include <filesystem>
#include <tuple>
#include <type_traits>

#include "comm/allreduce.h"
#include "trainer/config.h"

namespace rt::trainer {
namespace {

// Raises "<where the key was set>: key 'k' <what> (got v)".
class Checker {
 public:
  explicit Checker(const Config& c) : c_(c) {}
  std::string at(const std::string& key) const { return config_origin(c_, key); }
  template <class V>
  void require(bool ok, const std::string& key, const std::string& what, const V& got) const {
    if (ok) return;
    if constexpr (std::is_same_v<V, bool>)  // as the config writes it, not 1 or 0
      throw ConfigError(str_cat(at(key), ": key '", key, "' ", what, " (got ", got ? "true" : "false", ")"));
    else
      throw ConfigError(str_cat(at(key), ": key '", key, "' ", what, " (got ", got, ")"));
  }
  // Wraps a library validator's message (which names its own field) with the origin of the
  // section's key that it names, where that key was set (else of `key`).
  template <class F>
  void library(const std::string& section, const std::string& key, F&& f) const {
    try {
      f();
    } catch (const Error& e) {
      std::string msg = e.what();
      if (msg.rfind(section + ": ", 0) == 0) msg.erase(0, section.size() + 2);  // said once
      throw ConfigError(str_cat(at(named_key(section, msg, key)), ": ", section, ": ", msg));
    }
  }

 private:
  // The key "section.<field>" set in the config whose field the message names as a whole word.
  std::string named_key(const std::string& section, const std::string& msg, const std::string& fallback) const {
    const auto word = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
    for (const auto& [key, where] : c_.origin) {
      if (key.rfind(section + ".", 0) != 0) continue;
      const std::string field = key.substr(section.size() + 1);
      for (size_t at = msg.find(field); at != std::string::npos; at = msg.find(field, at + 1))
        if ((at == 0 || !word(msg[at - 1])) && (at + field.size() == msg.size() || !word(msg[at + field.size()])))
          return key;
    }
    return fallback;
  }

  const Config& c_;
};

bool finite_pos(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

std::string config_origin(const Config& c, const std::string& key) {
  auto it = c.origin.find(key);
  return it != c.origin.end() ? it->second : c.source + " (default)";
}

int config_data_sources(const data::DataConfig& d) {
  return !d.root.empty() + (!d.train_list.empty() || !d.val_list.empty()) +
         (!d.train_shards.empty() || !d.val_shards.empty()) + d.synthetic;
}

void config_validate(const Config& c) {
  Checker k(c);
  k.require(is_resnet_name(c.model.name), "model.name",
            "must be resnet18/34/50/101/152, resnext50_32x4d, resnext101_32x4d, resnext101_32x8d, "
            "resnext101_64x4d, wide_resnet50_2, wide_resnet101_2, seresnet18/34/50/101/152, seresnext50_32x4d, "
            "seresnext101_32x4d, seresnext101_32x8d, seresnext101_64x4d, resnet18d/26d/34d/50d/101d/152d, "
            "resnext50d_32x4d, seresnext26d_32x4d, resnet26t/50t, ecaresnet26t/50d/50t/101d, ecaresnetlight or "
            "resnet20/32/44/56/110",
            c.model.name);
  // Upper bounds far past any real job: a stray digit should not surface as "out of memory".
  k.require(c.model.classes >= 2 && c.model.classes <= (1 << 24), "model.classes", "must be in [2, 16777216]",
            c.model.classes);
  k.require(finite_pos(c.model.width), "model.width", "must be > 0", c.model.width);
  k.require(c.model.cifar_shortcut == "A" || c.model.cifar_shortcut == "B", "model.cifar_shortcut",
            "must be A or B", c.model.cifar_shortcut);
  k.require(c.model.drop_path >= 0 && c.model.drop_path < 1, "model.drop_path", "must be in [0, 1) (0: off; e.g. 0.05)",
            c.model.drop_path);
  k.require(c.model.bn_group >= 0, "model.bn_group",
            "must be 0 (all ranks), 1 (each rank its own batch) or a group size", c.model.bn_group);

  // Exactly one data source.
  const auto& d = c.data;
  const int sources = config_data_sources(d);
  if (sources != 1) {
    // Where each source key was given, set or emptied: the file's line, or the --set.
    std::string given;
    for (const char* key : {"data.root", "data.train_list", "data.val_list", "data.train_shards", "data.val_shards",
                            "data.synthetic"})
      if (c.origin.count(key)) given += str_cat(given.empty() ? "; " : ", ", key, " at ", config_origin(c, key));
    throw ConfigError(str_cat(c.source, ": data: set exactly one of data.root, data.train_list + "
                              "data.val_list, data.train_shards + data.val_shards, data.synthetic: "
                              "true (", sources, " set", given, ")"));
  }
  // Training data alone serves a run that never evaluates (as a folder without val/ does).
  const bool evaluates = c.eval.any();
  const auto partners = [&](const std::string& train, const std::string& val, const std::string& kind) {
    const std::string t = "data.train_" + kind, v = "data.val_" + kind;
    k.require(train.empty() == val.empty() || (!evaluates && val.empty()), train.empty() ? v : t,
              train.empty() ? str_cat("needs its partner (", t, " and ", v, " go together)")
                            : str_cat("needs its partner ", v, " where the run evaluates (eval.every_epochs, eval.every_steps, eval.at_end)"),
              train.empty() ? val : train);
  };
  partners(d.train_list, d.val_list, "list");
  partners(d.train_shards, d.val_shards, "shards");
  k.require(d.image_size >= 8, "data.image_size", "must be >= 8", d.image_size);
  k.require(d.eval_image_size == 0 || d.eval_image_size >= 8, "data.eval_image_size",
            "must be >= 8 (0: data.image_size)", d.eval_image_size);
  k.require(d.eval_resize == 0 || d.eval_resize >= data::eval_image_size(d), "data.eval_resize",
            str_cat("must be at least the evaluation side, ", data::eval_image_size(d),
                    " (the centre crop is taken from the resized image; 0: side * 256 / 224)"),
            d.eval_resize);
  k.require(d.repeated_augment >= 1, "data.repeated_augment", "must be >= 1 (1: off; e.g. 4)",
            d.repeated_augment);
  k.require(d.threads >= 0 && d.threads <= 1024, "data.threads", "must be in [0, 1024] (0: the cores available)",
            d.threads);
  k.require(d.queue_depth >= 1 && d.queue_depth <= 1024, "data.queue_depth", "must be in [1, 1024]",
            d.queue_depth);
  k.require(d.synthetic_samples >= 1, "data.synthetic_samples", "must be >= 1", d.synthetic_samples);
  k.require(d.synthetic_classes >= 2, "data.synthetic_classes", "must be >= 2", d.synthetic_classes);
  k.require(d.min_scale > 0 && d.min_scale <= 1, "data.min_scale", "must be in (0, 1]", d.min_scale);
  k.require(d.max_scale >= d.min_scale && d.max_scale <= 1, "data.max_scale",
            str_cat("must be in [data.min_scale, 1] (min_scale ", d.min_scale, ", set in ",
                    config_origin(c, "data.min_scale"), ")"),
            d.max_scale);
  k.require(d.eval_interpolation != data::Interpolation::random, "data.eval_interpolation",
            "must be bilinear or bicubic (random draws per training crop only)", "random");
  k.require(finite_pos(d.min_ratio), "data.min_ratio", "must be > 0", d.min_ratio);
  k.require(std::isfinite(d.max_ratio) && d.max_ratio >= d.min_ratio, "data.max_ratio",
            str_cat("must be >= data.min_ratio (", d.min_ratio, ", set in ", config_origin(c, "data.min_ratio"), ")"),
            d.max_ratio);
  const auto& aa = d.auto_augment;
  k.require(aa.ops >= 1 && aa.ops <= data::kMaxAugSteps, "data.randaugment_ops",
            str_cat("must be in [1, ", data::kMaxAugSteps, "]"), aa.ops);
  k.require(aa.magnitude >= 0 && aa.magnitude < data::kAugBins, "data.randaugment_magnitude",
            str_cat("must be a bin in [0, ", data::kAugBins - 1, "]"), aa.magnitude);
  k.require(aa.magnitude_std >= 0 && aa.magnitude_std <= data::kAugBins, "data.randaugment_magnitude_std",
            str_cat("must be in [0, ", data::kAugBins, "] bins (0: every op at the magnitude)"), aa.magnitude_std);
  k.require(aa.policy == data::AutoAugment::none || !d.synthetic, "data.auto_augment",
            "works on decoded images; data.synthetic has none", data::auto_augment_name(aa.policy));
  k.require(d.random_erasing >= 0 && d.random_erasing <= 1, "data.random_erasing",
            "must be a probability in [0, 1] (0: off)", d.random_erasing);
  k.require(d.random_erasing == 0 || !d.synthetic, "data.random_erasing",
            "works on decoded images; data.synthetic has none", d.random_erasing);
  for (int i = 0; i < 3; ++i) {
    // Pixels are scaled to [0, 1] before normalising: values on the 0-255 scale (mmcv's
    // [123.675, ...]) would make every input nearly constant.
    const char* scale = "pixels are in [0, 1] when normalised (ImageNet's: mean [0.485, 0.456, 0.406], std "
                        "[0.229, 0.224, 0.225]; values on the 0-255 scale divide by 255)";
    k.require(d.mean[i] >= 0 && d.mean[i] <= 1, "data.mean", str_cat("must be in [0, 1]: ", scale), d.mean[i]);
    k.require(finite_pos(d.std[i]) && d.std[i] <= 1, "data.std", str_cat("must be in (0, 1]: ", scale), d.std[i]);
  }

  const auto& g = c.generate;
  k.require(g.classes >= 0, "data.generate.classes", "must be >= 0", g.classes);
  if (g.classes > 0) {
    k.require(!d.root.empty(), "data.generate.classes", "needs data.root (where to generate)", g.classes);
    k.require(g.classes >= 2, "data.generate.classes", "must be >= 2", g.classes);
    k.require(g.train_per_class >= 1, "data.generate.train_per_class", "must be >= 1", g.train_per_class);
    k.require(g.val_per_class >= 1, "data.generate.val_per_class", "must be >= 1", g.val_per_class);
    k.require(g.size >= 8, "data.generate.size", "must be >= 8", g.size);
  }

  k.require(finite_pos(c.optimizer.lr), "optimizer.lr", "must be > 0", c.optimizer.lr);
  k.require(c.optimizer.lr_scaling == "linear" || c.optimizer.lr_scaling == "sqrt" || c.optimizer.lr_scaling == "none",
            "optimizer.lr_scaling", "must be linear, sqrt or none", c.optimizer.lr_scaling);
  k.library("optimizer", c.optimizer.sgd.kind == OptimizerKind::sgd ? "optimizer.momentum" : "optimizer.kind",
            [&] { sgd_validate(c.optimizer.sgd); });
  k.require(!c.optimizer.freeze_bn_stats || !c.optimizer.sgd.freeze.empty(), "optimizer.freeze_bn_stats",
            "needs frozen layers (optimizer.freeze)", c.optimizer.freeze_bn_stats);
  k.require(c.train.epochs >= 1, "train.epochs", "must be >= 1", c.train.epochs);
  k.require(c.train.steps >= 0, "train.steps", "must be >= 0", c.train.steps);
  k.require(c.train.batch >= 1 && c.train.batch <= (1 << 24), "train.batch", "must be in [1, 16777216]",
            c.train.batch);
  k.require(c.train.accumulate >= 1, "train.accumulate", "must be >= 1", c.train.accumulate);
  k.require(c.train.label_smoothing >= 0 && c.train.label_smoothing < 1, "train.label_smoothing",
            "must be in [0, 1)", c.train.label_smoothing);
  k.require(c.train.bce_threshold < 1 && !std::isnan(c.train.bce_threshold), "train.bce_threshold",
            "must be below 1 (e.g. 0.2; negative: soft targets)", c.train.bce_threshold);
  k.require(c.train.bce_threshold < 0 || c.train.loss == LossKind::bce, "train.bce_threshold",
            "applies only to train.loss: bce", c.train.bce_threshold);
  k.require(c.train.mixup >= 0 && std::isfinite(c.train.mixup), "train.mixup", "must be >= 0 (0: off)",
            c.train.mixup);
  k.require(c.train.cutmix >= 0 && std::isfinite(c.train.cutmix), "train.cutmix", "must be >= 0 (0: off)",
            c.train.cutmix);
  k.require(c.train.ema >= 0 && c.train.ema < 1, "train.ema", "must be in [0, 1) (0: off; e.g. 0.9999)",
            c.train.ema);
  k.require(c.train.ema_every >= 1, "train.ema_every", "must be >= 1", c.train.ema_every);
  k.require(c.train.ema_copy_epochs >= 0, "train.ema_copy_epochs", "must be >= 0", c.train.ema_copy_epochs);
  k.require(c.train.clip_grad_norm >= 0 && std::isfinite(c.train.clip_grad_norm), "train.clip_grad_norm",
            "must be >= 0 (0: off)", c.train.clip_grad_norm);
  k.require(c.train.target_top1 >= 0 && c.train.target_top1 <= 100, "train.target_top1",
            "must be a percentage in [0, 100] (0: off)", c.train.target_top1);
  k.require(c.train.target_top1 == 0 || c.eval.during_run(), "train.target_top1",
            "needs evaluations during the run (eval.every_epochs > 0 or eval.every_steps > 0)", c.train.target_top1);
  k.library("loss_scale", "loss_scale.mode", [&] { loss_scale_validate(c.loss_scale); });
  // The schedule's checks that involve other sections' keys, in the user's own numbers and
  // naming both keys (schedule_validate sees total epochs and lrs already scaled to the batch).
  k.require(!(c.schedule.warmup_epochs > double(c.train.epochs)), "schedule.warmup_epochs",
            str_cat("exceeds train.epochs, ", c.train.epochs, " (set in ", config_origin(c, "train.epochs"), ")"),
            c.schedule.warmup_epochs);
  const bool decays_to_final = c.schedule.kind == ScheduleKind::cosine || c.schedule.kind == ScheduleKind::poly;
  k.require(!decays_to_final || !(c.schedule.final_lr > c.optimizer.lr), "schedule.final_lr",
            str_cat("exceeds optimizer.lr, ", c.optimizer.lr, " (set in ", config_origin(c, "optimizer.lr"),
                    "; both per 256 images)"),
            c.schedule.final_lr);
  k.library("schedule", "schedule.kind", [&] { schedule_validate(config_schedule(c, 1)); });

  const auto& algos = comm::allreduce_algorithms();
  std::string known;
  for (const auto& a : algos) known += (known.empty() ? "" : ", ") + a;
  const std::string algo_rule = "must be one of " + known;
  k.require(std::find(algos.begin(), algos.end(), c.comm.algorithm) != algos.end(), "comm.algorithm",
            algo_rule.c_str(), c.comm.algorithm);
  const bool gpu = c.backend == "cuda" || c.backend == "cuda-tf32" || c.backend == "cuda-bf16" ||
                   c.backend == "cuda-fp16";
  k.require(c.comm.algorithm != "nccl" || gpu, "comm.algorithm",
            str_cat("nccl needs backend: cuda, cuda-tf32, cuda-bf16 or cuda-fp16; backend is ", c.backend, " (",
                    config_origin(c, "backend"), ")"),
            c.comm.algorithm);
  k.require(c.comm.ranks_per_node >= 0, "comm.ranks_per_node",
            "must be >= 0 (0: the ranks sharing memory form a node)", c.comm.ranks_per_node);
  k.require(c.comm.ring_order == "node" || c.comm.ring_order == "rank", "comm.ring_order",
            "must be node or rank", c.comm.ring_order);
  k.require(c.comm.bucket_bytes >= 4, "comm.bucket_bytes", "must be >= 4", c.comm.bucket_bytes);
  k.require(c.comm.segment_bytes >= 4, "comm.segment_bytes", "must be >= 4", c.comm.segment_bytes);
  k.require(c.comm.network_segment_bytes == 0 || c.comm.network_segment_bytes >= 4, "comm.network_segment_bytes",
            "must be 0 (= segment_bytes) or >= 4", c.comm.network_segment_bytes);
  k.require(c.comm.idle_sleep_us >= 0, "comm.idle_sleep_us", "must be >= 0", c.comm.idle_sleep_us);
  k.require(c.comm.overlap_idle_sleep_us >= 0, "comm.overlap_idle_sleep_us", "must be >= 0",
            c.comm.overlap_idle_sleep_us);
  k.require(c.comm.recv_depth >= 2 && c.comm.recv_depth <= 64, "comm.recv_depth", "must be in [2, 64]",
            c.comm.recv_depth);
  k.require(c.comm.stall_warning_s >= 0 && std::isfinite(c.comm.stall_warning_s), "comm.stall_warning_s",
            "must be >= 0 (0: no warning)", c.comm.stall_warning_s);
  k.require(c.comm.stall_abort_s >= 0 && std::isfinite(c.comm.stall_abort_s), "comm.stall_abort_s",
            "must be >= 0 (0: never stop)", c.comm.stall_abort_s);
  k.require(c.comm.stall_warning_s == 0 || c.comm.stall_abort_s == 0 ||
                c.comm.stall_warning_s < c.comm.stall_abort_s,
            "comm.stall_warning_s", str_cat("must be below comm.stall_abort_s, ", c.comm.stall_abort_s,
                                            " (the warning would never come before the stop)"),
            c.comm.stall_warning_s);
  k.require(c.comm.device_path == "auto" || c.comm.device_path == "staged" || c.comm.device_path == "direct",
            "comm.device_path", "must be auto, staged or direct", c.comm.device_path);
  k.require(c.comm.algorithm != "nccl" || c.comm.device_path != "staged", "comm.device_path",
            "staged cannot be used with comm.algorithm nccl (use auto or direct)", c.comm.device_path);
  k.require(comm::compression_known(c.comm.compression),
            "comm.compression", "must be none, bf16 or fp16", c.comm.compression);
  k.require(c.comm.compression == "none" || c.comm.algorithm != "mpi", "comm.compression",
            "bf16 and fp16 need comm.algorithm ring, hierarchical, reducer or nccl (MPI_Allreduce has no 16-bit sum)",
            c.comm.compression);

  k.require(c.checkpoint.every_steps >= 0, "checkpoint.every_steps", "must be >= 0", c.checkpoint.every_steps);
  k.require(c.checkpoint.every_minutes >= 0 && std::isfinite(c.checkpoint.every_minutes), "checkpoint.every_minutes",
            "must be >= 0 (0: off)", c.checkpoint.every_minutes);
  k.require(c.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1", c.checkpoint.keep);
  k.require(!c.checkpoint.keep_best || c.eval.any(), "checkpoint.keep_best",
            "needs evaluations to choose by (eval.every_epochs > 0, eval.every_steps > 0 or eval.at_end)",
            c.checkpoint.keep_best);
  k.require(c.eval.every_epochs >= 0, "eval.every_epochs", "must be >= 0", c.eval.every_epochs);
  k.require(c.eval.every_steps >= 0, "eval.every_steps", "must be >= 0", c.eval.every_steps);
  k.require(c.eval.batch >= 0, "eval.batch", "must be >= 0 (0: train.batch)", c.eval.batch);
  k.require(c.log.interval >= 1, "log.interval", "must be >= 1", c.log.interval);
  k.require(c.log.timeline_skip >= 0, "log.timeline_skip", "must be >= 0", c.log.timeline_skip);
  k.require(c.log.timeline_steps >= 1, "log.timeline_steps", "must be >= 1", c.log.timeline_steps);
  k.require(c.check.every >= 0, "check.every", "must be >= 0", c.check.every);
  const auto& dbg = c.debug;
  k.require(dbg.fault == "none" || dbg.fault == "nan" || dbg.fault == "inf" || dbg.fault == "stall" ||
                dbg.fault == "stall_eval" || dbg.fault == "freeze" || dbg.fault == "freeze_ctl" ||
                dbg.fault == "kill" || dbg.fault == "throw" || dbg.fault == "stop" || dbg.fault == "stop_eval",
            "debug.fault", "must be none, nan, inf, stall, stall_eval, freeze, freeze_ctl, kill, throw, stop or stop_eval",
            dbg.fault);
  k.require(dbg.rank >= 0, "debug.rank", "must be >= 0", dbg.rank);
  k.require(dbg.step >= 1, "debug.step", "must be >= 1", dbg.step);
  // Far more threads than any machine has cores: OpenMP fails to start a team that size.
  k.require(c.threads >= 0 && c.threads <= 1024, "threads", "must be in [0, 1024] (0: the cores available)",
            c.threads);
  k.require(std::isfinite(c.emulate.compute_ms) && c.emulate.compute_ms >= 0, "emulate.compute_ms",
            "must be >= 0 (0 = real compute)", c.emulate.compute_ms);
  k.require(c.emulate.forward_fraction >= 0 && c.emulate.forward_fraction < 1, "emulate.forward_fraction",
            "must be in [0, 1)", c.emulate.forward_fraction);
  // An emulated step stands for one pass whose gradients go straight to the reducer.
  k.require(c.emulate.compute_ms <= 0 || c.train.accumulate == 1, "train.accumulate",
            "must be 1 when emulate.compute_ms is set", c.train.accumulate);

  const auto& cu = c.cuda;
  k.require(cu.conv_algos_known(), "cuda.conv_algos", "must be auto, timed or heuristic", cu.conv_algos);
  k.require(!cu.deterministic_but_timed(), "cuda.conv_algos",
            "cannot be timed with cuda.deterministic: true (timing may choose other algorithms on the "
            "next run; use auto or heuristic)", cu.conv_algos);
  k.require(cu.workspace_mib >= 0 && cu.workspace_mib <= (int64_t(1) << 30), "cuda.workspace_mib",
            "must be in [0, 1073741824] (MiB)", cu.workspace_mib);
  k.require(cu.algo_cache.empty() || !std::filesystem::is_directory(cu.algo_cache), "cuda.algo_cache",
            "must be a file, not a directory", cu.algo_cache);

  k.require(c.backend == "onednn" || c.backend == "cpu" || c.backend == "onednn-direct" ||
                c.backend == "onednn-winograd" || c.backend == "reference" || gpu,
            "backend",
            "must be onednn (alias cpu), onednn-direct, onednn-winograd, reference, cuda, cuda-tf32, "
            "cuda-bf16 or cuda-fp16",
            c.backend);
  // Whether "cuda" is usable (built in, a device present) is for make_backend to say, with the
  // runtime's reason, when the model is built.
}

std::string inapplicable_keys(const Config& c) {
  const bool adam = c.optimizer.sgd.kind != OptimizerKind::sgd;
  const bool cifar = is_cifar_resnet(c.model.name);
  const ScheduleKind kind = c.schedule.kind;
  const auto policy = c.data.auto_augment.policy;
  // key prefix or key, whether it applies, and what reads it
  const std::tuple<std::string, bool, const char*> rules[] = {
      {"cuda.", c.backend.rfind("cuda", 0) == 0, "the cuda backends"},
      {"comm.device_path", c.backend.rfind("cuda", 0) == 0, "the cuda backends (gradients in GPU memory)"},
      {"comm.ranks_per_node", c.comm.algorithm == "hierarchical", "comm.algorithm hierarchical"},
      {"optimizer.beta1", adam, "optimizer.kind adamw and lamb"},
      {"optimizer.beta2", adam, "optimizer.kind adamw and lamb"},
      {"optimizer.eps", adam, "optimizer.kind adamw and lamb"},
      {"optimizer.momentum", !adam, "optimizer.kind sgd"},
      {"optimizer.lars_exclude_bn_and_bias", c.optimizer.sgd.lars || c.optimizer.sgd.kind == OptimizerKind::lamb,
       "optimizer.lars: true and optimizer.kind lamb"},
      {"optimizer.lars_", c.optimizer.sgd.lars, "optimizer.lars: true"},
      {"train.ema_", c.train.ema > 0, "train.ema > 0"},
      {"data.randaugment_", policy == data::AutoAugment::randaugment, "data.auto_augment: randaugment"},
      {"model.cifar_shortcut", cifar, "the CIFAR ResNets (resnet20/32/44/56/110)"},
      {"schedule.final_lr", kind == ScheduleKind::cosine || kind == ScheduleKind::poly, "schedule.kind cosine and poly"},
      {"schedule.power", kind == ScheduleKind::poly, "schedule.kind poly"},
      {"schedule.step_size", kind == ScheduleKind::step, "schedule.kind step"},
      {"schedule.milestones", kind == ScheduleKind::multistep, "schedule.kind multistep"},
      {"schedule.gamma", kind == ScheduleKind::step || kind == ScheduleKind::multistep, "schedule.kind step and multistep"},
      {"schedule.warmup_start_factor", c.schedule.warmup_epochs > 0, "schedule.warmup_epochs > 0"},
      {"loss_scale.init", c.loss_scale.mode != "none", "loss_scale.mode static and dynamic"},
      {"loss_scale.growth_", c.loss_scale.mode == "dynamic", "loss_scale.mode dynamic"},
      {"loss_scale.backoff_factor", c.loss_scale.mode == "dynamic", "loss_scale.mode dynamic"},
      {"loss_scale.min", c.loss_scale.mode == "dynamic", "loss_scale.mode dynamic"},
  };
  std::string out;
  for (const std::string& key : config_changed_keys(c))
    for (const auto& [prefix, applies, reader] : rules)
      if (key.rfind(prefix, 0) == 0) {  // the first rule for the key decides
        if (!applies) out += str_cat(out.empty() ? "" : "; ", key, " (read with ", reader, " only)");
        break;
      }
  return out;
}

double config_global_batch(const Config& c, int world) {
  return double(world) * double(c.train.batch) * double(c.train.accumulate);
}

int64_t config_eval_batch(const Config& c) { return c.eval.batch > 0 ? c.eval.batch : c.train.batch; }

double config_lr_factor(const Config& c, int world) {
  const double per_256 = config_global_batch(c, world) / 256.0;
  return c.optimizer.lr_scaling == "sqrt" ? std::sqrt(per_256) : c.optimizer.lr_scaling == "none" ? 1.0 : per_256;
}

double config_base_lr(const Config& c, int world) { return c.optimizer.lr * config_lr_factor(c, world); }

ScheduleConfig config_schedule(const Config& c, int world) {
  ScheduleConfig s = c.schedule;
  s.base_lr = config_base_lr(c, world);
  s.total_epochs = double(c.train.epochs);
  // final_lr is written as lr is, so a recipe keeps its meaning at any batch.
  s.final_lr = c.schedule.final_lr * config_lr_factor(c, world);
  return s;
}

ResNetConfig config_resnet(const Config& c) {
  ResNetConfig r;
  r.name = c.model.name;
  r.num_classes = c.model.classes;
  r.image_size = c.data.image_size;
  r.batch = c.train.batch;
  r.width = c.model.width;
  r.zero_init_residual = c.model.zero_init_residual;
  r.cifar_shortcut = c.model.cifar_shortcut;
  r.drop_path = c.model.drop_path;
  r.loss = {c.train.loss, c.train.label_smoothing, c.train.bce_threshold};
  r.seed = c.seed;
  return r;
}

std::string config_run_dir(const Config& c) {
  if (!c.run_dir.empty()) return c.run_dir;
  std::string stem = std::filesystem::path(c.source).stem().string();
  return "runs/" + (stem.empty() ? std::string("run") : stem);
}

std::string config_checkpoint_dir(const Config& c) {
  return c.checkpoint.dir.empty() ? config_run_dir(c) + "/checkpoints" : c.checkpoint.dir;
}

std::string config_rank_file(const std::string& pattern, int rank) {
  if (pattern.find("{rank}") == std::string::npos) return rank == 0 ? pattern : "";
  std::string out = pattern;  // every {rank}: a folder per rank may also name the file
  for (size_t at = 0; (at = out.find("{rank}", at)) != std::string::npos;)
    out.replace(at, 6, std::to_string(rank));
  return out;
}

}  // namespace rt::trainer

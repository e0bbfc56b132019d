// Config parsing: one table of (key, field) pairs drives reading YAML, --set overrides and
// printing the resolved configuration, so a key cannot be readable but not printable.
#include "trainer/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "comm/allreduce.h"

namespace rt::trainer {
namespace {

// The table: calls v(key, field) for every key in declaration order. The same function serves
// parsing (fields written) and printing (fields read).
template <class C, class V>
void config_fields(C& c, V&& v) {
  v("model.name", c.model.name);
  v("model.classes", c.model.classes);
  v("model.width", c.model.width);
  v("model.zero_init_residual", c.model.zero_init_residual);
  v("model.cifar_shortcut", c.model.cifar_shortcut);
  v("model.drop_path", c.model.drop_path);
  v("model.bn_group", c.model.bn_group);
  v("data.root", c.data.root);
  v("data.train_list", c.data.train_list);
  v("data.val_list", c.data.val_list);
  v("data.train_shards", c.data.train_shards);
  v("data.val_shards", c.data.val_shards);
  v("data.synthetic", c.data.synthetic);
  v("data.synthetic_samples", c.data.synthetic_samples);
  v("data.synthetic_classes", c.data.synthetic_classes);
  v("data.image_size", c.data.image_size);
  v("data.eval_image_size", c.data.eval_image_size);
  v("data.eval_resize", c.data.eval_resize);
  v("data.interpolation", c.data.interpolation);
  v("data.eval_interpolation", c.data.eval_interpolation);
  v("data.threads", c.data.threads);
  v("data.queue_depth", c.data.queue_depth);
  v("data.mean", c.data.mean);
  v("data.std", c.data.std);
  v("data.min_scale", c.data.min_scale);
  v("data.max_scale", c.data.max_scale);
  v("data.min_ratio", c.data.min_ratio);
  v("data.max_ratio", c.data.max_ratio);
  v("data.flip", c.data.flip);
  v("data.auto_augment", c.data.auto_augment.policy);
  v("data.randaugment_ops", c.data.auto_augment.ops);
  v("data.randaugment_magnitude", c.data.auto_augment.magnitude);
  v("data.randaugment_magnitude_std", c.data.auto_augment.magnitude_std);
  v("data.random_erasing", c.data.random_erasing);
  v("data.repeated_augment", c.data.repeated_augment);
  v("data.output", c.data.output);
  v("data.generate.classes", c.generate.classes);
  v("data.generate.train_per_class", c.generate.train_per_class);
  v("data.generate.val_per_class", c.generate.val_per_class);
  v("data.generate.size", c.generate.size);
  v("data.generate.seed", c.generate.seed);
  v("optimizer.kind", c.optimizer.sgd.kind);
  v("optimizer.lr", c.optimizer.lr);
  v("optimizer.lr_scaling", c.optimizer.lr_scaling);
  v("optimizer.momentum", c.optimizer.sgd.momentum);
  v("optimizer.nesterov", c.optimizer.sgd.nesterov);
  v("optimizer.weight_decay", c.optimizer.sgd.weight_decay);
  v("optimizer.decay_bn_and_bias", c.optimizer.sgd.decay_bn_and_bias);
  v("optimizer.lars", c.optimizer.sgd.lars);
  v("optimizer.lars_trust", c.optimizer.sgd.lars_trust);
  v("optimizer.lars_eps", c.optimizer.sgd.lars_eps);
  v("optimizer.lars_exclude_bn_and_bias", c.optimizer.sgd.lars_exclude_bn_and_bias);
  v("optimizer.freeze", c.optimizer.sgd.freeze);
  v("optimizer.freeze_bn_stats", c.optimizer.freeze_bn_stats);
  v("optimizer.lr_mult", c.optimizer.sgd.lr_mult);
  v("optimizer.beta1", c.optimizer.sgd.beta1);
  v("optimizer.beta2", c.optimizer.sgd.beta2);
  v("optimizer.eps", c.optimizer.sgd.eps);
  v("schedule.kind", c.schedule.kind);
  v("schedule.warmup_epochs", c.schedule.warmup_epochs);
  v("schedule.warmup_start_factor", c.schedule.warmup_start_factor);
  v("schedule.step_size", c.schedule.step_size);
  v("schedule.milestones", c.schedule.milestones);
  v("schedule.gamma", c.schedule.gamma);
  v("schedule.power", c.schedule.power);
  v("schedule.final_lr", c.schedule.final_lr);
  v("train.epochs", c.train.epochs);
  v("train.steps", c.train.steps);
  v("train.batch", c.train.batch);
  v("train.accumulate", c.train.accumulate);
  v("train.loss", c.train.loss);
  v("train.label_smoothing", c.train.label_smoothing);
  v("train.bce_threshold", c.train.bce_threshold);
  v("train.mixup", c.train.mixup);
  v("train.cutmix", c.train.cutmix);
  v("train.ema", c.train.ema);
  v("train.ema_warmup", c.train.ema_warmup);
  v("train.ema_every", c.train.ema_every);
  v("train.ema_copy_epochs", c.train.ema_copy_epochs);
  v("train.clip_grad_norm", c.train.clip_grad_norm);
  v("train.target_top1", c.train.target_top1);
  v("loss_scale.mode", c.loss_scale.mode);
  v("loss_scale.init", c.loss_scale.init);
  v("loss_scale.growth_factor", c.loss_scale.growth_factor);
  v("loss_scale.backoff_factor", c.loss_scale.backoff_factor);
  v("loss_scale.growth_interval", c.loss_scale.growth_interval);
  v("loss_scale.min", c.loss_scale.min);
  v("comm.algorithm", c.comm.algorithm);
  v("comm.ranks_per_node", c.comm.ranks_per_node);
  v("comm.ring_order", c.comm.ring_order);
  v("comm.bucket_bytes", c.comm.bucket_bytes);
  v("comm.overlap", c.comm.overlap);
  v("comm.segment_bytes", c.comm.segment_bytes);
  v("comm.network_segment_bytes", c.comm.network_segment_bytes);
  v("comm.idle_sleep_us", c.comm.idle_sleep_us);
  v("comm.overlap_idle_sleep_us", c.comm.overlap_idle_sleep_us);
  v("comm.recv_depth", c.comm.recv_depth);
  v("comm.stall_warning_s", c.comm.stall_warning_s);
  v("comm.stall_abort_s", c.comm.stall_abort_s);
  v("comm.device_path", c.comm.device_path);
  v("comm.compression", c.comm.compression);
  v("checkpoint.dir", c.checkpoint.dir);
  v("checkpoint.every_steps", c.checkpoint.every_steps);
  v("checkpoint.every_minutes", c.checkpoint.every_minutes);
  v("checkpoint.at_epoch_end", c.checkpoint.at_epoch_end);
  v("checkpoint.keep", c.checkpoint.keep);
  v("checkpoint.keep_best", c.checkpoint.keep_best);
  v("eval.every_epochs", c.eval.every_epochs);
  v("eval.every_steps", c.eval.every_steps);
  v("eval.at_end", c.eval.at_end);
  v("eval.batch", c.eval.batch);
  v("log.jsonl", c.log.jsonl);
  v("log.interval", c.log.interval);
  v("log.progress", c.log.progress);
  v("log.print_config", c.log.print_config);
  v("log.grad_norm", c.log.grad_norm);
  v("log.timeline", c.log.timeline);
  v("log.timeline_skip", c.log.timeline_skip);
  v("log.timeline_steps", c.log.timeline_steps);
  v("check.every", c.check.every);
  v("check.finite", c.check.finite);
  v("debug.fault", c.debug.fault);
  v("debug.rank", c.debug.rank);
  v("debug.step", c.debug.step);
  v("debug.param", c.debug.param);
  v("emulate.compute_ms", c.emulate.compute_ms);
  v("emulate.forward_fraction", c.emulate.forward_fraction);
  v("cuda.conv_algos", c.cuda.conv_algos);
  v("cuda.deterministic", c.cuda.deterministic);
  v("cuda.workspace_mib", c.cuda.workspace_mib);
  v("cuda.algo_cache", c.cuda.algo_cache);
  v("seed", c.seed);
  v("backend", c.backend);
  v("threads", c.threads);
  v("run_dir", c.run_dir);
}

// --- reading one value -------------------------------------------------------------------------

[[noreturn]] void bad_type(const std::string& at, const std::string& key, const char* want,
                           const YAML::Node& n) {
  std::string got = n.IsScalar()     ? "'" + n.Scalar() + "'"
                    : n.IsSequence() ? str_cat("a list of ", n.size())
                    : n.IsMap()      ? "a mapping"
                                     : "nothing";
  throw ConfigError(str_cat(at, ": key '", key, "' expects ", want, ", got ", got));
}

template <class T>
T scalar_as(const YAML::Node& n, const std::string& at, const std::string& key, const char* want) {
  if (!n.IsScalar()) bad_type(at, key, want, n);
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    bad_type(at, key, want, n);
  }
}

void read_value(const YAML::Node& n, std::string& f, const std::string& at, const std::string& k) {
  f = n.IsNull() ? std::string() : scalar_as<std::string>(n, at, k, "a string");
  // Control characters (a stray carriage return, say) would not survive the printed copy of the
  // config that checkpoints keep, so a resumed run would read another value.
  for (unsigned char c : f)
    if (c < 0x20 || c == 0x7f)
      throw ConfigError(str_cat(at, ": key '", k, "': control character ", static_cast<int>(c),
                                " in a text value"));
}
void read_value(const YAML::Node& n, bool& f, const std::string& at, const std::string& k) {
  f = scalar_as<bool>(n, at, k, "true or false");
}
void read_value(const YAML::Node& n, int& f, const std::string& at, const std::string& k) {
  f = scalar_as<int>(n, at, k, "an integer");
}
void read_value(const YAML::Node& n, int64_t& f, const std::string& at, const std::string& k) {
  f = scalar_as<int64_t>(n, at, k, "an integer");
}
void read_value(const YAML::Node& n, uint64_t& f, const std::string& at, const std::string& k) {
  // yaml-cpp reads "-1" as a huge unsigned number; refuse it instead.
  if (n.IsScalar() && !n.Scalar().empty() && n.Scalar()[0] == '-')
    bad_type(at, k, "a non-negative integer", n);
  f = scalar_as<uint64_t>(n, at, k, "a non-negative integer");
}
void read_value(const YAML::Node& n, double& f, const std::string& at, const std::string& k) {
  f = scalar_as<double>(n, at, k, "a number");
}
void read_value(const YAML::Node& n, float& f, const std::string& at, const std::string& k) {
  f = scalar_as<float>(n, at, k, "a number");
}
void read_value(const YAML::Node& n, std::vector<double>& f, const std::string& at,
                const std::string& k) {
  if (!n.IsSequence()) bad_type(at, k, "a list of numbers", n);
  f.clear();
  for (const auto& e : n) f.push_back(scalar_as<double>(e, at, k, "a list of numbers"));
}
void read_value(const YAML::Node& n, std::vector<std::string>& f, const std::string& at,
                const std::string& k) {
  if (!n.IsSequence()) bad_type(at, k, "a list of names", n);
  f.clear();
  for (const auto& e : n) f.push_back(scalar_as<std::string>(e, at, k, "a list of names"));
}
void read_value(const YAML::Node& n, float (&f)[3], const std::string& at, const std::string& k) {
  if (!n.IsSequence() || n.size() != 3) bad_type(at, k, "a list of 3 numbers", n);
  for (size_t i = 0; i < 3; ++i) f[i] = scalar_as<float>(n[i], at, k, "a list of 3 numbers");
}
void read_value(const YAML::Node& n, std::vector<std::pair<std::string, double>>& f, const std::string& at,
                const std::string& k) {
  const char* want = "a mapping of tensor names to factors ({fc: 10})";
  if (n.IsNull()) {
    f.clear();
    return;
  }
  if (!n.IsMap()) bad_type(at, k, want, n);
  f.clear();
  for (auto it = n.begin(); it != n.end(); ++it) {
    std::string name = scalar_as<std::string>(it->first, at, k, want);
    // yaml-cpp keeps both entries of a name given twice; which would apply is not for us to guess.
    if (std::any_of(f.begin(), f.end(), [&](const auto& e) { return e.first == name; }))
      throw ConfigError(str_cat(at, ": key '", k, "': '", name, "' given twice: which factor was meant?"));
    // {fc:10} is one key "fc:10" without a value in YAML's flow style: a space is wanted.
    if (it->second.IsNull())
      throw ConfigError(str_cat(at, ": key '", k, "': '", name, "' has no factor",
                                name.find(':') != std::string::npos ? " (YAML needs a space after the colon: {fc: 10})"
                                                                    : " (name: factor, e.g. {fc: 10})"));
    f.emplace_back(std::move(name), scalar_as<double>(it->second, at, k, want));
  }
}
void read_value(const YAML::Node& n, data::Output& f, const std::string& at, const std::string& k) {
  const std::string s = scalar_as<std::string>(n, at, k, "float or u8");
  if (s == "float") f = data::Output::f32;
  else if (s == "u8") f = data::Output::u8;
  else throw ConfigError(str_cat(at, ": key '", k, "': '", s, "' is not float or u8"));
}
void read_value(const YAML::Node& n, data::Interpolation& f, const std::string& at, const std::string& k) {
  const std::string s = scalar_as<std::string>(n, at, k, "bilinear, bicubic or random");
  if (s == "bilinear") f = data::Interpolation::bilinear;
  else if (s == "bicubic") f = data::Interpolation::bicubic;
  else if (s == "random") f = data::Interpolation::random;
  else throw ConfigError(str_cat(at, ": key '", k, "': '", s, "' is not bilinear, bicubic or random"));
}
void read_value(const YAML::Node& n, data::AutoAugment& f, const std::string& at, const std::string& k) {
  const std::string s = scalar_as<std::string>(n, at, k, "an augmentation policy");
  try {
    f = data::auto_augment_from_string(s);
  } catch (const Error& e) {
    throw ConfigError(str_cat(at, ": key '", k, "': ", e.what()));
  }
}
void read_value(const YAML::Node& n, OptimizerKind& f, const std::string& at, const std::string& k) {
  const std::string s = scalar_as<std::string>(n, at, k, "sgd, adamw or lamb");
  for (OptimizerKind o : {OptimizerKind::sgd, OptimizerKind::adamw, OptimizerKind::lamb})
    if (s == optimizer_kind_name(o)) {
      f = o;
      return;
    }
  throw ConfigError(str_cat(at, ": key '", k, "': '", s, "' is not sgd, adamw or lamb"));
}
void read_value(const YAML::Node& n, LossKind& f, const std::string& at, const std::string& k) {
  const std::string s = scalar_as<std::string>(n, at, k, "cross_entropy or bce");
  for (LossKind o : {LossKind::softmax, LossKind::bce})
    if (s == loss_kind_name(o)) {
      f = o;
      return;
    }
  throw ConfigError(str_cat(at, ": key '", k, "': '", s, "' is not cross_entropy or bce"));
}
void read_value(const YAML::Node& n, ScheduleKind& f, const std::string& at, const std::string& k) {
  std::string s = scalar_as<std::string>(n, at, k, "a schedule kind");
  try {
    f = schedule_kind_from_string(s);
  } catch (const Error& e) {
    throw ConfigError(str_cat(at, ": key '", k, "': ", e.what()));
  }
}

// --- printing one value ------------------------------------------------------------------------

// Shortest text that reads back as the same double.
std::string number_text(double v) {
  // YAML's spellings: printf's "nan" and "inf" would read back as text, not numbers.
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[40];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

YAML::Node to_node(const std::string& f) { return YAML::Node(f); }
YAML::Node to_node(bool f) { return YAML::Node(f ? "true" : "false"); }
YAML::Node to_node(int f) { return YAML::Node(std::to_string(f)); }
YAML::Node to_node(int64_t f) { return YAML::Node(std::to_string(f)); }
YAML::Node to_node(uint64_t f) { return YAML::Node(std::to_string(f)); }
YAML::Node to_node(double f) { return YAML::Node(number_text(f)); }
// A float's shortest text that reads back as the same float (0.485, not 0.48500001430511475).
std::string float_text(float v) {
  if (!std::isfinite(v)) return number_text(v);
  char buf[40];
  for (int prec = 6; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, double(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return buf;
}
YAML::Node to_node(float f) { return YAML::Node(float_text(f)); }
YAML::Node to_node(ScheduleKind f) { return YAML::Node(schedule_kind_name(f)); }
YAML::Node to_node(OptimizerKind f) { return YAML::Node(optimizer_kind_name(f)); }
YAML::Node to_node(LossKind f) { return YAML::Node(loss_kind_name(f)); }
YAML::Node to_node(data::AutoAugment f) { return YAML::Node(data::auto_augment_name(f)); }
YAML::Node to_node(data::Interpolation f) {
  return YAML::Node(f == data::Interpolation::bicubic ? "bicubic" : f == data::Interpolation::random ? "random" : "bilinear");
}
YAML::Node to_node(data::Output f) { return YAML::Node(f == data::Output::u8 ? "u8" : "float"); }
template <class V>
YAML::Node seq_node(const V& values, size_t n) {
  YAML::Node s(YAML::NodeType::Sequence);
  for (size_t i = 0; i < n; ++i) s.push_back(number_text(values[i]));
  s.SetStyle(YAML::EmitterStyle::Flow);
  return s;
}
YAML::Node to_node(const std::vector<double>& f) { return seq_node(f, f.size()); }
YAML::Node to_node(const std::vector<std::string>& f) {
  YAML::Node s(YAML::NodeType::Sequence);
  for (const std::string& e : f) s.push_back(e);
  s.SetStyle(YAML::EmitterStyle::Flow);
  return s;
}
YAML::Node to_node(const float (&f)[3]) {
  YAML::Node s(YAML::NodeType::Sequence);
  for (float v : f) s.push_back(float_text(v));
  s.SetStyle(YAML::EmitterStyle::Flow);
  return s;
}
YAML::Node to_node(const std::vector<std::pair<std::string, double>>& f) {
  YAML::Node m(YAML::NodeType::Map);
  for (const auto& [name, factor] : f) m[name] = number_text(factor);
  m.SetStyle(YAML::EmitterStyle::Flow);
  return m;
}

// --- the tree walk -----------------------------------------------------------------------------

bool is_known(const std::string& key) {
  for (const auto& k : config_keys())
    if (k == key) return true;
  return false;
}
bool is_section(const std::string& prefix) {
  for (const auto& k : config_keys())
    if (k.rfind(prefix + ".", 0) == 0) return true;
  return false;
}
// "name, classes, width, ..." under a prefix ("" = top level), for unknown-key messages.
std::string keys_under(const std::string& prefix) {
  std::vector<std::string> seen;
  std::string p = prefix.empty() ? "" : prefix + ".";
  for (const auto& k : config_keys()) {
    if (k.rfind(p, 0) != 0) continue;
    std::string rest = k.substr(p.size());
    rest = rest.substr(0, rest.find('.'));
    if (std::find(seen.begin(), seen.end(), rest) == seen.end()) seen.push_back(rest);
  }
  std::string out;
  for (const auto& s : seen) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Edits (insertions, deletions, substitutions, swaps of neighbours) between a and b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// "unknown key 'train.bacth' (did you mean 'train.batch'? train takes: ...)": the list is of the
// longest section the key starts with, and the suggestion the known key (or section) nearest to
// it, case aside, if any is within two edits.
std::string unknown_key(const std::string& key) {
  std::string section;
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1))
    if (is_section(key.substr(0, dot))) section = key.substr(0, dot);
  std::string lower = key;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  std::string best;
  size_t best_d = 3;
  std::vector<std::string> names = config_keys();
  for (const auto& k : config_keys())  // the sections too ("trian: {...}")
    for (size_t dot = k.find('.'); dot != std::string::npos; dot = k.find('.', dot + 1)) names.push_back(k.substr(0, dot));
  for (const auto& k : names)
    if (const size_t d = edit_distance(lower, k); d < best_d) {
      best = k;
      best_d = d;
    }
  return str_cat("unknown key '", key, "' (", best.empty() ? "" : str_cat("did you mean '", best, "'? "),
                 section.empty() ? "top level" : section, " takes: ", keys_under(section), ")");
}

void assign(Config& cfg, const std::string& key, const YAML::Node& value, const std::string& at) {
  bool done = false;
  config_fields(cfg, [&](const char* k, auto& field) {
    if (done || key != k) return;
    read_value(value, field, at, key);
    done = true;
  });
  cfg.origin[key] = at;
}

std::string mark_at(const std::string& name, const YAML::Mark& m) {
  if (name.rfind("--set ", 0) == 0) return name;  // a --set's value is one line
  return str_cat(name, ":", m.line + 1);
}

// key -> where it was given, over the whole tree for values: a dotted key (train.batch: 8, as on
// the command line) must not silently meet its nested twin.
using Seen = std::map<std::string, std::string>;

void walk(Config& cfg, const YAML::Node& map, const std::string& prefix, const std::string& name, Seen& seen) {
  Seen here;  // this mapping's own keys, sections included: YAML forbids one twice
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string at = mark_at(name, it->first.Mark());
    if (!it->first.IsScalar()) throw ConfigError(str_cat(at, ": a key must be plain text"));
    if (it->first.Scalar() == "<<")
      throw ConfigError(str_cat(at, ": YAML merge keys ('<<') are not read here: write the keys out (an alias, *name, "
                                    "may stand for a whole section)"));
    const std::string key = (prefix.empty() ? "" : prefix + ".") + it->first.Scalar();
    // A section may be given in parts (data.generate.classes: 5, then data: {generate: {...}});
    // a value only once.
    if (const auto [first, fresh] = (is_known(key) ? seen : here).emplace(key, at); !fresh)
      throw ConfigError(str_cat(at, ": key '", key, "' given twice (first at ", first->second,
                                "): which one was meant?"));
    if (is_known(key)) {
      assign(cfg, key, it->second, at);
    } else if (is_section(key)) {
      if (!it->second.IsMap() && !it->second.IsNull())
        throw ConfigError(str_cat(at, ": key '", key, "' is a section and expects a mapping (",
                                  keys_under(key), ")"));
      if (it->second.IsMap()) walk(cfg, it->second, key, name, seen);
    } else {
      throw ConfigError(str_cat(at, ": ", unknown_key(key)));
    }
  }
}

}  // namespace

std::vector<std::string> config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    Config c;
    config_fields(c, [&](const char* k, auto&) { out.emplace_back(k); });
    return out;
  }();
  return keys;
}

Config config_parse(const std::string& yaml, const std::string& name,
                    const std::vector<std::string>& overrides) {
  Config cfg;
  cfg.source = name;
  YAML::Node root;
  try {
    // Every document: a second one ("---") would otherwise be dropped without a word.
    const std::vector<YAML::Node> docs = YAML::LoadAll(yaml);
    if (docs.size() > 1)
      throw ConfigError(str_cat(docs[1].Mark().line >= 0 ? mark_at(name, docs[1].Mark()) : name,
                                ": a second YAML document ('---'): a configuration is one mapping of keys"));
    if (!docs.empty()) root = docs[0];
  } catch (const YAML::ParserException& e) {
    throw ConfigError(str_cat(mark_at(name, e.mark), ": YAML syntax error: ", e.msg));
  }
  if (!root.IsNull()) {
    if (!root.IsMap()) throw ConfigError(str_cat(name, ": the configuration must be a mapping of keys"));
    Seen seen;
    walk(cfg, root, "", name, seen);
  }
  for (const auto& o : overrides) config_set(cfg, o);
  // Synthetic data labels as many classes as the model has unless told otherwise: a config for
  // 10 classes run with data.synthetic=true (a benchmark, tools/scaling --synthetic) just works.
  if (!cfg.origin.count("data.synthetic_classes")) {
    cfg.data.synthetic_classes = int(std::min<int64_t>(cfg.model.classes, std::numeric_limits<int>::max()));
    cfg.origin["data.synthetic_classes"] = name + " (default: model.classes)";
  }
  // fp16 gradients underflow without loss scaling (fp16's smallest normal is 2^-14), so
  // cuda-fp16 scales dynamically unless loss_scale.mode was given; an explicit none stays none.
  if (cfg.backend == "cuda-fp16" && !cfg.origin.count("loss_scale.mode")) {
    cfg.loss_scale.mode = "dynamic";
    cfg.origin["loss_scale.mode"] = name + " (default for backend cuda-fp16)";
  }
  // A GPU normalises 8-bit pixels itself (act_import_u8): a quarter of the bytes to upload and no
  // float pass on the loader's threads, so the cuda backends take u8 unless data.output was given.
  if (cfg.backend.rfind("cuda", 0) == 0 && !cfg.origin.count("data.output")) {
    cfg.data.output = data::Output::u8;
    cfg.origin["data.output"] = name + " (default for backend " + cfg.backend + ")";
  }
  return cfg;
}

Config config_load(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw ConfigError(str_cat(path, ": is a folder, not a config file"));
  std::ifstream f(path);
  if (!f) throw ConfigError(str_cat(path, ": cannot read the config file (", std::strerror(errno), ")"));
  std::stringstream ss;
  ss << f.rdbuf();
  Config cfg = config_parse(ss.str(), path, overrides);  // its errors first (a second document, say)
  // An empty file (a failed copy, the wrong path's twin) would train ResNet-50 on the defaults;
  // /dev/null is the way to say "no file, only --set".
  const YAML::Node root = YAML::Load(ss.str());
  if (path != "/dev/null" && (root.IsNull() || (root.IsMap() && root.size() == 0)))
    throw ConfigError(str_cat(path, ": the configuration is empty (no keys): is this the file meant? (--config "
                              "/dev/null for none, every key from --set)"));
  return cfg;
}

void config_set(Config& cfg, const std::string& assignment) {
  const std::string at = "--set " + assignment;
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(str_cat(at, ": expected key=value, e.g. --set train.batch=64"));
  const std::string key = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  const bool section = !is_known(key) && is_section(key);
  if (!is_known(key) && !section) {
    // Inside a key whose value is a whole mapping (optimizer.lr_mult.fc=5): that key is set whole.
    for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1))
      if (const std::string outer = key.substr(0, dot); is_known(outer)) {
        if (outer == "optimizer.lr_mult")
          throw ConfigError(str_cat(at, ": unknown key '", key, "': '", outer, "' takes its whole value, e.g. --set '",
                                    outer, "={", key.substr(dot + 1), ": ", text, "}'"));
        throw ConfigError(str_cat(at, ": unknown key '", key, "': '", outer, "' is one value, not a section (--set ",
                                  outer, "=VALUE)"));
      }
    throw ConfigError(str_cat(at, ": ", unknown_key(key)));
  }
  YAML::Node value;
  try {
    value = text.empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(str_cat(at, ": the value is not valid YAML: ", e.msg));
  }
  if (section) {  // --set 'model={name: resnet18, classes: 100}': the keys it names, the others kept
    if (!value.IsMap())
      throw ConfigError(str_cat(at, ": key '", key, "' is a section and expects a mapping (", keys_under(key), ")"));
    Seen seen;
    const auto before = cfg.origin;
    walk(cfg, value, key, at, seen);
    for (auto& [k, where] : cfg.origin)
      if (auto was = before.find(k); was == before.end() || was->second != where) where = "--set";
    return;
  }
  assign(cfg, key, value, at);
  cfg.origin[key] = "--set";
}

std::string config_changes(const std::string& other_yaml, const Config& now,
                           const std::function<bool(const std::string&)>& compared, const std::string& other_label,
                           const std::string& now_label) {
  Config then;
  try {
    then = config_parse(other_yaml, "saved");
  } catch (const Error&) {
    return "";
  }
  std::map<std::string, std::string> was;
  // Only keys the text sets: a weights file imported without a model records none, and the
  // defaults parsing fills in are not its values.
  config_fields(then, [&](const char* k, auto& f) {
    if (compared(k) && then.origin.count(k)) was[k] = YAML::Dump(to_node(f));
  });
  Config cur = now;  // config_fields hands out mutable references
  std::string out;
  config_fields(cur, [&](const char* k, auto& f) {
    const auto it = was.find(k);
    if (it == was.end()) return;
    const std::string v = YAML::Dump(to_node(f));
    if (v != it->second)
      out += str_cat(out.empty() ? "" : "; ", k, ": ", it->second, " ", other_label, ", ", v, " ", now_label);
  });
  return out;
}

std::vector<std::string> config_changed_keys(const Config& now) {
  Config defaults, cur = now;  // config_fields hands out mutable references
  std::map<std::string, std::string> was;
  config_fields(defaults, [&](const char* k, auto& f) { was[k] = YAML::Dump(to_node(f)); });
  std::vector<std::string> out;
  config_fields(cur, [&](const char* k, auto& f) {
    if (YAML::Dump(to_node(f)) != was[k]) out.emplace_back(k);
  });
  return out;
}

std::string config_model_changes(const std::string& saved_yaml, const Config& now) {
  return config_changes(
      saved_yaml, now, [](const std::string& k) { return k.rfind("model.", 0) == 0; }, "in the file", "here");
}

bool config_key_per_rank(const std::string& k) {
  static const std::set<std::string> keys = {
      "threads",  "data.threads", "data.queue_depth", "data.root", "data.train_list", "data.val_list",
      "data.train_shards", "data.val_shards", "run_dir", "checkpoint.dir", "cuda.algo_cache"};
  // comm.* has its own agreement check (comm_check_agreement), with the fields that must agree,
  // which runs later: the stall check's settings, which decide collectives before it, are
  // compared here. So is log.timeline*, whose timeline starts with a barrier.
  if (k.rfind("comm.stall_", 0) == 0 || k.rfind("log.timeline", 0) == 0) return false;
  return keys.count(k) || k.rfind("log.", 0) == 0 || k.rfind("data.generate.", 0) == 0 || k.rfind("comm.", 0) == 0;
}

std::string config_to_yaml(const Config& cfg_in) {
  Config cfg = cfg_in;  // config_fields hands out mutable references
  YAML::Node root(YAML::NodeType::Map);
  config_fields(cfg, [&](const char* k, auto& field) {
    std::vector<std::string> parts;
    std::stringstream ks(k);
    for (std::string p; std::getline(ks, p, '.');) parts.push_back(p);
    // Nested maps keep insertion order, so the output follows the table.
    std::vector<YAML::Node> path{root};
    for (size_t i = 0; i + 1 < parts.size(); ++i) path.push_back(path.back()[parts[i]]);
    path.back()[parts.back()] = to_node(field);
  });
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace rt::trainer

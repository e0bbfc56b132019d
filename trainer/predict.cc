// --predict: weights into a forward-only network at the evaluation side, images decoded as the
// validation loader decodes them, softmax and top-k on the host.
#include "trainer/predict.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "data/dataset.h"
#include "data/image.h"
#include "data/rng.h"
#include "nn/resnet.h"
#include "trainer/checkpoint.h"
#include "trainer/metrics.h"

namespace rt::trainer {
namespace {

// Every tensor of the network from the file (ema: from its moving average of the weights): by
// name and shape where the file lists them, else (an older file of this very model) the flat
// buffers as they are.
// Returns the file's class names (its "classes" section; empty in older files).
std::vector<std::string> load_every_tensor(const std::string& path, Net<float>& net, const std::string& model,
                                           bool ema) {
  Checkpoint ck = checkpoint_read(path, {.weights = true, .optimizer = false, .rank_state = false, .ema = ema});
  if (ema) {  // "ema" holds the parameters laid out like "params", then the statistics
    if (ck.ema.size() != ck.params.size() + ck.state.size())
      throw CheckpointError(str_cat(path, ": --ema: the file holds no moving average of the weights (a run with "
                                    "train.ema writes one)"));
    ck.params.assign(ck.ema.begin(), ck.ema.begin() + long(ck.params.size()));
    ck.state.assign(ck.ema.begin() + long(ck.params.size()), ck.ema.end());
  }
  Arena<float>& arena = net.arena();
  if (ck.layout.empty()) {
    if (ck.params.size() != arena.params().size() || ck.state.size() != arena.state().size())
      throw CheckpointError(str_cat(path, ": its ", ck.params.size(), " parameter values are not ", model, "'s ",
                                    arena.params().size(), " (and the file lists no tensors to match by name)"));
    arena.params_from_host(ck.params);
    arena.state_from_host(ck.state);
    return ck.classes;
  }
  HostView<float> params = arena.host_params(), state = arena.host_state();
  checkpoint_copy_whole(ck, arena, params.span(), state.span(), path, model, "--predict");
  params.commit();
  state.commit();
  return ck.classes;
}

}  // namespace

std::vector<Prediction> predict_files(const Config& cfg, const std::string& path,
                                      const std::vector<std::string>& files, int top_k, bool ema,
                                      std::vector<std::string>* saved_classes) {
  std::vector<Prediction> out(files.size());
  for (size_t i = 0; i < files.size(); ++i) out[i].file = files[i];
  if (files.empty()) return out;
  if (!data::have_image_decoder())
    throw Error("--predict: this build has no image decoder (OpenCV was not found when it was built)");
  const int side = data::eval_image_size(cfg.data);
  ResNetConfig r = config_resnet(cfg);
  r.image_size = side;
  r.batch = std::clamp<int64_t>(int64_t(files.size()), 1, config_eval_batch(cfg));
  r.inference_only = true;
  auto net = build_resnet<float>(r, make_backend<float>(cfg.backend, cfg.cuda));
  std::vector<std::string> saved = load_every_tensor(path, *net, cfg.model.name, ema);
  if (saved_classes) *saved_classes = std::move(saved);

  data::AugmentSpec spec =
      data::make_augment_spec(side, /*train=*/false, cfg.data.min_scale, cfg.data.max_scale, false, cfg.data.mean,
                              cfg.data.std);
  spec.resize = data::eval_resize(cfg.data);
  spec.interpolation = cfg.data.eval_interpolation;
  data::DecodeScratch scratch;
  data::Rng rng(0);  // evaluation's centre crop draws nothing
  const size_t per_image = size_t(3) * size_t(side) * size_t(side);
  const int64_t classes = cfg.model.classes;
  const bool bce = cfg.train.loss == LossKind::bce;
  const int k = int(std::min<int64_t>(top_k, classes));
  std::vector<float> images(size_t(r.batch) * per_image), logits(size_t(r.batch * classes));
  std::vector<size_t> slot_of;  // the files in the batch being filled
  auto run_batch = [&] {
    net->forward(images.data(), Targets(), false);
    net->export_tensor(net->logits(), logits.data());
    for (size_t s = 0; s < slot_of.size(); ++s) {
      const float* z = logits.data() + s * size_t(classes);
      const double zmax = *std::max_element(z, z + classes);
      double sum = 0;
      for (int64_t c = 0; c < classes; ++c) sum += std::exp(double(z[c]) - zmax);
      // A model trained with BCE answers each class on its own: its sigmoid, not the softmax.
      auto prob = [&](int32_t c) {
        return bce ? 1 / (1 + std::exp(-double(z[c]))) : std::exp(double(z[c]) - zmax) / sum;
      };
      std::vector<int32_t> order(static_cast<size_t>(classes));
      std::iota(order.begin(), order.end(), 0);
      // Ties to the lower class, as evaluation's top-k counts them.
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
      Prediction& p = out[slot_of[s]];
      for (int j = 0; j < k; ++j) {
        p.classes.push_back(order[size_t(j)]);
        p.probs.push_back(prob(order[size_t(j)]));
      }
    }
    slot_of.clear();
  };
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i < files.size(); ++i) {
    Prediction& p = out[i];
    if (!data::read_file(files[i], bytes)) {
      p.error = "cannot read the file";
      continue;
    }
    float* slot = images.data() + slot_of.size() * per_image;
    if (!data::decode_augment(bytes.data(), bytes.size(), spec, rng, scratch, slot, nullptr)) {
      int w = 0, h = 0;
      bool jpeg = false;
      p.error = data::header_problem(bytes.data(), bytes.size(), &w, &h, &jpeg);
      if (p.error.empty()) p.error = "the image does not decode";
      continue;
    }
    slot_of.push_back(i);
    if (int64_t(slot_of.size()) == r.batch) run_batch();
  }
  if (!slot_of.empty()) run_batch();  // the rest of the batch holds earlier images: not read back
  return out;
}

std::vector<std::string> predict_class_names(const Config& cfg, const std::vector<std::string>& saved,
                                             const std::string& path) {
  if (!saved.empty()) return saved;
  // An older file, or one imported from PyTorch: the dataset's folders, where it is here and
  // has as many classes as the model (a folder added or removed since would shift every name).
  // List files name classes by number anyway; otherwise numbers are a fallback, and said so.
  if (!cfg.data.train_list.empty()) return {};
  const auto by_number = [&](const std::string& why) {
    std::fprintf(stderr, "ringtrain: --predict: classes by number: %s names none, %s\n", path.c_str(), why.c_str());
    return std::vector<std::string>{};
  };
  if (cfg.data.synthetic || cfg.data.root.empty())
    return by_number("and no dataset folder is given to name them (--set data.root=PATH: its train/ class folders)");
  std::vector<std::string> names;
  try {
    names = data::folder_classes(cfg.data.root);
  } catch (const Error& e) {
    return by_number(str_cat("and data.root cannot name them (", e.what(), ")"));
  }
  if (int64_t(names.size()) == cfg.model.classes) return names;
  return by_number(str_cat("and ", cfg.data.root, "/train has ", names.size(), " class folders for the model's ",
                           cfg.model.classes, " classes"));
}

std::string prediction_line(const Prediction& p, const std::vector<std::string>& names) {
  if (!p.error.empty()) return str_cat(p.file, ": ", p.error);
  std::string line = p.file + ":";
  for (size_t j = 0; j < p.classes.size(); ++j) {
    const int32_t c = p.classes[j];
    const std::string name = size_t(c) < names.size() ? names[size_t(c)] : std::to_string(c);
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.2f", 100 * p.probs[j]);
    line += str_cat(j ? ", " : " ", name, " (", pct, " %)");
  }
  return line;
}

std::vector<std::string> predict_inputs(const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& a : args) {
    std::error_code ec;
    if (!fs::is_directory(a, ec)) {
      files.push_back(a);  // read, or named as unreadable, as it comes
      continue;
    }
    std::vector<std::string> found;
    for (auto it = fs::recursive_directory_iterator(a, fs::directory_options::follow_directory_symlink, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec) && data::is_image_file(it->path().string())) found.push_back(it->path().string());
    if (ec) throw ConfigError(str_cat("--predict: cannot list the folder ", a, " (", ec.message(), ")"));
    if (found.empty())
      throw ConfigError(str_cat("--predict: the folder ", a, " holds no .jpg, .jpeg or .png file (searched recursively)"));
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

namespace {
// A CSV field, quoted where it holds a comma, a quote or a line break (RFC 4180).
std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\r\n") == std::string::npos) return v;
  std::string out = "\"";
  for (char c : v) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}
}  // namespace

void predict_output_check(const std::string& path) {
  if (!path.ends_with(".csv") && !path.ends_with(".jsonl"))
    throw ConfigError(str_cat("command line: --output ", path, ": name a .csv or a .jsonl file"));
}

void write_predictions(const std::string& path, const std::vector<Prediction>& ps,
                       const std::vector<std::string>& names, int top_k) {
  const bool csv = path.ends_with(".csv");
  const auto name_of = [&](int32_t c) { return size_t(c) < names.size() ? names[size_t(c)] : std::to_string(c); };
  std::string text;
  if (csv) {
    text = "file";
    for (int j = 1; j <= top_k; ++j) text += str_cat(",class_", j, ",prob_", j);
    text += ",error\n";
  }
  for (const Prediction& p : ps) {
    if (csv) {
      text += csv_field(p.file);
      for (int j = 0; j < top_k; ++j) {
        if (size_t(j) < p.classes.size()) {
          char prob[32];
          std::snprintf(prob, sizeof prob, "%.6g", p.probs[size_t(j)]);
          text += str_cat(",", csv_field(name_of(p.classes[size_t(j)])), ",", prob);
        } else {
          text += ",,";
        }
      }
      text += "," + csv_field(p.error) + "\n";
      continue;
    }
    JsonLine line("prediction");
    line.add("file", p.file);
    if (!p.error.empty()) {
      line.add("error", p.error);
    } else {
      std::vector<std::string> classes;
      for (int32_t c : p.classes) classes.push_back(name_of(c));
      line.add("classes", classes).add("probs", p.probs);
    }
    text += line.str() + "\n";
  }
  const std::string tmp = path + ".tmp";
  int err = 0;
  if (FILE* f = std::fopen(tmp.c_str(), "wb")) {
    if (std::fwrite(text.data(), 1, text.size(), f) != text.size()) err = errno;
    if (std::fclose(f) != 0 && !err) err = errno;
    if (!err && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
    if (!err) return;
    std::remove(tmp.c_str());
  } else {
    err = errno;
  }
  throw Error(str_cat("--predict: cannot write ", path, " (", std::strerror(err), ")"));
}

}  // namespace rt::trainer

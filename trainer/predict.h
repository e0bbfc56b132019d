// --predict: a trained model's best classes for image files, each prepared as the validation
// split's images are (data.eval_image_size, data.eval_resize, data.mean/std), on one process.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config.h"

namespace rt::trainer {

struct Prediction {
  std::string file;
  std::string error;              // why the file was not classified; "" when it was
  std::vector<int32_t> classes;   // best first
  std::vector<double> probs;      // each one's probability: the softmax's (train.loss bce: the sigmoid's)
};

// The top_k classes (fewer where the model has fewer) of each file by the weights in `path`, a
// checkpoint or weights file that must hold every tensor of cfg's model (ema: its moving average
// of the weights, train.ema's, instead). A file that cannot be read or decoded gets its error and
// no classes; a bad weights file throws CheckpointError naming it. The file's class names (its
// "classes" section, empty in older files) go to saved_classes where given.
std::vector<Prediction> predict_files(const Config& cfg, const std::string& path,
                                      const std::vector<std::string>& files, int top_k, bool ema = false,
                                      std::vector<std::string>* saved_classes = nullptr);

// The names of the classes of the model in `path`, in label order: those its training data named
// (`saved`, from predict_files), else, for an older or imported file, cfg's folder dataset's
// train/ subfolders where they are as many as the model's classes; else empty (by number).
std::vector<std::string> predict_class_names(const Config& cfg, const std::vector<std::string>& saved,
                                             const std::string& path);

// "file: name (p %), name (p %), ..." or "file: error"; names[i] for class i where known, else i.
std::string prediction_line(const Prediction& p, const std::vector<std::string>& names);

// --predict's arguments as image files: a file as it is; a folder, the .jpg, .jpeg and .png files
// under it (recursively, sorted by path). Throws ConfigError naming a folder that holds none.
std::vector<std::string> predict_inputs(const std::vector<std::string>& args);

// Whether `path` names a kind of file write_predictions writes (.csv, .jsonl); throws ConfigError
// saying which otherwise.
void predict_output_check(const std::string& path);

// The predictions as a file, for programs: CSV (".csv": a header, then file, class_1, prob_1, ...
// class_k, prob_k, error per line) or JSON lines (".jsonl": {"type":"prediction","file":...,
// "classes":[...],"probs":[...]}, or "error" instead of the last two), classes by name where
// known, probabilities as fractions. Written beside and renamed: never half a file. Throws
// rt::Error naming the path when it cannot be written.
void write_predictions(const std::string& path, const std::vector<Prediction>& ps,
                       const std::vector<std::string>& names, int top_k);

}  // namespace rt::trainer

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

}  // namespace rt::trainer

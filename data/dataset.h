// Datasets of encoded images by global sample index: an ImageNet-layout folder, a list file or a
// packed shard set (shard.h). Only the index (paths or offsets, labels) is kept in memory; bytes
// are read on demand by the decode threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/loader.h"

namespace rt::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual const std::vector<std::string>& class_names() const = 0;
  int num_classes() const { return static_cast<int>(class_names().size()); }
  virtual int32_t label(int64_t i) const = 0;
  // Reads sample i's encoded bytes into buf (resized); false when the file cannot be read.
  // Thread-safe. Throws rt::Error for damage to a packed shard (bad checksum), which is not an
  // image problem but a storage one.
  virtual bool read(int64_t i, std::vector<uint8_t>& buf) const = 0;
  // Where sample i comes from, for messages (a path; a shard file and record for shards).
  virtual std::string name(int64_t i) const = 0;
  // Loader::order_hash(): the labels and file names (the last part of name(i)) in sample order
  // (order_hash_add from kOrderHashSeed), never 0. A folder and its shard set hash alike.
  virtual uint64_t order_hash() const;
};

constexpr uint64_t kOrderHashSeed = 0x6f72646572ull;
// One sample's step of order_hash(): its label and the part of `path` after the last '/'.
uint64_t order_hash_add(uint64_t h, int32_t label, std::string_view path);

// True for .jpg, .jpeg, .png in any letter case.
bool is_image_file(const std::string& path);

// Reads a whole regular file into buf with one open and (usually) one read; false on any failure.
bool read_file(const std::string& path, std::vector<uint8_t>& buf);

// root/<split>/<class>/**/*.{jpg,jpeg,png}: classes are the sorted folder names of root/train
// (also for val, as torchvision's ImageFolder would see them); files sorted by path within a
// class. Errors name the path: missing folder, empty class folder, no images, a val class that
// train lacks.
// Where root has no train/ and `known` names classes, they label the split (evaluating on a
// validation folder alone; every class folder there must be one of them).
std::unique_ptr<Dataset> open_folder(const std::string& root, Split split,
                                     const std::vector<std::string>& known = {});

// The sorted class folder names of root/train (what labels index).
std::vector<std::string> folder_classes(const std::string& root);

// A list file: "path label" per line, '#' comments and blank lines ignored, paths relative to the
// list file's folder unless absolute (the label is the last field, so paths may contain spaces).
// Labels are integers in [0, kMaxListLabel]. num_classes >= max label + 1 (pass 0 to use max
// label + 1). Bad lines name file:line.
constexpr int32_t kMaxListLabel = (1 << 20) - 1;
std::unique_ptr<Dataset> open_list(const std::string& path, int num_classes = 0);

// Largest label in a list file (-1 when empty); used to agree on a class count across splits.
int32_t list_max_label(const std::string& path);

// The dataset the config names for a split: shards, else list, else folder.
std::unique_ptr<Dataset> open_dataset(const DataConfig& cfg, Split split);

// Where a split's samples come from, for messages: "shard set P", "list file P", "folder R/val"
// or "synthetic data".
std::string split_source(const DataConfig& cfg, Split split);

// Labels must mean the same classes in both splits. Where both splits name their classes (folders,
// shard sets: each keeps the names it was made with), the names must be equal, in order; a list
// file or synthetic data names none, so there the validation split may only have no more classes.
// Throws rt::Error naming both sources and the first difference.
void check_split_classes(const DataConfig& cfg, const std::vector<std::string>& train,
                         const std::vector<std::string>& val);
// Where two class lists first differ, for messages: "label 3 is 'c3' <in_a>, 'd3' <in_b>" ('none'
// past a list's end).
std::string first_class_difference(const std::vector<std::string>& a, const std::vector<std::string>& b,
                                   const std::string& in_a, const std::string& in_b);

}  // namespace rt::data

// ResNet builders: torchvision's ImageNet ResNets (v1.5: stride on the 3x3), ResNeXts and wide
// ResNets, timm's squeeze-and-excitation variants of them (SE-ResNet, SE-ResNeXt), ResNet-Ds (deep
// stem, average-pooled shortcut) and ECA-ResNets (efficient channel attention), and He et al.'s
// CIFAR ResNets, with torchvision's (timm's)
// parameter names and torchvision's initialisation.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "nn/net.h"

namespace rt {

struct ResNetConfig {
  std::string name = "resnet50";   // resnet18/34/50/101/152, resnext50_32x4d, resnext101_32x8d,
                                   //   resnext101_32x4d, resnext101_64x4d, wide_resnet50_2,
                                   //   wide_resnet101_2, SE variants (timm's): seresnet18/34/50/
                                   //   101/152, seresnext50_32x4d, seresnext101_32x4d/32x8d/64x4d,
                                   //   ResNet-Ds (timm's): resnet18d/26d/34d/50d/101d/152d,
                                   //   resnext50d_32x4d, seresnext26d_32x4d, resnet26t/50t, ECA-
                                   //   ResNets (timm's): ecaresnet26t/50d/50t/101d, ecaresnetlight,
                                   //   resnet20/32/44/56/110 (CIFAR)
  int64_t num_classes = 1000;
  int64_t image_size = 224;        // square input side
  int64_t batch = 32;              // per-rank batch the network is set up for
  double width = 1.0;              // multiplies every channel count (64.. or 16..)
  bool zero_init_residual = false; // gamma = 0 on the last BN of each residual branch
  std::string cifar_shortcut = "A";// CIFAR only: A = zero-padded identity, B = 1x1 projection
  LossSpec loss = {};              // softmax cross-entropy or BCE, label smoothing
  double drop_path = 0.0;          // stochastic depth: the last block's rate, 0 in the first,
                                   //   linear between (timm's drop_path_rate); 0 = none
  uint64_t seed = 0;               // initialisation seed
  bool inference_only = false;     // forward only (Net::set_inference_only): evaluation's network
  bool layout_only = false;        // the graph and its parameters' names and shapes, nothing
                                   //   allocated or initialised (Net::finalize not run, so the
                                   //   network cannot run): sizes of big models in no time
  // Every batch norm's training statistics over this group of ranks (model.bn_group; null: over
  // this rank's batch alone).
  std::shared_ptr<BnSync> bn_sync = {};
};

// Throws rt::Error for an unknown name or a bad class count / size / width.
template <class T>
std::unique_ptr<Net<T>> build_resnet(const ResNetConfig& cfg, std::unique_ptr<Backend<T>> backend);

// torchvision's initialisation: Kaiming-normal (fan_out, ReLU gain) convolutions, BN gamma 1 /
// beta 0 (gamma 0 on the last BN of each branch with zero_init_residual), nn.Linear's default
// uniform(+-1/sqrt(fan_in)) for the classifier; running mean 0, running variance 1.
template <class T>
void init_resnet(Net<T>& net, uint64_t seed, bool zero_init_residual);

// True for the names build_resnet knows.
bool is_resnet_name(const std::string& name);
// True for the CIFAR ResNets (resnet20/32/44/56/110), which read ResNetConfig::cifar_shortcut.
bool is_cifar_resnet(const std::string& name);

}  // namespace rt

// The per-layer profile of a Net (Net::set_profiling) as the benchmarks print it: one PROFILE line
// per layer, one PROFILE_KIND line per kind of layer, and the profiled step's total.
#pragma once
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "nn/net.h"

namespace rt::tools {

// Times per step (averaged over the profiled calls). A layer's kind is the last part of its name
// without digits ("layer2.1.conv2" is a conv, a fused "layer2.1.bn3+add" a bn+add); members of a
// sequence ("conv1.3", "layer2.0.downsample.1") by their first tensor (none: ResNet-D's pool).
inline void print_profile(const Net<float>& net) {
  const auto& t = net.node_times();
  std::map<std::string, std::pair<double, double>> kinds;
  double total = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i].calls == 0) continue;
    const auto& n = net.node(i);
    const double f = t[i].forward_s / double(t[i].calls), b = t[i].backward_s / double(t[i].calls);
    std::string kind = n.name.substr(n.name.rfind('.') + 1);
    kind.erase(std::remove_if(kind.begin(), kind.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); }),
               kind.end());
    if (kind.empty() || kind == "downsample") {  // "conv1.3", "layer2.0.downsample.1": by what it holds
      const auto k = n.params.empty() ? std::optional<ParamKind>() : net.arena().info(n.params[0]).kind;
      kind = !k ? "avgpool" : k == ParamKind::conv_weight ? "conv" : k == ParamKind::bn_gamma ? "bn" : "other";
    }
    kinds[kind].first += f;
    kinds[kind].second += b;
    total += f + b;
    std::printf("PROFILE,%s,fwd_ms=%.3f,bwd_ms=%.3f,gflops=%.1f\n", n.name.c_str(), f * 1e3, b * 1e3,
                n.flops > 0 ? n.flops * 3 / (f + b) / 1e9 : 0.0);
  }
  for (auto& [k, v] : kinds)
    std::printf("PROFILE_KIND,%s,fwd_ms=%.1f,bwd_ms=%.1f,share=%.1f%%\n", k.c_str(), v.first * 1e3,
                v.second * 1e3, total > 0 ? 100 * (v.first + v.second) / total : 0.0);
  std::printf("PROFILE_TOTAL,layers_ms=%.1f\n", total * 1e3);
}

}  // namespace rt::tools

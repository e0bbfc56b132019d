// The oneDNN CPU backend (fp32): primitives created once per shape, blocked layouts kept end to end.
#pragma once
#include <memory>

#include "nn/ops.h"

namespace rt {

std::unique_ptr<Backend<float>> make_onednn_backend();

}  // namespace rt

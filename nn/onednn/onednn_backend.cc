// Placeholder until the oneDNN backend lands.
#include "nn/onednn/onednn_backend.h"
namespace rt {
std::unique_ptr<Backend<float>> make_onednn_backend() { throw Error("onednn backend not built yet"); }
}  // namespace rt

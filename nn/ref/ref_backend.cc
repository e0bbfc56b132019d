// Placeholder until the reference backend lands.
#include "nn/ref/ref_backend.h"
namespace rt {
template <class T>
std::unique_ptr<Backend<T>> make_reference_backend() { throw Error("reference backend not built yet"); }
template std::unique_ptr<Backend<float>> make_reference_backend<float>();
template std::unique_ptr<Backend<double>> make_reference_backend<double>();
}  // namespace rt

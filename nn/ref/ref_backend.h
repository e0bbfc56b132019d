// The reference backend: plain loops over NCHW, float or double. The oracle for every test.
#pragma once
#include <memory>

#include "nn/ops.h"

namespace rt {

template <class T>
std::unique_ptr<Backend<T>> make_reference_backend();

}  // namespace rt

// Typed errors thrown by library code; main() catches them, prints one line, and aborts all ranks.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace rt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad shapes or arguments given to a layer or model builder (names the layer and the shapes).
class ShapeError : public Error {
 public:
  using Error::Error;
};

// A backend's memory (a GPU's, or page-locked host memory) cannot hold what was asked for. The
// message says how much was asked and, where known, how much was free; the trainer adds which
// setting to lower.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// Concatenates its arguments with operator<< into one message.
template <class... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

}  // namespace rt

// Throws rt::ShapeError with a formatted message when cond does not hold.
#define RT_SHAPE_CHECK(cond, ...) \
  do {                            \
    if (!(cond)) throw ::rt::ShapeError(::rt::str_cat(__VA_ARGS__)); \
  } while (0)

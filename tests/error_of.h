// For tests of error messages: what f throws, as text.
#pragma once
#include <string>

#include "nn/error.h"

namespace rt_test {

// The message of the E (rt::Error unless named) that f throws, or "" when it throws none. Other
// exceptions pass through, failing the test, so a test that names a narrower E also checks the kind.
template <class E = rt::Error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace rt_test

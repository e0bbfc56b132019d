// Command-line numbers for the tools: the whole text must be one number, in range. (atoi and
// strtoll read "1abc" as 1, "abc" as 0, and a value past the type's range wraps or saturates.)
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "nn/error.h"

namespace rt::tools {

// The integer all of `text` is, when in [lo, hi]; else nothing.
inline std::optional<long long> parse_int(const std::string& text, long long lo, long long hi) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno || *end || v < lo || v > hi) return std::nullopt;
  return v;
}

// The unsigned 64-bit integer all of `text` is (a seed), else nothing.
inline std::optional<unsigned long long> parse_u64(const std::string& text) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno || *end) return std::nullopt;
  return v;
}

// The finite number all of `text` is, when in [lo, hi]; else nothing.
inline std::optional<double> parse_real(const std::string& text, double lo, double hi) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (errno || *end || !std::isfinite(v) || v < lo || v > hi) return std::nullopt;
  return v;
}

// An option's value by the above, or rt::Error naming the option, its range and the value (the
// MPI tools' way: the error ends every rank).
inline long long int_option(const std::string& name, const std::string& v, long long lo, long long hi) {
  const auto x = parse_int(v, lo, hi);
  if (!x) throw Error(str_cat("option ", name, " takes an integer in [", lo, ", ", hi, "], not '", v, "'"));
  return *x;
}
inline double real_option(const std::string& name, const std::string& v, double lo, double hi) {
  const auto x = parse_real(v, lo, hi);
  if (!x) throw Error(str_cat("option ", name, " takes a number in [", lo, ", ", hi, "], not '", v, "'"));
  return *x;
}

}  // namespace rt::tools

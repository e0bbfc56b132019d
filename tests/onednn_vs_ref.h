// The oneDNN backend against the reference backend, shared by test_onednn_vs_ref.cc and
// test_onednn_conv_vs_ref.cc: the activation block a test program forces, an elementwise
// comparison scaled to the tensor, and a fixture with both backends and the layout conversions.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "nn/ops.h"

namespace rt::test {

using Vec = std::vector<float>;
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// RT_TEST_ONEDNN_BLOCK (8 or 16) forces the activation channel block, so that both layouts are
// tested on any processor (ctest registers the programs that use this under each); unset: the
// processor's.
inline BackendOptions onednn_options() {
  BackendOptions o;
  if (const char* b = std::getenv("RT_TEST_ONEDNN_BLOCK")) o.onednn_block = std::atoi(b);
  return o;
}

// Elements differing by more than atol + rtol |want|, where atol is a fraction of the largest
// |want| (float sums of many terms err in proportion to the magnitude of the sum, not of the
// element). A NaN in got (an element never written) always fails.
inline void expect_close(const Vec& got, const Vec& want, const std::string& what, double rtol = 1e-3,
                  double atol_frac = 1e-4) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_abs = 0;
  for (float v : want) max_abs = std::max(max_abs, double(std::fabs(v)));
  const double atol = atol_frac * std::max(max_abs, 1e-3);
  int bad = 0;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const bool ok = err <= atol + rtol * std::fabs(double(want[i]));
    if (!ok) {
      ++bad;
      if (!(err <= worst)) worst = err, worst_i = i;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ; worst at "
                    << worst_i << ": got " << got[worst_i] << ", want " << want[worst_i]
                    << " (atol " << atol << ")";
}

class OnednnVsRef : public ::testing::Test {
 protected:
  Vec rand(size_t n, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> u(lo, hi);
    Vec v(n);
    for (auto& x : v) x = u(rng_);
    return v;
  }
  // NCHW -> the fast backend's layout, and back.
  Vec to_fast(const Vec& nchw, const Shape& s) const {
    Vec v(fast_->act_size(s), kNaN);
    fast_->act_import(nchw.data(), s, v.data());
    return v;
  }
  Vec from_fast(const Vec& v, const Shape& s) const {
    Vec out(size_t(s.numel()), kNaN);
    fast_->act_export(v.data(), s, out.data());
    return out;
  }
  Vec fast_buf(const Shape& s) const { return Vec(fast_->act_size(s), kNaN); }

  std::unique_ptr<Backend<float>> fast_ = make_backend<float>("onednn", onednn_options());
  std::unique_ptr<Backend<float>> ref_ = make_backend<float>("reference");
  std::mt19937 rng_{20240611};
};

}  // namespace rt::test

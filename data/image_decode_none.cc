// data/image.h's decoder in builds without OpenCV (GPU-only builds, tools/gpu_check.sh): the
// loader accepts only synthetic data there, and a decode that still gets here is an error.
#include "data/image.h"
#include "nn/error.h"

namespace rt::data {

struct DecodeScratch::Mats {};

DecodeScratch::DecodeScratch() : m_(std::make_unique<Mats>()) {}
DecodeScratch::~DecodeScratch() = default;

bool have_image_decoder() { return false; }

void decode_thread_init() {}

bool decode_augment(const uint8_t*, size_t, const AugmentSpec&, Rng&, DecodeScratch&, float*,
                    uint8_t*) {
  throw Error("data: this build has no image decoder (OpenCV was not found when it was built); "
              "only data.synthetic works");
}

}  // namespace rt::data

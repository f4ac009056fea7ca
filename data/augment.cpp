// Random crop with zero padding and horizontal flip, as one gather from the source image.
#include "data/augment.h"

#include "core/error.h"
#include "core/rng.h"

namespace dptrain::data {

uint64_t augmentation_key(uint64_t seed, int64_t epoch, int64_t sample) {
  // Two rounds of splitmix64 over (seed, epoch, sample): cheap per sample, and no two (epoch, sample)
  // pairs share a stream in practice.
  const uint64_t state = derive_seed(seed, "augmentation") ^ static_cast<uint64_t>(epoch);
  const uint64_t mixed = splitmix64_draw(state, 0) ^ static_cast<uint64_t>(sample);
  return splitmix64_draw(mixed, 1);
}

void augment_sample(const Augmentation& a, const Shape& shape, uint64_t key, const float* in, float* out) {
  DPTRAIN_CHECK(shape.size() == 3, "data augmentation needs [C, H, W] samples, these are ", shape_str(shape));
  const int64_t channels = shape[0], height = shape[1], width = shape[2];
  Rng rng(key);
  int64_t dy = 0, dx = 0;  // where the crop's corner falls in the unpadded image
  if (a.crop_padding > 0) {
    const uint64_t span = static_cast<uint64_t>(2 * a.crop_padding + 1);
    dy = static_cast<int64_t>(rng.below(span)) - a.crop_padding;
    dx = static_cast<int64_t>(rng.below(span)) - a.crop_padding;
  }
  const bool flip = a.horizontal_flip && rng.below(2) == 1;
  for (int64_t c = 0; c < channels; ++c) {
    const float* plane = in + c * height * width;
    for (int64_t y = 0; y < height; ++y) {
      float* row = out + (c * height + y) * width;
      const int64_t sy = y + dy;
      for (int64_t x = 0; x < width; ++x) {
        const int64_t sx = (flip ? width - 1 - x : x) + dx;
        row[x] = sy >= 0 && sy < height && sx >= 0 && sx < width ? plane[sy * width + sx] : 0.0f;
      }
    }
  }
}

}  // namespace dptrain::data

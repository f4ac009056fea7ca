// Training-time augmentation of one sample, keyed by (seed, epoch, sample index) so that what a sample
// becomes does not depend on which worker, thread or rank reads it: resumes and deterministic mode
// stay bitwise.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dptrain::data {

struct Augmentation {
  // random_crop: pad every side with this many zero pixels, then crop back to H x W at a uniformly
  // drawn offset (torchvision's RandomCrop(size, padding)); 0: no crop.
  int64_t crop_padding = 0;
  bool horizontal_flip = false;  // mirror with probability 1/2 (RandomHorizontalFlip)

  bool any() const { return crop_padding > 0 || horizontal_flip; }
};

uint64_t augmentation_key(uint64_t seed, int64_t epoch, int64_t sample);

// `in` and `out` are C x H x W (`shape`), distinct buffers, pixels before normalisation (so padding
// is black, as torchvision pads the image before ToTensor). The crop's offsets are drawn first, then
// the flip, from Rng(key).
void augment_sample(const Augmentation& augmentation, const Shape& shape, uint64_t key, const float* in,
                    float* out);

}  // namespace dptrain::data

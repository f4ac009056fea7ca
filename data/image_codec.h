// Image files in memory: PNG (libpng) and JPEG (libjpeg-turbo) decoding and encoding, and the channel,
// resize and crop steps that the "image_folder" format applies (as PIL and torchvision do).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dptrain::data {

struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;  // height x width x channels, interleaved
};

// The largest height and width decode_image accepts.
inline constexpr int64_t kMaxImageSide = 16384;

// Decodes a PNG or JPEG file, told apart by its signature, to 8-bit grey (1 channel) or RGB (3):
// palettes are expanded, 16-bit samples keep their high byte and alpha is dropped (PIL's
// convert("RGB") and convert("L") do the same). Throws BadSample whose message starts with `name` for
// anything but a whole, valid image: a truncated or corrupt file (libjpeg's and libpng's warnings
// included), an unsupported one (CMYK JPEG), a size of 0 or over kMaxImageSide, or another format.
Image decode_image(std::span<const uint8_t> bytes, const std::string& name);

// 1 or 3 channels; throw dptrain::Error on failure. JPEG uses libjpeg's defaults (4:2:0 chroma
// subsampling, baseline) at the given quality in [1, 100], as cjpeg and PIL do.
std::vector<uint8_t> encode_png(const Image& image);
std::vector<uint8_t> encode_jpeg(const Image& image, int quality);

// 3 -> 1: PIL's luma, (R * 19595 + G * 38470 + B * 7471 + 0x8000) >> 16; 1 -> 3: the grey replicated;
// the same count: a copy. Other counts throw dptrain::Error.
Image to_channels(const Image& image, int64_t channels);

// The shorter side becomes `size`, the longer one size * long / short truncated (torchvision's Resize).
// Bilinear as PIL's Image.resize(BILINEAR) (torchvision's Resize on PIL images): a triangle filter widened by
// the scale when shrinking, so downscaling averages every source pixel. An image whose shorter side
// is already `size` is returned as it is.
Image resize_shorter_side(const Image& image, int64_t size);

// The height x width window at torchvision's CenterCrop offsets: top = round((H - height) / 2) with
// Python's round (halves to even), left likewise. An image smaller than the window throws BadSample
// naming `name` and both sizes.
Image center_crop(const Image& image, int64_t height, int64_t width, const std::string& name);

}  // namespace dptrain::data

// PNG and JPEG through libpng and libjpeg-turbo, whose errors arrive by longjmp, and PIL's resize.
#include "data/image_codec.h"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstring>

// jpeglib.h uses FILE and size_t without declaring them; jerror.h needs jpeglib.h.
// clang-format off
#include <cstdio>
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include "core/error.h"
#include "data/dataset.h"

namespace dptrain::data {
namespace {

// Both libraries report an error (and, here, a warning) by calling back, and the callback must not
// return: it records the message and longjmps to the guarded() call that was running. C++ exceptions
// must not cross the libraries' C frames, so the exception is thrown after guarded() returns false.
struct CodecError {
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = "";
  const char* problem = "corrupt";  // or "truncated", "unsupported": how the message describes the file
};

[[noreturn]] void jump_with(CodecError& error, const char* message) {
  std::snprintf(error.message, sizeof error.message, "%s", message);
  std::longjmp(error.jump, 1);
}

// Runs `calls` (library calls only: nothing in it may own a destructor that longjmp would skip);
// false when the library reported an error.
template <typename F>
bool guarded(CodecError& error, F&& calls) {
  if (setjmp(error.jump) != 0) return false;
  calls();
  return true;
}

int64_t checked_side(int64_t side, const char* what, const std::string& name) {
  if (side < 1 || side > kMaxImageSide)
    throw BadSample(detail::concat(name, ": ", what, " of ", side, " pixels is outside 1..", kMaxImageSide,
                                   " (corrupt header, or an image too large to train on)"));
  return side;
}

// ---- PNG ----

struct PngInput {
  CodecError error;
  std::span<const uint8_t> bytes;
  std::size_t offset = 0;
};

[[noreturn]] void png_fail(png_structp png, png_const_charp message) {
  jump_with(static_cast<PngInput*>(png_get_error_ptr(png))->error, message);
}

void png_read_bytes(png_structp png, png_bytep out, std::size_t n) {
  auto& in = *static_cast<PngInput*>(png_get_io_ptr(png));
  if (n > in.bytes.size() - in.offset) {
    in.error.problem = "truncated";
    png_error(png, "the data ends before the image does");
  }
  std::memcpy(out, in.bytes.data() + in.offset, n);
  in.offset += n;
}

struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReader() { png_destroy_read_struct(&png, &info, nullptr); }
};

Image decode_png(std::span<const uint8_t> bytes, const std::string& name) {
  PngInput in;
  in.bytes = bytes;
  PngReader r;
  // Warnings are errors: libpng warns about CRC errors in ancillary chunks and extra image data.
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &in, png_fail, png_fail);
  if (r.png != nullptr) r.info = png_create_info_struct(r.png);
  DPTRAIN_CHECK(r.info != nullptr, name, ": libpng cannot allocate its decoder (out of memory?)");
  png_set_read_fn(r.png, &in, png_read_bytes);
  // The ancillary chunks (colour profiles, gamma, text) change no pixel here, and skipping them
  // avoids their warnings (libpng's "known incorrect sRGB profile" on many real files); their CRCs are
  // still checked. tRNS alone stays with the critical chunks and is dropped with the alpha below.
  png_set_keep_unknown_chunks(r.png, PNG_HANDLE_CHUNK_NEVER, nullptr, -1);

  png_uint_32 width = 0, height = 0;
  int depth = 0, colour = 0;
  const auto fail = [&]() -> BadSample {
    return BadSample(detail::concat(name, ": ", in.error.problem, " PNG: ", in.error.message));
  };
  if (!guarded(in.error, [&] {
        png_read_info(r.png, r.info);
        png_get_IHDR(r.png, r.info, &width, &height, &depth, &colour, nullptr, nullptr, nullptr);
      }))
    throw fail();
  Image image;
  image.height = checked_side(height, "height", name);
  image.width = checked_side(width, "width", name);
  image.channels = (colour & PNG_COLOR_MASK_COLOR) != 0 ? 3 : 1;  // a palette is colour
  const auto row_bytes = static_cast<std::size_t>(image.width * image.channels);
  image.pixels.resize(row_bytes * static_cast<std::size_t>(image.height));
  std::vector<png_bytep> rows(static_cast<std::size_t>(image.height));
  for (std::size_t y = 0; y < rows.size(); ++y) rows[y] = image.pixels.data() + y * row_bytes;

  if (!guarded(in.error, [&] {
        png_set_palette_to_rgb(r.png);
        png_set_expand_gray_1_2_4_to_8(r.png);
        png_set_strip_16(r.png);  // the high byte, as PIL reads 16-bit RGB
        png_set_strip_alpha(r.png);
        png_set_interlace_handling(r.png);
        png_read_update_info(r.png, r.info);
        if (png_get_rowbytes(r.png, r.info) != row_bytes)
          png_error(r.png, "unexpected row size after conversion");
        png_read_image(r.png, rows.data());
        png_read_end(r.png, nullptr);  // the last IDAT's CRC and the zlib checksum
      }))
    throw fail();
  return image;
}

// ---- JPEG ----

// libjpeg finds its error manager through cinfo.err; the CodecError beside it is reached by the cast.
struct JpegError {
  jpeg_error_mgr manager;
  CodecError error;
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto& e = *reinterpret_cast<JpegError*>(cinfo->err);
  char message[JMSG_LENGTH_MAX];
  cinfo->err->format_message(cinfo, message);
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) e.error.problem = "truncated";
  jump_with(e.error, message);
}

// Level -1 is a warning ("Premature end of JPEG file", "Corrupt JPEG data: ..."): the image goes on
// decoding as grey or garbage, so it stops here as an error does (TurboJPEG's TJFLAG_STOPONWARNING
// does the same). Higher levels are trace messages.
void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_fail(cinfo);
}

// Each scan of a progressive JPEG is a pass over the whole image, and a few bytes can describe one,
// so a small file of many scans decodes for minutes; real files have about ten. djpeg's -maxscans
// and TurboJPEG's scan limit refuse such files the same way.
constexpr int kMaxScans = 500;

void jpeg_progress(j_common_ptr cinfo) {
  if (cinfo->is_decompressor && reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number > kMaxScans) {
    CodecError& error = reinterpret_cast<JpegError*>(cinfo->err)->error;
    error.problem = "unsupported";
    jump_with(error, "more than 500 progressive scans");
  }
}

struct JpegReader {
  jpeg_decompress_struct cinfo{};
  JpegError error{};
  jpeg_progress_mgr progress{};
  bool created = false;
  ~JpegReader() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name) {
  JpegReader r;
  r.cinfo.err = jpeg_std_error(&r.error.manager);
  r.error.manager.error_exit = jpeg_fail;
  r.error.manager.emit_message = jpeg_message;
  r.progress.progress_monitor = jpeg_progress;
  const auto fail = [&]() -> BadSample {
    return BadSample(detail::concat(name, ": ", r.error.error.problem, " JPEG: ", r.error.error.message));
  };
  if (!guarded(r.error.error, [&] {
        jpeg_create_decompress(&r.cinfo);
        r.created = true;
        r.cinfo.progress = &r.progress;
        jpeg_mem_src(&r.cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
        jpeg_read_header(&r.cinfo, TRUE);
      }))
    throw fail();
  Image image;
  image.height = checked_side(r.cinfo.image_height, "height", name);
  image.width = checked_side(r.cinfo.image_width, "width", name);
  switch (r.cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
      image.channels = 1;
      break;
    case JCS_YCbCr:
    case JCS_RGB:
      image.channels = 3;
      r.cinfo.out_color_space = JCS_RGB;
      break;
    case JCS_CMYK:
    case JCS_YCCK:
      throw BadSample(name + ": unsupported JPEG: CMYK colour; convert it to RGB");
    default:
      throw BadSample(detail::concat(name, ": unsupported JPEG: ", r.cinfo.num_components,
                                     " components in an unknown colour space"));
  }
  const auto row_bytes = static_cast<JDIMENSION>(image.width * image.channels);
  image.pixels.resize(std::size_t{row_bytes} * static_cast<std::size_t>(image.height));
  std::vector<JSAMPROW> rows(static_cast<std::size_t>(image.height));
  for (std::size_t y = 0; y < rows.size(); ++y) rows[y] = image.pixels.data() + y * row_bytes;

  if (!guarded(r.error.error, [&] {
        jpeg_start_decompress(&r.cinfo);
        if (r.cinfo.output_width * static_cast<JDIMENSION>(r.cinfo.output_components) != row_bytes ||
            r.cinfo.output_height != rows.size())
          jump_with(r.error.error, "the decoder's output size differs from the header's");
        while (r.cinfo.output_scanline < r.cinfo.output_height)
          jpeg_read_scanlines(&r.cinfo, rows.data() + r.cinfo.output_scanline,
                              r.cinfo.output_height - r.cinfo.output_scanline);
        jpeg_finish_decompress(&r.cinfo);
      }))
    throw fail();
  return image;
}

// libjpeg's output goes straight into a vector, doubled as it fills.
struct VectorDestination {
  jpeg_destination_mgr manager;  // first: libjpeg sees only this
  std::vector<uint8_t>* out;
  CodecError* error;
};

boolean grow_destination(j_compress_ptr cinfo) {
  auto& d = *reinterpret_cast<VectorDestination*>(cinfo->dest);
  const std::size_t full = d.out->size();
  bool grown = true;
  try {
    d.out->resize(2 * full);
  } catch (const std::bad_alloc&) {
    grown = false;
  }
  if (!grown) jump_with(*d.error, "out of memory for the encoded file");
  d.manager.next_output_byte = d.out->data() + full;
  d.manager.free_in_buffer = d.out->size() - full;
  return TRUE;
}

void check_encodable(const Image& image, const char* what) {
  DPTRAIN_CHECK(image.channels == 1 || image.channels == 3, what, ": ", image.channels,
                " channels; only 1 (grey) or 3 (RGB) can be written");
  DPTRAIN_CHECK(image.height >= 1 && image.width >= 1 && image.height <= 65500 && image.width <= 65500, what,
                ": cannot write a ", image.height, "x", image.width, " image (sides must be in 1..65500)");
  DPTRAIN_CHECK(static_cast<int64_t>(image.pixels.size()) == image.height * image.width * image.channels,
                what, ": ", image.pixels.size(), " pixel bytes for a ", image.height, "x", image.width, "x",
                image.channels, " image");
}

// PIL's fixed-point resampling (Imaging/Resample.c): weights with 22 fraction bits, sums rounded and
// clipped to a byte after each pass.
constexpr int kPrecisionBits = 22;

struct Taps {
  int64_t per_output = 0;       // weight slots per output pixel
  std::vector<int64_t> first;   // per output pixel: its first source pixel
  std::vector<int64_t> count;   // ... and how many it reads
  std::vector<int32_t> weight;  // per_output slots per output pixel
};

// PIL's precompute_coeffs and normalize_coeffs_8bpc for the bilinear (triangle) filter.
Taps bilinear_taps(int64_t in, int64_t out) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale, inverse = 1.0 / filter_scale;
  Taps t;
  t.per_output = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<std::size_t>(out));
  t.count.resize(static_cast<std::size_t>(out));
  t.weight.assign(static_cast<std::size_t>(out * t.per_output), 0);
  std::vector<double> w(static_cast<std::size_t>(t.per_output));
  for (int64_t i = 0; i < out; ++i) {
    const double center = (static_cast<double>(i) + 0.5) * scale;
    const int64_t first = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t count = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in) - first;
    double total = 0.0;
    for (int64_t k = 0; k < count; ++k) {
      const double x = std::abs((static_cast<double>(k + first) - center + 0.5) * inverse);
      w[k] = x < 1.0 ? 1.0 - x : 0.0;
      total += w[k];
    }
    for (int64_t k = 0; k < count; ++k)
      t.weight[i * t.per_output + k] =
          static_cast<int32_t>(0.5 + (total != 0.0 ? w[k] / total : w[k]) * (1 << kPrecisionBits));
    t.first[i] = first;
    t.count[i] = count;
  }
  return t;
}

uint8_t clip8(int32_t sum) {
  return static_cast<uint8_t>(std::clamp(sum >> kPrecisionBits, 0, 255));
}

// Sums of byte x weight stay below 2^31 (PIL's int), the weights' total being about 2^22.
void resample_rows(const Image& in, const Taps& taps, Image& out) {
  const int64_t c = in.channels;
  for (int64_t y = 0; y < in.height; ++y) {
    const uint8_t* src = in.pixels.data() + y * in.width * c;
    uint8_t* dst = out.pixels.data() + y * out.width * c;
    for (int64_t x = 0; x < out.width; ++x) {
      const int32_t* w = taps.weight.data() + x * taps.per_output;
      const uint8_t* first = src + taps.first[x] * c;
      for (int64_t ch = 0; ch < c; ++ch) {
        int32_t sum = 1 << (kPrecisionBits - 1);
        for (int64_t k = 0; k < taps.count[x]; ++k) sum += first[k * c + ch] * w[k];
        dst[x * c + ch] = clip8(sum);
      }
    }
  }
}

// Whole rows at a time, so the inner loop runs along memory.
void resample_columns(const Image& in, const Taps& taps, Image& out) {
  const auto row_bytes = static_cast<std::size_t>(in.width * in.channels);
  std::vector<int32_t> sum(row_bytes);
  for (int64_t y = 0; y < out.height; ++y) {
    std::fill(sum.begin(), sum.end(), 1 << (kPrecisionBits - 1));
    for (int64_t k = 0; k < taps.count[y]; ++k) {
      const int32_t w = taps.weight[y * taps.per_output + k];
      const uint8_t* src = in.pixels.data() + (taps.first[y] + k) * static_cast<int64_t>(row_bytes);
      for (std::size_t j = 0; j < row_bytes; ++j) sum[j] += src[j] * w;
    }
    uint8_t* dst = out.pixels.data() + y * static_cast<int64_t>(row_bytes);
    for (std::size_t j = 0; j < row_bytes; ++j) dst[j] = clip8(sum[j]);
  }
}

}  // namespace

Image decode_image(std::span<const uint8_t> bytes, const std::string& name) {
  static constexpr uint8_t kPng[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  static constexpr uint8_t kJpeg[] = {0xff, 0xd8, 0xff};
  const auto starts_with = [&](std::span<const uint8_t> signature) {
    return bytes.size() >= signature.size() && std::equal(signature.begin(), signature.end(), bytes.begin());
  };
  if (starts_with(kPng)) return decode_png(bytes, name);
  if (starts_with(kJpeg)) return decode_jpeg(bytes, name);
  std::string first;
  for (std::size_t i = 0; i < std::min<std::size_t>(bytes.size(), 8); ++i) {
    char hex[4];
    std::snprintf(hex, sizeof hex, " %02x", bytes[i]);
    first += hex;
  }
  throw BadSample(detail::concat(name, ": not a PNG or JPEG file (", bytes.size(), " bytes",
                                 bytes.empty() ? "" : ", starting", first,
                                 "); only PNG and JPEG are read, whatever the file's extension"));
}

std::vector<uint8_t> encode_png(const Image& image) {
  check_encodable(image, "encode_png");
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = image.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;  // a first pass without memory measures the file
  std::vector<uint8_t> out;
  bool ok = png_image_write_to_memory(&png, nullptr, &size, 0, image.pixels.data(), 0, nullptr) != 0;
  if (ok) {
    out.resize(size);
    ok = png_image_write_to_memory(&png, out.data(), &size, 0, image.pixels.data(), 0, nullptr) != 0;
  }
  png_image_free(&png);
  DPTRAIN_CHECK(ok, "encode_png: libpng failed: ", png.message);
  out.resize(size);
  return out;
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality) {
  check_encodable(image, "encode_jpeg");
  DPTRAIN_CHECK(quality >= 1 && quality <= 100, "encode_jpeg: quality ", quality, " is outside 1..100");
  JpegError error{};
  jpeg_compress_struct cinfo{};
  cinfo.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = jpeg_fail;
  error.manager.emit_message = jpeg_message;
  std::vector<uint8_t> out(std::max<std::size_t>(image.pixels.size() / 4, 4096));
  VectorDestination destination{{}, &out, &error.error};
  destination.manager.next_output_byte = out.data();
  destination.manager.free_in_buffer = out.size();
  destination.manager.init_destination = [](j_compress_ptr) {};
  destination.manager.empty_output_buffer = grow_destination;
  destination.manager.term_destination = [](j_compress_ptr) {};
  std::vector<JSAMPROW> rows(static_cast<std::size_t>(image.height));
  for (std::size_t y = 0; y < rows.size(); ++y)
    rows[y] = const_cast<JSAMPROW>(image.pixels.data() +
                                   y * static_cast<std::size_t>(image.width * image.channels));

  bool created = false;
  const bool ok = guarded(error.error, [&] {
    jpeg_create_compress(&cinfo);
    created = true;
    cinfo.dest = &destination.manager;
    cinfo.image_width = static_cast<JDIMENSION>(image.width);
    cinfo.image_height = static_cast<JDIMENSION>(image.height);
    cinfo.input_components = static_cast<int>(image.channels);
    cinfo.in_color_space = image.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, quality, TRUE);
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < cinfo.image_height)
      jpeg_write_scanlines(&cinfo, rows.data() + cinfo.next_scanline,
                           cinfo.image_height - cinfo.next_scanline);
    jpeg_finish_compress(&cinfo);
  });
  if (created) jpeg_destroy_compress(&cinfo);
  DPTRAIN_CHECK(ok, "encode_jpeg: libjpeg failed: ", error.error.message);
  out.resize(out.size() - destination.manager.free_in_buffer);
  return out;
}

Image to_channels(const Image& image, int64_t channels) {
  DPTRAIN_CHECK((image.channels == 1 || image.channels == 3) && (channels == 1 || channels == 3),
                "to_channels: ", image.channels, " -> ", channels,
                " channels; only 1 (grey) and 3 (RGB) exist");
  if (image.channels == channels) return image;
  Image out{image.height, image.width, channels, {}};
  const std::size_t n = static_cast<std::size_t>(image.height * image.width);
  out.pixels.resize(n * static_cast<std::size_t>(channels));
  const uint8_t* in = image.pixels.data();
  uint8_t* o = out.pixels.data();
  if (channels == 1) {
    for (std::size_t i = 0; i < n; ++i, in += 3)
      o[i] = static_cast<uint8_t>((in[0] * 19595 + in[1] * 38470 + in[2] * 7471 + 0x8000) >> 16);
  } else {
    for (std::size_t i = 0; i < n; ++i, o += 3) o[0] = o[1] = o[2] = in[i];
  }
  return out;
}

Image resize_shorter_side(const Image& image, int64_t size) {
  DPTRAIN_CHECK(size >= 1, "resize_shorter_side: size ", size, " must be positive");
  const int64_t shorter = std::min(image.height, image.width), longer = std::max(image.height, image.width);
  DPTRAIN_CHECK(shorter >= 1, "resize_shorter_side: empty image");
  if (shorter == size) return image;
  // torchvision's Resize(int) truncates: int(size * long / short).
  const int64_t resized_longer = std::max<int64_t>(size * longer / shorter, 1);
  const bool tall = image.height > image.width;
  const int64_t height = tall ? resized_longer : size, width = tall ? size : resized_longer;

  // Horizontal first, then vertical, as PIL: the rounding between the passes depends on the order.
  Image wide{image.height, width, image.channels, {}};
  if (width == image.width) {
    wide.pixels = image.pixels;
  } else {
    wide.pixels.resize(static_cast<std::size_t>(image.height * width * image.channels));
    resample_rows(image, bilinear_taps(image.width, width), wide);
  }
  if (height == image.height) return wide;
  Image out{height, width, image.channels, {}};
  out.pixels.resize(static_cast<std::size_t>(height * width * image.channels));
  resample_columns(wide, bilinear_taps(image.height, height), out);
  return out;
}

Image center_crop(const Image& image, int64_t height, int64_t width, const std::string& name) {
  if (image.height < height || image.width < width)
    throw BadSample(detail::concat(name, ": image of ", image.height, "x", image.width,
                                   " is smaller than the center crop ", height, "x", width,
                                   " (set data.resize to scale the shorter side first)"));
  // torchvision: int(round((H - h) / 2.0)); Python rounds halves to even.
  const auto offset = [](int64_t spare) { return spare / 2 + (spare % 4 == 3 ? 1 : 0); };
  const int64_t top = offset(image.height - height), left = offset(image.width - width), c = image.channels;
  Image out{height, width, c, {}};
  out.pixels.resize(static_cast<std::size_t>(height * width * c));
  for (int64_t y = 0; y < height; ++y) {
    const uint8_t* row = image.pixels.data() + ((top + y) * image.width + left) * c;
    std::copy(row, row + width * c, out.pixels.data() + y * width * c);
  }
  return out;
}

}  // namespace dptrain::data

// Tests for the PNG / JPEG codec and the channel, resize and crop steps, on images built in the test.
#include "data/image_codec.h"

#include <gtest/gtest.h>
#include <png.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

// clang-format off
#include <cstdio>  // before jpeglib.h, which uses FILE and size_t
#include <jpeglib.h>
// clang-format on

#include "data/dataset.h"
#include "tests/test_util.h"

using dptrain::data::BadSample;
using dptrain::data::center_crop;
using dptrain::data::decode_image;
using dptrain::data::encode_jpeg;
using dptrain::data::encode_png;
using dptrain::data::Image;
using dptrain::data::resize_shorter_side;
using dptrain::data::to_channels;

namespace {

Image make_image(int64_t height, int64_t width, int64_t channels, const std::function<int(int64_t)>& value) {
  Image image{height, width, channels,
              std::vector<uint8_t>(static_cast<std::size_t>(height * width * channels))};
  for (std::size_t i = 0; i < image.pixels.size(); ++i)
    image.pixels[i] = static_cast<uint8_t>(value(static_cast<int64_t>(i)));
  return image;
}

// A PNG through libpng's own writer, for what encode_png never writes: palettes, alpha, 16 and 1-bit
// samples, interlacing, text. `rows`: height rows of packed samples as the PNG format lays them out.
struct PngSpec {
  uint32_t width = 1, height = 1;
  int colour = PNG_COLOR_TYPE_GRAY, depth = 8;
  bool interlaced = false;
  std::vector<png_color> palette{};
  std::vector<uint8_t> palette_alpha{};  // tRNS
  const char* text = nullptr;            // a tEXt chunk before the image data
};

void append_bytes(png_structp png, png_bytep data, std::size_t n) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}

std::vector<uint8_t> png_file(const PngSpec& spec, std::vector<uint8_t> rows) {
  std::vector<uint8_t> out;
  std::vector<png_bytep> row_pointers(spec.height);
  for (uint32_t y = 0; y < spec.height; ++y) row_pointers[y] = rows.data() + y * (rows.size() / spec.height);
  png_text text{};
  text.compression = PNG_TEXT_COMPRESSION_NONE;
  text.key = const_cast<char*>("Comment");
  text.text = const_cast<char*>(spec.text);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {  // libpng's default handler printed the reason
    png_destroy_write_struct(&png, &info);
    std::abort();
  }
  png_set_write_fn(png, &out, append_bytes, nullptr);
  png_set_IHDR(png, info, spec.width, spec.height, spec.depth, spec.colour,
               spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!spec.palette.empty())
    png_set_PLTE(png, info, spec.palette.data(), static_cast<int>(spec.palette.size()));
  if (!spec.palette_alpha.empty())
    png_set_tRNS(png, info, spec.palette_alpha.data(), static_cast<int>(spec.palette_alpha.size()), nullptr);
  if (spec.text != nullptr) png_set_text(png, info, &text, 1);
  png_set_rows(png, info, row_pointers.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

// A JPEG through libjpeg itself, for what encode_jpeg never writes: progressive scans, CMYK.
// libjpeg's default error handler exits, which fails the test.
std::vector<uint8_t> jpeg_file(const Image& image, J_COLOR_SPACE space, bool progressive,
                               const std::vector<jpeg_scan_info>& scans = {}) {
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr error{};
  cinfo.err = jpeg_std_error(&error);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = static_cast<int>(image.channels);
  cinfo.in_color_space = space;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 95, TRUE);
  if (progressive) jpeg_simple_progression(&cinfo);
  if (!scans.empty()) {
    cinfo.scan_info = scans.data();
    cinfo.num_scans = static_cast<int>(scans.size());
  }
  jpeg_start_compress(&cinfo, TRUE);
  const auto row_bytes = static_cast<std::size_t>(image.width * image.channels);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(image.pixels.data() + cinfo.next_scanline * row_bytes);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  std::free(buffer);
  return out;
}

// A smooth colour image: JPEG's 4:2:0 chroma subsampling loses little of it.
Image gradient(int64_t height, int64_t width, int64_t channels) {
  return make_image(height, width, channels, [&](int64_t i) {
    const int64_t c = i % channels, x = i / channels % width, y = i / channels / width;
    return static_cast<int>(20 + 2 * x + y + 30 * c);  // below 256 up to 40 x 40
  });
}

int max_difference(const Image& a, const Image& b) {
  int worst = 0;
  for (std::size_t i = 0; i < a.pixels.size(); ++i)
    worst = std::max(worst, std::abs(a.pixels[i] - b.pixels[i]));
  return worst;
}

// The BadSample message decode_image throws for `bytes`, or a note that it threw none.
std::string bad_sample_of(const std::vector<uint8_t>& bytes) {
  try {
    decode_image(bytes, "img/x.bin");
  } catch (const BadSample& e) {
    return e.what();
  }
  return "<no BadSample thrown>";
}

void expect_same(const Image& got, const Image& want) {
  EXPECT_EQ(got.height, want.height);
  EXPECT_EQ(got.width, want.width);
  EXPECT_EQ(got.channels, want.channels);
  EXPECT_EQ(got.pixels, want.pixels);
}

TEST(ImageCodec, PngRoundTripIsExact) {
  for (const int64_t channels : {1, 3}) {
    const Image image = make_image(5, 7, channels, [](int64_t i) { return (i * 37 + 11) % 256; });
    const std::vector<uint8_t> png = encode_png(image);
    ASSERT_EQ(png[1], 'P');
    expect_same(decode_image(png, "a.png"), image);
  }
}

TEST(ImageCodec, JpegRoundTrip) {
  for (const int64_t channels : {1, 3}) {
    const Image image = gradient(24, 40, channels);
    const Image best = decode_image(encode_jpeg(image, 100), "a.jpg");
    ASSERT_EQ(best.pixels.size(), image.pixels.size());
    EXPECT_EQ(best.channels, channels);
    EXPECT_LE(max_difference(best, image), 3) << channels << " channel(s)";

    const Image q90 = decode_image(encode_jpeg(gradient(17, 33, channels), 90), "b.jpg");
    EXPECT_EQ(q90.height, 17);
    EXPECT_EQ(q90.width, 33);
    EXPECT_EQ(q90.channels, channels);
    EXPECT_EQ(q90.pixels.size(), std::size_t{17 * 33} * static_cast<std::size_t>(channels));
  }
}

TEST(ImageCodec, ProgressiveJpeg) {
  const Image image = gradient(20, 30, 3);
  const Image progressive = decode_image(jpeg_file(image, JCS_RGB, true), "p.jpg");
  const Image baseline = decode_image(jpeg_file(image, JCS_RGB, false), "b.jpg");
  EXPECT_EQ(progressive.height, 20);
  EXPECT_EQ(progressive.width, 30);
  EXPECT_LE(max_difference(progressive, image), 6);
  EXPECT_LE(max_difference(progressive, baseline), 2);
}

TEST(ImageCodec, ProgressiveJpegOfTooManyScans) {
  // A legal progression of 704 scans: the DC and then each AC coefficient alone, each in 11 steps of
  // successive approximation (libjpeg's most for 8-bit samples). Every scan is a pass over the image.
  std::vector<jpeg_scan_info> scans;
  for (int k = 0; k < 64; ++k)
    for (int al = 10; al >= 0; --al) scans.push_back({1, {0, 0, 0, 0}, k, k, al == 10 ? 0 : al + 1, al});
  const std::string msg = bad_sample_of(jpeg_file(gradient(8, 8, 1), JCS_GRAYSCALE, false, scans));
  EXPECT_STARTS_WITH(msg, "img/x.bin: unsupported JPEG: more than 500 progressive scans");
  scans.resize(11 * 45);  // the DC and AC 1..44: 495 scans, allowed
  EXPECT_EQ(decode_image(jpeg_file(gradient(8, 8, 1), JCS_GRAYSCALE, false, scans), "s.jpg").width, 8);
}

TEST(ImageCodec, PalettePngBecomesRgbWithoutAlpha) {
  PngSpec spec{.width = 3, .height = 2, .colour = PNG_COLOR_TYPE_PALETTE, .depth = 2};
  spec.palette = {{10, 20, 30}, {40, 50, 60}, {70, 80, 90}, {250, 0, 5}};
  spec.palette_alpha = {0, 128};  // entries 0 and 1 (partly) transparent: ignored, as PIL's convert("RGB")
  // Indices 0 1 2 / 3 2 1, two bits each, rows padded to a byte.
  const Image got = decode_image(png_file(spec, {0b00011000, 0b11100100}), "p.png");
  const Image want{2, 3, 3, {10, 20, 30, 40, 50, 60, 70, 80, 90, 250, 0, 5, 70, 80, 90, 40, 50, 60}};
  expect_same(got, want);
}

TEST(ImageCodec, SixteenBitPngKeepsTheHighByte) {
  PngSpec rgb{.width = 2, .height = 1, .colour = PNG_COLOR_TYPE_RGB, .depth = 16};
  const Image got = decode_image(
      png_file(rgb, {0x12, 0xab, 0x34, 0xff, 0xff, 0x00, 0x00, 0x80, 0x7f, 0xff, 0x01, 0x01}), "16.png");
  expect_same(got, Image{1, 2, 3, {0x12, 0x34, 0xff, 0x00, 0x7f, 0x01}});

  PngSpec grey{.width = 2, .height = 1, .colour = PNG_COLOR_TYPE_GRAY, .depth = 16};
  expect_same(decode_image(png_file(grey, {0xfe, 0xff, 0x01, 0x02}), "g16.png"),
              Image{1, 2, 1, {0xfe, 0x01}});
}

TEST(ImageCodec, AlphaIsDroppedNotComposited) {
  PngSpec rgba{.width = 2, .height = 1, .colour = PNG_COLOR_TYPE_RGB_ALPHA, .depth = 8};
  expect_same(decode_image(png_file(rgba, {200, 100, 50, 0, 1, 2, 3, 128}), "a.png"),
              Image{1, 2, 3, {200, 100, 50, 1, 2, 3}});
  PngSpec grey_alpha{.width = 2, .height = 1, .colour = PNG_COLOR_TYPE_GRAY_ALPHA, .depth = 8};
  expect_same(decode_image(png_file(grey_alpha, {77, 0, 99, 255}), "ga.png"), Image{1, 2, 1, {77, 99}});
}

TEST(ImageCodec, LowBitGreyAndInterlacedPng) {
  PngSpec one_bit{.width = 3, .height = 1, .colour = PNG_COLOR_TYPE_GRAY, .depth = 1};
  expect_same(decode_image(png_file(one_bit, {0b10100000}), "1.png"), Image{1, 3, 1, {255, 0, 255}});

  const Image image = make_image(9, 11, 3, [](int64_t i) { return (i * 7) % 256; });
  PngSpec adam7{.width = 11, .height = 9, .colour = PNG_COLOR_TYPE_RGB, .depth = 8, .interlaced = true};
  expect_same(decode_image(png_file(adam7, image.pixels), "i.png"), image);
}

TEST(ImageCodec, TruncatedFilesAreBadSamples) {
  const std::vector<uint8_t> png = encode_png(make_image(16, 16, 3, [](int64_t i) { return i * 13 % 251; }));
  for (const std::size_t keep : {png.size() - 1, png.size() - 12, png.size() / 2, std::size_t{20}}) {
    const std::string msg = bad_sample_of({png.begin(), png.begin() + static_cast<std::ptrdiff_t>(keep)});
    EXPECT_STARTS_WITH(msg, "img/x.bin: truncated PNG") << keep << " bytes";
  }
  const std::vector<uint8_t> jpeg = encode_jpeg(gradient(32, 32, 3), 90);
  for (const std::size_t keep : {jpeg.size() - 2, jpeg.size() / 2, std::size_t{100}}) {
    const std::string msg = bad_sample_of({jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(keep)});
    EXPECT_STARTS_WITH(msg, "img/x.bin: truncated JPEG") << keep << " bytes";
    EXPECT_CONTAINS(msg, "Premature end of JPEG file");
  }
}

TEST(ImageCodec, CorruptFilesAreBadSamples) {
  // A wrong CRC on the image data.
  std::vector<uint8_t> png = encode_png(make_image(8, 8, 1, [](int64_t i) { return i; }));
  const auto idat = std::search(png.begin(), png.end(), std::begin("IDAT"), std::end("IDAT") - 1);
  ASSERT_NE(idat, png.end());
  const std::size_t length = std::size_t{idat[-2]} << 8 | idat[-1];
  idat[static_cast<std::ptrdiff_t>(4 + length)] ^= 0x10;
  std::string msg = bad_sample_of(png);
  EXPECT_STARTS_WITH(msg, "img/x.bin: corrupt PNG");
  EXPECT_CONTAINS(msg, "CRC");

  // A wrong CRC in a text chunk, which libpng alone would only warn about.
  PngSpec spec{.width = 2, .height = 1};
  spec.text = "hello";
  png = png_file(spec, {1, 2});
  ASSERT_NO_THROW(decode_image(png, "t.png"));
  const auto text = std::search(png.begin(), png.end(), std::begin("hello"), std::end("hello") - 1);
  ASSERT_NE(text, png.end());
  *text = 'j';
  EXPECT_STARTS_WITH(bad_sample_of(png), "img/x.bin: corrupt PNG");

  // Bytes before the JPEG's end marker: libjpeg warns "Corrupt JPEG data" and would return the image.
  std::vector<uint8_t> jpeg = encode_jpeg(gradient(8, 8, 1), 90);
  jpeg.insert(jpeg.end() - 2, {1, 2, 3});
  msg = bad_sample_of(jpeg);
  EXPECT_STARTS_WITH(msg, "img/x.bin: corrupt JPEG");
  EXPECT_CONTAINS(msg, "extraneous bytes");
}

TEST(ImageCodec, UnsupportedAndUnknownFiles) {
  const Image cmyk = make_image(4, 4, 4, [](int64_t i) { return i; });
  std::string msg = bad_sample_of(jpeg_file(cmyk, JCS_CMYK, false));
  EXPECT_STARTS_WITH(msg, "img/x.bin: unsupported JPEG: CMYK");

  for (const std::vector<uint8_t>& garbage : std::vector<std::vector<uint8_t>>{
           {}, {0x89, 'P', 'N'}, {'G', 'I', 'F', '8', '9', 'a', 0, 0, 0}, {0xff, 0xd8}}) {
    msg = bad_sample_of(garbage);
    EXPECT_STARTS_WITH(msg, "img/x.bin: not a PNG or JPEG file");
  }
  EXPECT_CONTAINS(bad_sample_of({'G', 'I', 'F', '8'}), "4 bytes, starting 47 49 46 38");
}

TEST(ImageCodec, OversizedImagesAreRejected) {
  PngSpec wide{.width = 16385, .height = 1};
  EXPECT_STARTS_WITH(bad_sample_of(png_file(wide, std::vector<uint8_t>(16385))),
                     "img/x.bin: width of 16385 pixels is outside 1..16384");
  const std::vector<uint8_t> tall = encode_jpeg(Image{20000, 1, 1, std::vector<uint8_t>(20000, 9)}, 50);
  EXPECT_STARTS_WITH(bad_sample_of(tall), "img/x.bin: height of 20000 pixels is outside 1..16384");

  PngSpec edge{.width = 16384, .height = 1};
  EXPECT_EQ(decode_image(png_file(edge, std::vector<uint8_t>(16384, 3)), "e.png").width, 16384);
}

TEST(ImageCodec, EncodeRejectsBadImages) {
  EXPECT_THROW(encode_png(Image{2, 2, 2, std::vector<uint8_t>(8)}), dptrain::Error);
  EXPECT_THROW(encode_png(Image{2, 2, 1, std::vector<uint8_t>(3)}), dptrain::Error);
  EXPECT_THROW(encode_jpeg(Image{2, 2, 1, std::vector<uint8_t>(4)}, 0), dptrain::Error);
  EXPECT_THROW(encode_jpeg(Image{0, 2, 1, {}}, 90), dptrain::Error);
}

TEST(ImageTransform, ToChannelsUsesPilLuma) {
  const Image rgb{1, 5, 3, {255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255, 10, 20, 30}};
  // (R * 19595 + G * 38470 + B * 7471 + 0x8000) >> 16: PIL's red 76, green 150, blue 29.
  expect_same(to_channels(rgb, 1), Image{1, 5, 1, {76, 150, 29, 255, 18}});
  expect_same(to_channels(Image{1, 2, 1, {7, 200}}, 3), Image{1, 2, 3, {7, 7, 7, 200, 200, 200}});
  expect_same(to_channels(rgb, 3), rgb);
  EXPECT_THROW(to_channels(rgb, 4), dptrain::Error);
}

TEST(ImageTransform, CenterCropAtTorchvisionOffsets) {
  const Image image = make_image(5, 7, 1, [](int64_t i) { return i / 7 * 16 + i % 7; });  // 16 * y + x
  // top = round(2 / 2.0) = 1, left = round(4 / 2.0) = 2.
  expect_same(center_crop(image, 3, 3, "c"),
              Image{3, 3, 1, {0x12, 0x13, 0x14, 0x22, 0x23, 0x24, 0x32, 0x33, 0x34}});
  // Python rounds halves to even: round(1.5) = 2 (top), round(2.5) = 2 (left), round(0.5) = 0.
  const Image even = make_image(6, 8, 1, [](int64_t i) { return i / 8 * 16 + i % 8; });
  EXPECT_EQ(center_crop(even, 3, 3, "c").pixels[0], 0x22);
  EXPECT_EQ(center_crop(even, 5, 7, "c").pixels[0], 0x00);
  EXPECT_EQ(center_crop(even, 6, 8, "c").pixels, even.pixels);

  const Image rgb = make_image(4, 4, 3, [](int64_t i) { return i; });
  expect_same(center_crop(rgb, 2, 2, "c"), Image{2, 2, 3, {15, 16, 17, 18, 19, 20, 27, 28, 29, 30, 31, 32}});

  try {
    center_crop(image, 6, 3, "dir/small.png");
    ADD_FAILURE() << "no BadSample";
  } catch (const BadSample& e) {
    EXPECT_STARTS_WITH(e.what(), "dir/small.png: image of 5x7 is smaller than the center crop 6x3");
  }
}

TEST(ImageTransform, ResizeShorterSide) {
  const Image tall = gradient(40, 20, 3);
  const Image up = resize_shorter_side(tall, 64);
  EXPECT_EQ(up.height, 128);
  EXPECT_EQ(up.width, 64);
  EXPECT_EQ(up.pixels.size(), std::size_t{128 * 64 * 3});
  const Image down = resize_shorter_side(gradient(20, 30, 1), 10);
  EXPECT_EQ(down.height, 10);
  EXPECT_EQ(down.width, 15);
  const Image truncated = resize_shorter_side(gradient(3, 7, 1), 2);  // torchvision: int(7 * 2 / 3) = 4
  EXPECT_EQ(truncated.height, 2);
  EXPECT_EQ(truncated.width, 4);
  expect_same(resize_shorter_side(tall, 20), tall);

  for (const int64_t size : {7, 33, 300}) {
    const Image constant = resize_shorter_side(make_image(45, 61, 3, [](int64_t) { return 173; }), size);
    EXPECT_EQ(std::min(constant.height, constant.width), size);
    EXPECT_TRUE(
        std::all_of(constant.pixels.begin(), constant.pixels.end(), [](uint8_t p) { return p == 173; }))
        << "to " << size;
  }
}

TEST(ImageTransform, ResizeAveragesWhenShrinking) {
  // 2x8 -> 1x4. PIL widens the triangle filter by the scale (2): output x = 1 is centred at 3.0 and
  // reads pixels 1..4 with weights 0.25, 0.75, 0.75, 0.25 over their sum, 2; x = 2 reads 3..6. Plain
  // bilinear sampling would read only pixels 2 and 3 (50) and 4 and 5 (0).
  const Image spike = make_image(2, 8, 1, [](int64_t i) { return i % 8 == 3 ? 100 : 0; });
  const Image resized = resize_shorter_side(spike, 1);
  ASSERT_EQ(resized.height, 1);
  ASSERT_EQ(resized.width, 4);
  EXPECT_EQ(resized.pixels[1], 38);  // 100 * 0.375 = 37.5, rounded half up in fixed point
  EXPECT_EQ(resized.pixels[2], 13);  // 100 * 0.125 = 12.5
}

}  // namespace

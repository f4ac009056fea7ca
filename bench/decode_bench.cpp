// Decoding benchmark: decode_image (data/image_codec.h) on one thread over the PNG and JPEG files of
// folders (searched recursively) or named files, each decoded --repeat times. The files are read into
// memory first, so the figures are decoding alone: images/s, MB/s of file bytes, megapixels/s.
//
//   build/bench/decode_bench PATH... [--repeat 5] [--only jpeg|png]
//
// Ends with one "RESULT {json}" line (images, bytes, seconds, images_per_sec, mb_per_sec,
// megapixels_per_sec). A file that does not decode stops the run, naming it.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/image_codec.h"

namespace fs = std::filesystem;

namespace {

std::string lower_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext;
}

bool wanted(const fs::path& path, const std::string& only) {
  const std::string ext = lower_extension(path);
  const bool jpeg = ext == ".jpg" || ext == ".jpeg", png = ext == ".png";
  return only == "jpeg" ? jpeg : only == "png" ? png : jpeg || png;
}

std::vector<fs::path> image_files(const std::vector<std::string>& paths, const std::string& only) {
  std::vector<fs::path> files;
  for (const std::string& path : paths) {
    if (fs::is_directory(path)) {
      for (const auto& entry : fs::recursive_directory_iterator(path))
        if (entry.is_regular_file() && wanted(entry.path(), only)) files.push_back(entry.path());
    } else {
      DPTRAIN_CHECK(fs::is_regular_file(path), path, ": no such file or folder");
      files.emplace_back(path);
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"decode_image speed on one thread"};
  std::vector<std::string> paths;
  int repeat = 5;
  std::string only = "all";
  app.add_option("paths", paths, "folders (searched recursively for .png, .jpg, .jpeg) or image files")
      ->required();
  app.add_option("--repeat", repeat, "decodes of each file")->check(CLI::PositiveNumber);
  app.add_option("--only", only, "jpeg, png or all")->check(CLI::IsMember({"jpeg", "png", "all"}));
  CLI11_PARSE(app, argc, argv);

  try {
    const std::vector<fs::path> files = image_files(paths, only);
    DPTRAIN_CHECK(!files.empty(), "decode_bench: no ", only == "all" ? "PNG or JPEG" : only,
                  " files under the paths given");
    std::vector<std::vector<uint8_t>> contents;
    int64_t bytes = 0, pixels = 0;
    for (const fs::path& file : files) {
      std::ifstream in(file, std::ios::binary);
      contents.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      bytes += static_cast<int64_t>(contents.back().size());
      const dptrain::data::Image image =
          dptrain::data::decode_image(contents.back(), file.string());  // warm-up
      pixels += image.height * image.width;
    }

    uint64_t checksum = 0;  // keeps the decodes observable
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < repeat; ++r)
      for (std::size_t i = 0; i < files.size(); ++i)
        checksum += dptrain::data::decode_image(contents[i], files[i].string()).pixels.back();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    const double decodes = static_cast<double>(files.size()) * repeat;
    const double images_per_sec = decodes / seconds;
    const double mb_per_sec = static_cast<double>(bytes) * repeat / seconds / 1e6;
    const double megapixels_per_sec = static_cast<double>(pixels) * repeat / seconds / 1e6;
    std::printf(
        "%zu files (%.1f MB, %.1f megapixels) x %d: %.3f s, %.1f images/s, %.1f MB/s, %.1f megapixels/s\n",
        files.size(), static_cast<double>(bytes) / 1e6, static_cast<double>(pixels) / 1e6, repeat, seconds,
        images_per_sec, mb_per_sec, megapixels_per_sec);
    std::printf(
        "RESULT {\"images\":%zu,\"repeat\":%d,\"bytes\":%lld,\"seconds\":%.6f,\"images_per_sec\":%.3f,"
        "\"mb_per_sec\":%.3f,\"megapixels_per_sec\":%.3f,\"checksum\":%llu}\n",
        files.size(), repeat, static_cast<long long>(bytes), seconds, images_per_sec, mb_per_sec,
        megapixels_per_sec, static_cast<unsigned long long>(checksum));
  } catch (const std::exception& e) {  // dptrain::Error, or the folder walk's filesystem_error
    std::fprintf(stderr, "decode_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

// The "image_folder" dataset format: <dir>/<split>/<class>/<image>, each image decoded when it is read.
#include "data/image_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>

#include "core/error.h"
#include "data/image_codec.h"
#include "data/registry.h"

namespace dptrain::data {
namespace {

namespace fs = std::filesystem;

// torchvision's test: the lower-cased name ends with an extension its default loader reads (of those,
// PNG and JPEG only here).
bool is_image_name(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name.ends_with(".png") || name.ends_with(".jpg") || name.ends_with(".jpeg");
}

// The names of dir's sub-folders, or (folders false) of its image files, in byte order.
std::vector<std::string> sorted_names(const fs::path& dir, bool folders) {
  std::vector<std::string> names;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    std::error_code ignored;  // an entry that cannot be examined (a broken link) is no folder
    const std::string name = it->path().filename().string();
    if (folders ? it->is_directory(ignored) : !it->is_directory(ignored) && is_image_name(name))
      names.push_back(name);
  }
  DPTRAIN_CHECK(!error, dir.string(), ": cannot list: ", error.message());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<uint8_t> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw BadSample(path + ": cannot open: " + errno_text(errno));
  struct stat st {};
  std::vector<uint8_t> bytes;
  int error = 0;
  if (::fstat(fd, &st) != 0) {
    error = errno;
  } else if (S_ISREG(st.st_mode)) {
    bytes.resize(static_cast<std::size_t>(st.st_size));
    for (std::size_t got = 0; got < bytes.size();) {
      const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {  // 0: the file shrank since fstat
        error = n < 0 ? errno : EIO;
        break;
      }
      got += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
  if (error != 0) throw BadSample(path + ": cannot read: " + errno_text(error));
  if (!S_ISREG(st.st_mode)) throw BadSample(path + ": not a regular file");
  return bytes;
}

class ImageFolder final : public Dataset {
 public:
  ImageFolder(Shape shape, const std::vector<std::string>& classes, std::vector<std::string> paths,
              std::vector<int32_t> labels, int64_t resize)
      : Dataset(std::move(shape), static_cast<int64_t>(paths.size()), static_cast<int>(classes.size()), 0,
                classes),
        paths_(std::move(paths)),
        labels_(std::move(labels)),
        resize_(resize) {}

  int32_t read(int64_t index, float* input, float* /*target*/) const override {
    DPTRAIN_CHECK(index >= 0 && index < size(), "image_folder: sample index ", index, " outside [0, ", size(),
                  ")");
    const std::string& path = paths_[static_cast<std::size_t>(index)];
    const int64_t channels = sample_shape()[0], height = sample_shape()[1], width = sample_shape()[2];
    try {
      Image image = decode_image(read_file(path), path);
      if (image.channels != channels) image = to_channels(image, channels);
      if (resize_ > 0 && std::min(image.height, image.width) != resize_)
        image = resize_shorter_side(image, resize_);
      if (image.height != height || image.width != width) image = center_crop(image, height, width, path);
      const int64_t plane = height * width;
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t i = 0; i < plane; ++i)
          input[c * plane + i] =
              static_cast<float>(image.pixels[static_cast<std::size_t>(i * channels + c)]) / 255.0f;
    } catch (const BadSample& bad) {
      throw BadSample(detail::concat(bad.what(), " (sample ", index,
                                     "; data.on_bad_sample \"skip\" trains on without such samples)"));
    }
    return labels_[static_cast<std::size_t>(index)];
  }

  ReadCost read_cost() const override { return ReadCost::kDecode; }

 private:
  std::vector<std::string> paths_;
  std::vector<int32_t> labels_;
  int64_t resize_;
};

}  // namespace

std::unique_ptr<Dataset> open_image_folder(const DatasetRequest& request) {
  const Shape& shape = request.sample_shape;
  DPTRAIN_CHECK(shape.size() == 3 && (shape[0] == 1 || shape[0] == 3) && shape[1] > 0 && shape[2] > 0,
                "data.dataset \"image_folder\": model.input_shape is ", shape_str(shape),
                "; it must be [C, H, W] with C = 1 (grey) or 3 (RGB)");
  DPTRAIN_CHECK(request.resize >= 0, "data.dataset \"image_folder\": data.resize ", request.resize,
                " is negative; 0 keeps the stored size");
  const std::string split = (fs::path(request.dir) / (request.train ? "train" : "test")).string();
  const std::string layout =
      " (image_folder reads <data.dir>/train/<class>/<image> and "
      "<data.dir>/test/<class>/<image>, images being .png, .jpg or .jpeg files)";
  std::error_code error;
  DPTRAIN_CHECK(fs::is_directory(split, error), split, ": no such folder", layout);
  std::vector<std::string> classes = sorted_names(split, /*folders=*/true);
  DPTRAIN_CHECK(!classes.empty(), split, ": no class folders", layout);
  DPTRAIN_CHECK(request.model_classes <= 0 || static_cast<int64_t>(classes.size()) <= request.model_classes,
                split, ": ", classes.size(), " class folders, more than the model's ", request.model_classes,
                " outputs; give the model one output per class");

  std::vector<std::vector<std::string>> files(classes.size());
  for (std::size_t label = 0; label < classes.size(); ++label) {
    const std::string folder = split + "/" + classes[label];
    files[label] = sorted_names(folder, /*folders=*/false);
    DPTRAIN_CHECK(!files[label].empty(), folder, ": empty class: no .png, .jpg or .jpeg files", layout);
  }
  // A cap (data.max_*_samples) takes the classes' files in turn, so that every class keeps its share:
  // the first N in torchvision's order, class by class, would be the first classes alone (a quick run
  // on 1000 of 10 classes x 5000 images trained and tested on class 0, at 100%).
  std::vector<std::size_t> taken(classes.size());
  for (std::size_t label = 0; label < classes.size(); ++label) taken[label] = files[label].size();
  if (request.max_samples > 0) {
    std::ranges::fill(taken, 0);
    for (int64_t left = request.max_samples, progress = 1; left > 0 && progress > 0;) {
      progress = 0;
      for (std::size_t label = 0; label < classes.size() && left > 0; ++label)
        if (taken[label] < files[label].size()) ++taken[label], --left, ++progress;
    }
  }
  std::vector<std::string> paths;
  std::vector<int32_t> labels;
  for (std::size_t label = 0; label < classes.size(); ++label)
    for (std::size_t i = 0; i < taken[label]; ++i) {
      paths.push_back(split + "/" + classes[label] + "/" + files[label][i]);
      labels.push_back(static_cast<int32_t>(label));
    }
  return std::make_unique<ImageFolder>(shape, classes, std::move(paths), std::move(labels), request.resize);
}

}  // namespace dptrain::data

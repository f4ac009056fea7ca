// The .npy reader and writer, and the "npy" dataset format: x and y arrays mapped, labels checked once.
#include "data/npy.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "core/error.h"
#include "core/file_replacement.h"
#include "data/mapped_file.h"

namespace dptrain::data {

// '<' data is used as it is stored.
static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kAlign = 64;  // numpy's data starts at a multiple of this

struct Dtype {
  std::string_view descr, dtype, name;
  int64_t item_bytes;
};
constexpr Dtype kDtypes[] = {{"|u1", "u1", "uint8", 1},
                             {"<u1", "u1", "uint8", 1},
                             {"<f4", "f4", "float32", 4},
                             {"<i8", "i8", "int64", 8}};
constexpr const char* kAccepted = "accepted are '|u1' or '<u1' (uint8), '<f4' (float32) and '<i8' (int64)";

const Dtype* find_dtype(std::string_view descr) {
  for (const Dtype& d : kDtypes)
    if (d.descr == descr) return &d;
  return nullptr;
}

std::string_view numpy_name(const std::string& dtype) {
  for (const Dtype& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  return dtype;
}

// Bytes from the file as they may appear in a one-line message: printable ASCII, at most 40.
std::string printable(std::string_view bytes) {
  std::string out;
  for (const char c : bytes.substr(0, 40)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return bytes.size() > 40 ? out + "..." : out;
}

// As Python's repr writes a tuple: (), (5,), (2, 3).
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + (shape.size() == 1 ? ",)" : ")");
}

// The data bytes of a shape of non-negative dims; numpy multiplies in Python's unbounded ints, so a
// zero dim makes the product 0 whatever the other dims are.
int64_t data_bytes(const std::vector<int64_t>& shape, int64_t item_bytes, const std::string& path) {
  if (std::ranges::find(shape, 0) != shape.end()) return 0;
  int64_t bytes = item_bytes;
  for (const int64_t d : shape) {
    DPTRAIN_CHECK(bytes <= INT64_MAX / d, path, ": shape ", shape_text(shape), " of ", item_bytes,
                  "-byte items overflows a 64-bit byte count");
    bytes *= d;
  }
  return bytes;
}

// The header: the dict literal numpy writes with repr() and reads back with ast.literal_eval, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } then spaces and '\n'.
struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  Header parse() {
    Header h;
    bool have_descr = false, have_fortran = false, have_shape = false;
    expect('{', "'{'");
    while (!accept('}')) {
      const std::string key = string();
      expect(':', "':'");
      if (key == "descr") {
        once(have_descr, key);
        skip_space();
        if (pos_ < text_.size() && text_[pos_] == '[')
          DPTRAIN_FAIL(path_, ": dtype is a structured (record) dtype; ", kAccepted);
        h.descr = string();
      } else if (key == "fortran_order") {
        once(have_fortran, key);
        h.fortran_order = boolean();
      } else if (key == "shape") {
        once(have_shape, key);
        h.shape = tuple();
      } else {
        fail("unknown key '" + printable(key) + "' (the keys are 'descr', 'fortran_order' and 'shape')");
      }
      if (!accept(',')) {
        expect('}', "',' or '}'");
        break;
      }
    }
    skip_space();  // numpy's padding and final '\n'
    if (pos_ != text_.size()) fail("text after the dict");
    DPTRAIN_CHECK(
        have_descr && have_fortran && have_shape, path_,
        ": header lacks a key: it needs 'descr', 'fortran_order' and 'shape'; header: ", printable(text_));
    return h;
  }

 private:
  // The excerpt leaves out numpy's padding, which would only show as spaces and a '?' for the '\n'.
  [[noreturn]] void fail(const std::string& what) const {
    const std::string_view rest = text_.substr(pos_);
    DPTRAIN_FAIL(path_, ": header is not the dict numpy writes: ", what, " at byte ", pos_,
                 " of the header, near \"", printable(rest.substr(0, rest.find_last_not_of(kSpace) + 1)),
                 "\"");
  }

  void skip_space() {
    while (pos_ < text_.size() && kSpace.find(text_[pos_]) != std::string_view::npos) ++pos_;
  }
  bool accept(char c) {
    skip_space();
    if (pos_ >= text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c, const char* what) {
    if (!accept(c)) fail(std::string("expected ") + what);
  }
  void once(bool& seen, const std::string& key) {
    if (seen) fail("key '" + key + "' given twice");
    seen = true;
  }

  // A quoted string without escapes: numpy's keys and descrs have none.
  std::string string() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) fail("expected a quoted string");
    const char quote = text_[pos_++];
    const std::size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\' || text_[pos_] == '\n') fail("escape or line break in a string");
      ++pos_;
    }
    if (pos_ >= text_.size()) fail("unterminated string");
    return std::string(text_.substr(start, pos_++ - start));
  }

  bool boolean() {
    skip_space();
    std::size_t end = pos_;
    while (end < text_.size() && std::isalpha(static_cast<unsigned char>(text_[end]))) ++end;
    const std::string_view word = text_.substr(pos_, end - pos_);
    if (word != "True" && word != "False") fail("fortran_order is not True or False");
    pos_ = end;
    return word == "True";
  }

  // A tuple of non-negative ints: (), (N,), (N, M) or (N, M,).
  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(', "a tuple for shape");
    while (!accept(')')) {
      dims.push_back(dimension());
      if (!accept(',')) {
        expect(')', "',' or ')' in shape");
        if (dims.size() == 1) fail("shape (N) is an int, not a tuple; a 1-tuple is (N,)");
        break;
      }
    }
    return dims;
  }

  int64_t dimension() {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == '-') fail("shape has a negative dimension");
    if (pos_ >= text_.size() || !std::isdigit(static_cast<unsigned char>(text_[pos_])))
      fail("shape holds something other than a non-negative int");
    int64_t value = 0;
    for (; pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])); ++pos_) {
      const int digit = text_[pos_] - '0';
      if (value > (INT64_MAX - digit) / 10) fail("shape dimension overflows a 64-bit int");
      value = value * 10 + digit;
    }
    if (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.'))
      fail("shape holds something other than a non-negative int");
    return value;
  }

  static constexpr std::string_view kSpace = " \t\r\n";
  std::string_view text_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

}  // namespace

NpyArray parse_npy(std::span<const uint8_t> file, const std::string& path) {
  const std::string_view bytes(reinterpret_cast<const char*>(file.data()), file.size());
  DPTRAIN_CHECK(bytes.size() >= 10, path, ": truncated: ", bytes.size(),
                " bytes, too short for a .npy preamble");
  DPTRAIN_CHECK(bytes.starts_with(kMagic), path, ": not a .npy file: bad magic \"",
                printable(bytes.substr(0, kMagic.size())), "\", expected \"\\x93NUMPY\"");
  const int major = file[6], minor = file[7];
  DPTRAIN_CHECK(major >= 1 && major <= 3 && minor == 0, path, ": .npy format version ", major, ".", minor,
                " is not supported (1.0, 2.0 and 3.0 are)");
  // Version 1.0 gives the header's length in 2 bytes, 2.0 and 3.0 in 4; little-endian.
  const std::size_t length_bytes = major == 1 ? 2 : 4, preamble = 8 + length_bytes;
  DPTRAIN_CHECK(bytes.size() >= preamble, path, ": truncated: ", bytes.size(),
                " bytes, too short for a version ", major, ".0 preamble of ", preamble);
  std::size_t header_len = 0;
  for (std::size_t i = 0; i < length_bytes; ++i) header_len |= std::size_t{file[8 + i]} << (8 * i);
  DPTRAIN_CHECK(header_len <= bytes.size() - preamble, path, ": truncated: the header's length, ", header_len,
                " bytes, runs past the end of the file (", bytes.size() - preamble,
                " bytes after the preamble)");

  const Header header = HeaderParser(bytes.substr(preamble, header_len), path).parse();
  const Dtype* type = find_dtype(header.descr);
  DPTRAIN_CHECK(type != nullptr || !header.descr.starts_with('>'), path, ": dtype '", printable(header.descr),
                "' is big-endian; ", kAccepted, " (convert with a.astype(a.dtype.newbyteorder('<')))");
  DPTRAIN_CHECK(type != nullptr, path, ": dtype '", printable(header.descr), "' is not supported; ",
                kAccepted);
  DPTRAIN_CHECK(!header.fortran_order, path, ": Fortran order; save with np.ascontiguousarray");

  const int64_t expected = data_bytes(header.shape, type->item_bytes, path);
  const uint64_t have = bytes.size() - preamble - header_len;
  DPTRAIN_CHECK(have >= static_cast<uint64_t>(expected), path, ": truncated: shape ",
                shape_text(header.shape), " of ", type->name, " needs ", expected,
                " data bytes, the file has ", have);
  DPTRAIN_CHECK(have == static_cast<uint64_t>(expected), path, ": ", have - static_cast<uint64_t>(expected),
                " trailing bytes after the ", expected, " data bytes of shape ", shape_text(header.shape),
                " of ", type->name);
  return {std::string(type->dtype), header.shape, type->item_bytes, file.subspan(preamble + header_len)};
}

std::string npy_header(const std::string& descr, const std::vector<int64_t>& shape) {
  DPTRAIN_CHECK(find_dtype(descr) != nullptr, ".npy header: cannot write dtype '", descr, "'; ", kAccepted);
  DPTRAIN_CHECK(std::ranges::none_of(shape, [](int64_t d) { return d < 0; }), ".npy header: shape ",
                shape_text(shape), " has a negative dimension");
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape_text(shape) + ", }";
  // As numpy (1.23 on) writes it: room to grow the first axis in place, then 1 to 64 spaces and a '\n'
  // that end the header at a multiple of 64 bytes from the start of the file.
  if (!shape.empty()) header.append(21 - std::to_string(shape[0]).size(), ' ');
  header.append(kAlign - (10 + header.size() + 1) % kAlign, ' ');
  header += '\n';
  DPTRAIN_CHECK(header.size() <= 0xffff, ".npy header: ", header.size(),
                " bytes is too long for version 1.0");
  std::string preamble(kMagic);
  preamble +=
      {'\x01', '\x00', static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
  return preamble + header;
}

void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               std::span<const uint8_t> data) {
  const Dtype* type = find_dtype(descr);
  DPTRAIN_CHECK(type != nullptr, path, ": cannot write dtype '", descr, "'; ", kAccepted);
  DPTRAIN_CHECK(std::ranges::none_of(shape, [](int64_t d) { return d < 0; }), path, ": shape ",
                shape_text(shape), " has a negative dimension");
  const int64_t expected = data_bytes(shape, type->item_bytes, path);
  DPTRAIN_CHECK(static_cast<uint64_t>(expected) == data.size(), path, ": shape ", shape_text(shape), " of ",
                type->name, " needs ", expected, " data bytes, given ", data.size());
  const std::string header = npy_header(descr, shape);
  FileReplacement file(path);
  file.out().write(header.data(), static_cast<std::streamsize>(header.size()));
  file.out().write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  file.commit();
}

namespace {

// Samples are converted from the mapped x file on each read; only the labels are held in memory.
class NpyDataset final : public Dataset {
 public:
  NpyDataset(MappedFile x_file, const NpyArray& x, std::vector<int32_t> labels, int classes)
      : Dataset(x.shape.size() == 4 ? Shape{x.shape[1], x.shape[2], x.shape[3]}
                                    : Shape{1, x.shape[1], x.shape[2]},
                x.shape[0], classes),
        x_file_(std::move(x_file)),
        x_(x.data),
        bytes_(x.dtype == "u1"),
        labels_(std::move(labels)) {}

  int32_t read(int64_t index, float* input, float*) const override {
    DPTRAIN_CHECK(index >= 0 && index < size(), x_file_.path(), ": sample index ", index, " outside [0, ",
                  size(), ")");
    const std::size_t numel = static_cast<std::size_t>(sample_numel());
    if (bytes_) {
      const uint8_t* p = x_.data() + static_cast<std::size_t>(index) * numel;
      for (std::size_t i = 0; i < numel; ++i) input[i] = static_cast<float>(p[i]) / 255.0f;
    } else {
      // numpy aligns the data to 64 bytes, but a mapping of another writer's file may not be aligned.
      std::memcpy(input, x_.data() + static_cast<std::size_t>(index) * numel * sizeof(float),
                  numel * sizeof(float));
    }
    return labels_[static_cast<std::size_t>(index)];
  }
  ReadCost read_cost() const override { return ReadCost::kFile; }

 private:
  MappedFile x_file_;
  std::span<const uint8_t> x_;  // into x_file_'s mapping, which a move keeps in place
  bool bytes_;
  std::vector<int32_t> labels_;
};

MappedFile map_npy(const std::string& path, const std::string& split) {
  DPTRAIN_CHECK(std::filesystem::exists(path), path, ": not found; the npy format reads ", split,
                "_x.npy and ", split, "_y.npy (written by np.save) from data.dir");
  return MappedFile(path);
}

}  // namespace

std::unique_ptr<Dataset> open_npy(const DatasetRequest& r) {
  DPTRAIN_CHECK(
      r.model_classes > 0,
      "data.dataset \"npy\" needs a classifier model (output [classes]) to check its labels against; "
      "this model's output is not [classes]");
  const std::string split = r.train ? "train" : "test";
  const std::string x_path = (std::filesystem::path(r.dir) / (split + "_x.npy")).string();
  const std::string y_path = (std::filesystem::path(r.dir) / (split + "_y.npy")).string();
  MappedFile x_file = map_npy(x_path, split);
  const MappedFile y_file = map_npy(y_path, split);
  const NpyArray x = parse_npy(x_file.bytes(), x_path);
  const NpyArray y = parse_npy(y_file.bytes(), y_path);

  DPTRAIN_CHECK(x.dtype == "u1" || x.dtype == "f4", x_path, ": dtype ", numpy_name(x.dtype),
                "; the inputs must be uint8 (pixels 0..255) or float32");
  DPTRAIN_CHECK(x.shape.size() == 3 || x.shape.size() == 4, x_path, ": shape ", shape_text(x.shape),
                "; expected [N, C, H, W], or [N, H, W] for one channel");
  DPTRAIN_CHECK(std::ranges::find(x.shape, 0) == x.shape.end(), x_path, ": shape ", shape_text(x.shape),
                " has a zero dimension: no samples, or samples of no values");
  DPTRAIN_CHECK(y.dtype == "i8" || y.dtype == "u1", y_path, ": dtype ", numpy_name(y.dtype),
                "; the labels must be int64 or uint8");
  DPTRAIN_CHECK(y.shape.size() == 1, y_path, ": shape ", shape_text(y.shape),
                "; expected [N], one label per sample");
  DPTRAIN_CHECK(x.shape[0] == y.shape[0], x_path, " has ", x.shape[0], " samples but ", y_path, " has ",
                y.shape[0], " labels");

  std::vector<int32_t> labels(static_cast<std::size_t>(y.shape[0]));
  for (std::size_t i = 0; i < labels.size(); ++i) {
    int64_t label = 0;
    if (y.dtype == "u1")
      label = y.data[i];
    else
      std::memcpy(&label, y.data.data() + i * sizeof label, sizeof label);
    DPTRAIN_CHECK(label >= 0 && label < r.model_classes, y_path, ": label ", label, " at index ", i,
                  " is outside [0, ", r.model_classes, "), the model's classes");
    labels[i] = static_cast<int32_t>(label);
  }
  auto dataset = std::make_unique<NpyDataset>(std::move(x_file), x, std::move(labels),
                                              static_cast<int>(r.model_classes));
  dataset->keep_first(r.max_samples);
  return dataset;
}

}  // namespace dptrain::data

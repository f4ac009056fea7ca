// Tests for the .npy reader and writer and the "npy" dataset format, on files written per test.
#include "data/npy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/registry.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using dptrain::data::DatasetRequest;
using dptrain::data::NpyArray;
using dptrain::data::open_npy;
using dptrain::data::parse_npy;
using dptrain::data::write_npy;

namespace {

using dptrain::test_util::error_of;

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A .npy file with this header text as it is (no padding added) and payload.
std::vector<uint8_t> npy_file(const std::string& header, const std::vector<uint8_t>& payload, int major = 1) {
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i)
    out.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::string dict(const std::string& descr, const std::string& shape, const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }\n";
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

const std::string kPath = "/some/dir/a.npy";

// The message parse_npy gives for these bytes; it must start with the path.
std::string parse_error(const std::vector<uint8_t>& file) {
  const std::string msg = error_of([&] { parse_npy(file, kPath); });
  EXPECT_STARTS_WITH(msg, kPath + ": ");
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  return msg;
}

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = dptrain::test_util::make_temp_dir("npy_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(NpyTest, RoundTripsEachDtype) {
  const std::vector<uint8_t> u1 = {0, 1, 127, 128, 254, 255};
  const std::vector<uint8_t> f4 = bytes_of(std::vector<float>{-1.5f, 0.0f, 3.25f, 1e-30f});
  const std::vector<uint8_t> i8 = bytes_of(std::vector<int64_t>{-7, 0, int64_t{1} << 40});
  struct Case {
    std::string descr, dtype;
    std::vector<int64_t> shape;
    int64_t item_bytes;
    const std::vector<uint8_t>& data;
  };
  for (const Case& c : {Case{"|u1", "u1", {2, 3}, 1, u1}, Case{"<f4", "f4", {4}, 4, f4},
                        Case{"<i8", "i8", {3, 1}, 8, i8}, Case{"<u1", "u1", {1, 2, 3}, 1, u1}}) {
    SCOPED_TRACE(c.descr);
    write_npy(path("a.npy"), c.descr, c.shape, c.data);
    const std::vector<uint8_t> file = read_file(path("a.npy"));
    const NpyArray a = parse_npy(file, path("a.npy"));
    EXPECT_EQ(a.dtype, c.dtype);
    EXPECT_EQ(a.shape, c.shape);
    EXPECT_EQ(a.item_bytes, c.item_bytes);
    EXPECT_EQ(std::vector<uint8_t>(a.data.begin(), a.data.end()), c.data);
    EXPECT_EQ((file.size() - c.data.size()) % 64, 0u);  // the data starts 64-aligned, as numpy's
    EXPECT_EQ(file[file.size() - c.data.size() - 1], '\n');
  }
}

TEST_F(NpyTest, WritesTheHeaderNumpyWrites) {
  write_npy(path("a.npy"), "<f4", {5}, bytes_of(std::vector<float>(5)));
  const std::vector<uint8_t> file = read_file(path("a.npy"));
  ASSERT_EQ(file.size(), 128u + 20u);
  EXPECT_EQ(std::string(file.begin(), file.begin() + 10), std::string("\x93NUMPY\x01\x00\x76\x00", 10));
  const std::string header(file.begin() + 10, file.begin() + 128);
  // 20 spaces of room for the first axis, then 40 of padding: byte for byte what np.save writes.
  EXPECT_EQ(header,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }" + std::string(60, ' ') + "\n");

  write_npy(path("s.npy"), "<i8", {}, bytes_of(std::vector<int64_t>{42}));  // a scalar
  const std::vector<uint8_t> scalar = read_file(path("s.npy"));
  EXPECT_EQ(parse_npy(scalar, path("s.npy")).shape, std::vector<int64_t>{});
  write_npy(path("e.npy"), "|u1", {0, 3}, {});
  const std::vector<uint8_t> empty = read_file(path("e.npy"));
  EXPECT_EQ(parse_npy(empty, path("e.npy")).data.size(), 0u);
}

TEST_F(NpyTest, WriteErrorsNameThePath) {
  EXPECT_STARTS_WITH(error_of([&] { write_npy(path("a.npy"), "<f8", {1}, std::vector<uint8_t>(8)); }),
                     path("a.npy") + ": cannot write dtype '<f8'");
  EXPECT_STARTS_WITH(error_of([&] { write_npy(path("a.npy"), "<f4", {2}, std::vector<uint8_t>(7)); }),
                     path("a.npy") + ": shape (2,) of float32 needs 8 data bytes, given 7");
  EXPECT_STARTS_WITH(error_of([&] { write_npy(path("a.npy"), "|u1", {-1}, {}); }),
                     path("a.npy") + ": shape (-1,) has a negative dimension");
  EXPECT_STARTS_WITH(error_of([&] { write_npy(path("no/such/dir/a.npy"), "|u1", {0}, {}); }),
                     path("no/such/dir/a.npy") + ": cannot open for writing");
}

TEST(NpyParse, AcceptsHeaderVariants) {
  const std::vector<uint8_t> six = {1, 2, 3, 4, 5, 6};
  struct Case {
    std::string header;
    int major;
    std::vector<int64_t> shape;
  };
  for (const Case& c : {
           Case{dict("|u1", "(2, 3)"), 2, {2, 3}},
           Case{dict("|u1", "(6,)"), 3, {6}},
           Case{"{'shape': (3, 2), 'fortran_order': False, 'descr': '|u1'}",
                1,
                {3, 2}},  // any order, no comma
           Case{"{\"descr\": \"<u1\", \"fortran_order\": False, \"shape\": (1, 6,)}   \n", 1, {1, 6}},
           Case{"{ 'descr' :'|u1' ,\t'fortran_order':False,'shape':( 6 , ) , }\n", 1, {6}},
           Case{"{'descr': '|u1', 'fortran_order': False, 'shape': (6,), }" + std::string(100, ' ') + "\n",
                1,
                {6}},
       }) {
    SCOPED_TRACE(c.header);
    const std::vector<uint8_t> file = npy_file(c.header, six, c.major);
    const NpyArray a = parse_npy(file, kPath);
    EXPECT_EQ(a.dtype, "u1");
    EXPECT_EQ(a.shape, c.shape);
    EXPECT_EQ(a.data.size(), 6u);
    EXPECT_EQ(a.data[5], 6);
  }
  const std::vector<uint8_t> scalar = npy_file(dict("<f4", "()"), bytes_of(std::vector<float>{2.5f}));
  const NpyArray s = parse_npy(scalar, kPath);
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.data.size(), 4u);
}

TEST(NpyParse, RejectsBadMagicAndVersion) {
  std::vector<uint8_t> file = npy_file(dict("|u1", "(1,)"), {7});
  file[1] = 'X';
  EXPECT_CONTAINS(parse_error(file), "bad magic");
  EXPECT_CONTAINS(parse_error({'P', 'K', 3, 4}), "truncated: 4 bytes");
  EXPECT_CONTAINS(parse_error({}), "truncated: 0 bytes");

  file = npy_file(dict("|u1", "(1,)"), {7});
  file[6] = 4;
  EXPECT_CONTAINS(parse_error(file), "version 4.0 is not supported");
  file[6] = 1;
  file[7] = 1;
  EXPECT_CONTAINS(parse_error(file), "version 1.1 is not supported");
}

TEST(NpyParse, RejectsDtypes) {
  std::string msg = parse_error(npy_file(dict(">f4", "(1,)"), {0, 0, 0, 0}));
  EXPECT_CONTAINS(msg, "'>f4' is big-endian");
  EXPECT_CONTAINS(msg, "'<f4' (float32)");
  msg = parse_error(npy_file(dict("<f8", "(1,)"), std::vector<uint8_t>(8)));
  EXPECT_CONTAINS(msg, "dtype '<f8' is not supported");
  EXPECT_CONTAINS(msg, "'<i8' (int64)");
  EXPECT_CONTAINS(parse_error(npy_file(dict("|i1", "(1,)"), {0})), "dtype '|i1' is not supported");
  EXPECT_CONTAINS(
      parse_error(npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", {})),
      "structured");
}

TEST(NpyParse, RejectsFortranOrder) {
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "(2, 3)", "True"), std::vector<uint8_t>(6))),
                  "Fortran order; save with np.ascontiguousarray");
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "(6,)", "0"), std::vector<uint8_t>(6))), "True or False");
}

TEST(NpyParse, RejectsTruncatedAndTrailingData) {
  std::string msg = parse_error(npy_file(dict("<f4", "(2, 3)"), std::vector<uint8_t>(23)));
  EXPECT_CONTAINS(msg, "truncated");
  EXPECT_CONTAINS(msg, "needs 24 data bytes, the file has 23");
  msg = parse_error(npy_file(dict("<i8", "()"), std::vector<uint8_t>(9)));
  EXPECT_CONTAINS(msg, ": 1 trailing bytes after the 8 data bytes");
}

TEST(NpyParse, RejectsAHeaderPastTheEnd) {
  std::vector<uint8_t> file = npy_file(dict("|u1", "(1,)"), {7});
  file[8] = 0xff;
  EXPECT_CONTAINS(parse_error(file), "truncated: the header's length, 255 bytes, runs past the end");
  file = npy_file(dict("|u1", "(1,)"), {7}, 2);
  file[11] = 0x80;  // 2 GiB
  EXPECT_CONTAINS(parse_error(file), "runs past the end");
  file.resize(11);
  EXPECT_CONTAINS(parse_error(file), "too short for a version 2.0 preamble");
}

TEST(NpyParse, RejectsBadShapes) {
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "(-1,)"), {})), "negative");
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "(2, -3)"), {})), "negative");
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "(2.5,)"), {})), "non-negative int");
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "('a',)"), {})), "non-negative int");
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "(3L,)"), {})), "non-negative int");
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "(3)"), {1, 2, 3})), "1-tuple is (N,)");
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "[3]"), {1, 2, 3})), "a tuple for shape");
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "(,)"), {})), "non-negative int");
}

TEST(NpyParse, RejectsOverflowingShapes) {
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "(99999999999999999999,)"), {})), "overflows");
  EXPECT_CONTAINS(parse_error(npy_file(dict("<i8", "(4294967296, 4294967296)"), {})), "overflows");
  EXPECT_CONTAINS(parse_error(npy_file(dict("<i8", "(1152921504606846976,)"), {})), "overflows");  // 2^60 x 8
  // A zero dim makes any shape empty, as in numpy.
  const std::vector<uint8_t> empty = npy_file(dict("<i8", "(4294967296, 4294967296, 0)"), {});
  EXPECT_EQ(parse_npy(empty, kPath).data.size(), 0u);
}

TEST(NpyParse, RejectsMalformedDicts) {
  EXPECT_CONTAINS(parse_error(npy_file("{'descr': '|u1', 'shape': (1,)}", {1})), "lacks a key");
  EXPECT_CONTAINS(
      parse_error(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (1,), 'x': 1}", {1})),
      "unknown key 'x'");
  EXPECT_CONTAINS(
      parse_error(npy_file("{'descr': '|u1', 'descr': '|u1', 'fortran_order': False, 'shape': (1,)}", {1})),
      "given twice");
  EXPECT_CONTAINS(parse_error(npy_file(dict("|u1", "(1,)") + "x", {1})), "text after the dict");
  EXPECT_CONTAINS(parse_error(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (1,)", {1})),
                  "expected ',' or '}'");
  EXPECT_CONTAINS(parse_error(npy_file("{'descr: '|u1'}", {1})), "expected ':'");
  EXPECT_CONTAINS(parse_error(npy_file("{'descr': 'a\\'b'}", {1})), "escape");
  EXPECT_CONTAINS(parse_error(npy_file("{'descr", {1})), "unterminated string");
  EXPECT_CONTAINS(parse_error(npy_file("", {1})), "expected '{'");
  EXPECT_CONTAINS(parse_error(npy_file("{\x01\xff}", {1})),
                  "expected a quoted string at byte 1 of the header, near \"?\?}\"");
}

// The "npy" format reading a split from dir_.
class NpyDatasetTest : public NpyTest {
 protected:
  DatasetRequest request(bool train = true, int64_t classes = 10) const {
    DatasetRequest r;
    r.train = train;
    r.dir = dir_.string();
    r.model_classes = classes;
    return r;
  }
};

TEST_F(NpyDatasetTest, ReadsUint8ImagesAsPixelsOver255) {
  std::vector<uint8_t> pixels(4 * 2 * 3);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 11);
  write_npy(path("train_x.npy"), "|u1", {4, 2, 3}, pixels);
  write_npy(path("train_y.npy"), "<i8", {4}, bytes_of(std::vector<int64_t>{3, 0, 9, 1}));
  const auto ds = open_npy(request());
  EXPECT_EQ(ds->size(), 4);
  EXPECT_EQ(ds->sample_shape(), (dptrain::Shape{1, 2, 3}));
  EXPECT_EQ(ds->num_classes(), 10);
  EXPECT_EQ(ds->target_width(), 0);
  EXPECT_EQ(ds->read_cost(), dptrain::data::ReadCost::kFile);
  const std::vector<int32_t> labels = {3, 0, 9, 1};
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<float> input(6), expected(6);
    for (std::size_t k = 0; k < 6; ++k) expected[k] = static_cast<float>(pixels[i * 6 + k]) / 255.0f;
    EXPECT_EQ(ds->read(i, input.data(), nullptr), labels[i]);
    EXPECT_TRUE(dptrain::test_util::bitwise_equal(input, expected)) << i;
  }
}

TEST_F(NpyDatasetTest, ReadsFloat32ImagesAsStoredEvenUnaligned) {
  const std::vector<float> values = dptrain::test_util::uniform_values(3 * 2 * 2 * 2, 7);
  // A hand-made header of odd length: the data starts at an unaligned offset.
  write_file(path("test_x.npy"), npy_file(dict("<f4", "(3, 2, 2, 2)") + " ", bytes_of(values)));
  write_npy(path("test_y.npy"), "|u1", {3}, std::vector<uint8_t>{4, 4, 0});
  const auto ds = open_npy(request(/*train=*/false, 5));
  EXPECT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->sample_shape(), (dptrain::Shape{2, 2, 2}));
  EXPECT_EQ(ds->num_classes(), 5);
  std::vector<float> input(8);
  EXPECT_EQ(ds->read(2, input.data(), nullptr), 0);
  EXPECT_TRUE(dptrain::test_util::bitwise_equal(input, std::span<const float>(values).subspan(16, 8)));
}

TEST_F(NpyDatasetTest, KeepsTheFirstMaxSamples) {
  write_npy(path("train_x.npy"), "|u1", {5, 1, 1}, std::vector<uint8_t>{0, 1, 2, 3, 4});
  write_npy(path("train_y.npy"), "|u1", {5}, std::vector<uint8_t>{0, 1, 0, 1, 0});
  DatasetRequest r = request();
  r.max_samples = 2;
  EXPECT_EQ(open_npy(r)->size(), 2);
  r.max_samples = 9;
  EXPECT_EQ(open_npy(r)->size(), 5);
}

TEST_F(NpyDatasetTest, ErrorsNameTheFiles) {
  const std::string x = path("train_x.npy"), y = path("train_y.npy");
  write_npy(x, "|u1", {3, 2, 2}, std::vector<uint8_t>(12));
  write_npy(y, "<i8", {2}, bytes_of(std::vector<int64_t>{0, 1}));
  EXPECT_STARTS_WITH(error_of([&] { open_npy(request()); }), x + " has 3 samples but " + y + " has 2 labels");

  write_npy(y, "<i8", {3}, bytes_of(std::vector<int64_t>{0, 10, 1}));
  EXPECT_STARTS_WITH(error_of([&] { open_npy(request()); }), y + ": label 10 at index 1 is outside [0, 10)");
  write_npy(y, "<i8", {3}, bytes_of(std::vector<int64_t>{0, 1, -1}));
  EXPECT_STARTS_WITH(error_of([&] { open_npy(request()); }), y + ": label -1 at index 2 is outside [0, 10)");
  write_npy(y, "|u1", {3}, std::vector<uint8_t>{0, 1, 2});
  EXPECT_STARTS_WITH(error_of([&] { open_npy(request(true, 2)); }),
                     y + ": label 2 at index 2 is outside [0, 2)");
  EXPECT_CONTAINS(error_of([&] { open_npy(request(true, 0)); }), "needs a classifier model");

  write_npy(y, "<f4", {3}, std::vector<uint8_t>(12));
  EXPECT_STARTS_WITH(error_of([&] { open_npy(request()); }), y + ": dtype float32; the labels must be");
  write_npy(y, "|u1", {3, 1}, std::vector<uint8_t>(3));
  EXPECT_STARTS_WITH(error_of([&] { open_npy(request()); }), y + ": shape (3, 1); expected [N]");
  write_npy(x, "<i8", {3, 1, 1}, std::vector<uint8_t>(24));
  EXPECT_STARTS_WITH(error_of([&] { open_npy(request()); }), x + ": dtype int64; the inputs must be");
  write_npy(x, "|u1", {3, 4}, std::vector<uint8_t>(12));
  EXPECT_STARTS_WITH(error_of([&] { open_npy(request()); }), x + ": shape (3, 4); expected [N, C, H, W]");
  write_npy(x, "|u1", {0, 4, 4}, {});
  EXPECT_STARTS_WITH(error_of([&] { open_npy(request()); }), x + ": shape (0, 4, 4) has a zero dimension");

  const std::string msg = error_of([&] { open_npy(request(/*train=*/false)); });
  EXPECT_STARTS_WITH(msg, path("test_x.npy") + ": not found");
  EXPECT_CONTAINS(msg, "test_y.npy");
  write_npy(path("test_x.npy"), "|u1", {1, 1, 1}, std::vector<uint8_t>{0});
  EXPECT_STARTS_WITH(error_of([&] { open_npy(request(/*train=*/false)); }),
                     path("test_y.npy") + ": not found");
}

}  // namespace

// safetensors: round trips, the PyTorch-written fixture checked against an independent reader in
// this file, and every corruption case reported as a dptrain::Error naming the source and problem.
#include "core/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "tests/test_util.h"

namespace dptrain {
namespace {

const std::string kFixtures = std::string(DPTRAIN_SOURCE_DIR) + "/tests/fixtures/";

using test_util::iota;
using test_util::temp_path;

// A file image with the given header text (not padded) and `data_bytes` bytes of data.
std::vector<char> image(const std::string& header, std::size_t data_bytes) {
  // Sized once, then filled: growing an 8-byte vector by insert() trips a false -Warray-bounds in
  // GCC 12 at -O3.
  std::vector<char> out(8 + header.size() + data_bytes, 0);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::copy(header.begin(), header.end(), out.begin() + 8);
  return out;
}

// Expects parse() to throw an Error whose message contains the source and every fragment.
void expect_parse_error(const std::vector<char>& bytes, std::initializer_list<std::string> fragments) {
  const std::string source = "corrupt_case.safetensors";
  try {
    safetensors::parse(bytes, source);
    ADD_FAILURE() << "parse accepted a corrupt file; expected an error mentioning '" << *fragments.begin()
                  << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(source), std::string::npos) << "message does not name the source: " << message;
    for (const std::string& f : fragments)
      EXPECT_NE(message.find(f), std::string::npos) << "message lacks '" << f << "': " << message;
  }
}

TEST(Safetensors, RoundTripNamesShapesValuesMetadata) {
  const std::vector<NamedTensor> tensors{{"layer.weight", iota({3, 4}, -1.0f)},
                                         {"b", iota({5}, 100.0f)},
                                         {"scalar", iota({}, 7.5f)},
                                         {"cube", iota({2, 1, 3}, -3.0f)}};
  const std::map<std::string, std::string> metadata{{"step", "12"}, {"note", "héllo \"quoted\""}};
  const std::string path = temp_path("roundtrip.safetensors");
  safetensors::save(path, tensors, metadata);
  const safetensors::File file = safetensors::load(path);
  std::filesystem::remove(path);

  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file.tensors[i].name, tensors[i].name) << "file order must be preserved";
    const Tensor& t = file.tensors[i].tensor;
    EXPECT_EQ(t.shape(), tensors[i].tensor.shape());
    for (int64_t k = 0; k < t.numel(); ++k) EXPECT_EQ(t.data()[k], tensors[i].tensor.data()[k]);
  }
  EXPECT_EQ(file.metadata, metadata);
  ASSERT_NE(file.find("b"), nullptr);
  EXPECT_EQ(file.find("b")->data()[4], 101.0f);
  EXPECT_EQ(file.find("missing"), nullptr);
}

// The serialised bytes follow the format: u64 LE header length, 8-byte aligned data, contiguous offsets.
TEST(Safetensors, SerializedLayoutIsStandard) {
  const std::vector<char> bytes =
      safetensors::serialize({{"a", iota({2, 3}, 0.0f)}, {"b", iota({1}, 9.0f)}}, {{"k", "v"}});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 7 * 4);
  const auto header =
      nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  EXPECT_EQ(header["a"]["dtype"], "F32");
  EXPECT_EQ(header["a"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json({24, 28}));
  EXPECT_EQ(header["__metadata__"]["k"], "v");
  float b;
  std::memcpy(&b, bytes.data() + 8 + n + 24, 4);
  EXPECT_EQ(b, 9.0f);
}

TEST(Safetensors, RoundTripOfZeroElementTensors) {
  // A zero-element tensor occupies an empty span [o, o) at the same offset where the next tensor begins.
  const std::vector<NamedTensor> tensors{
      {"first", iota({2}, 1.0f)}, {"empty", iota({0, 3}, 0.0f)}, {"after", iota({3}, 5.0f)}};
  const std::vector<char> bytes = safetensors::serialize(tensors);
  const safetensors::File file = safetensors::parse(bytes, "zero.safetensors");
  ASSERT_EQ(file.tensors.size(), 3u);
  ASSERT_NE(file.find("empty"), nullptr);
  EXPECT_EQ(file.find("empty")->shape(), (Shape{0, 3}));
  ASSERT_NE(file.find("after"), nullptr);
  EXPECT_EQ(file.find("after")->data()[2], 5.5f);
}

TEST(Safetensors, EmptyFileHasNoTensors) {
  const safetensors::File file = safetensors::parse(safetensors::serialize({}), "empty.safetensors");
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_TRUE(file.metadata.empty());
}

TEST(Safetensors, SerializeRejectsDuplicateAndReservedNames) {
  EXPECT_THROW(safetensors::serialize({{"a", iota({1}, 0)}, {"a", iota({1}, 0)}}), Error);
  EXPECT_THROW(safetensors::serialize({{"__metadata__", iota({1}, 0)}}), Error);
}

// The fixture written by make_fixtures.py, compared against a reader written here from the spec.
TEST(Safetensors, ParsesTheTorchFixtureLikeAnIndependentReader) {
  const std::string path = kFixtures + "layers.safetensors";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << "missing fixture " << path;
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian host
  const auto header =
      nlohmann::ordered_json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  const char* data = bytes.data() + 8 + n;

  const safetensors::File file = safetensors::load(path);
  std::size_t expected_tensors = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : entry.items()) {
        ASSERT_TRUE(file.metadata.count(k)) << k;
        EXPECT_EQ(file.metadata.at(k), v.get<std::string>());
      }
      EXPECT_EQ(file.metadata.size(), entry.size());
      continue;
    }
    ++expected_tensors;
    const Tensor* t = file.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape(), entry["shape"].get<Shape>()) << name;
    const uint64_t begin = entry["data_offsets"][0];
    const std::string dtype = entry["dtype"];
    for (int64_t i = 0; i < t->numel(); ++i) {
      if (dtype == "F32") {
        float v;
        std::memcpy(&v, data + begin + 4 * i, 4);
        ASSERT_EQ(t->data()[i], v) << name << "[" << i << "]";
      } else {
        ASSERT_EQ(dtype, "I32");
        int32_t v;
        std::memcpy(&v, data + begin + 4 * i, 4);
        ASSERT_EQ(t->data()[i], static_cast<float>(v)) << name << "[" << i << "]";
      }
    }
  }
  EXPECT_EQ(file.tensors.size(), expected_tensors);
  // Spot checks from the fixture's README.
  ASSERT_NE(file.find("conv_s2p1.x"), nullptr);
  EXPECT_EQ(file.find("conv_s2p1.x")->shape(), (Shape{2, 3, 8, 8}));
  EXPECT_EQ(file.metadata.at("conv_s2p1.stride"), "2");
  EXPECT_TRUE(file.metadata.count("torch_version"));
  ASSERT_NE(file.find("ce.labels"), nullptr);
  for (float label : file.find("ce.labels")->values()) {
    EXPECT_EQ(label, std::floor(label));
    EXPECT_GE(label, 0.0f);
    EXPECT_LT(label, 10.0f);
  }
  // File order is data order.
  for (std::size_t i = 1; i < file.tensors.size(); ++i) {
    const uint64_t prev = header[file.tensors[i - 1].name]["data_offsets"][0];
    const uint64_t cur = header[file.tensors[i].name]["data_offsets"][0];
    EXPECT_LT(prev, cur);
  }
}

TEST(SafetensorsCorrupt, ShorterThanEightBytes) {
  expect_parse_error({'\x10', '\0', '\0'}, {"3 bytes", "8-byte"});
  expect_parse_error({}, {"0 bytes"});
}

TEST(SafetensorsCorrupt, HeaderLengthPastEndOfFile) {
  std::vector<char> bytes = image("{}", 0);
  bytes[0] = 100;  // claims 100 header bytes, has 2
  expect_parse_error(bytes, {"header length 100", "past the end"});
  std::vector<char> huge = image("{}", 0);
  for (int i = 0; i < 8; ++i) huge[i] = '\xff';  // 2^64 - 1: must not wrap around
  expect_parse_error(huge, {"header length", "past the end"});
}

TEST(SafetensorsCorrupt, HeaderNotJson) {
  expect_parse_error(image("{\"a\": [1, 2", 0), {"not valid JSON"});
  expect_parse_error(image("\xff\xfe garbage", 0), {"not valid JSON"});
}

TEST(SafetensorsCorrupt, HeaderNotAnObject) {
  expect_parse_error(image("[1, 2, 3]", 0), {"not a JSON object"});
  expect_parse_error(image("42      ", 0), {"not a JSON object"});
}

TEST(SafetensorsCorrupt, OffsetsOutOfRange) {
  expect_parse_error(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
                     {"'w'", "out of range"});
  expect_parse_error(image(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8),
                     {"'w'", "out of range"});
  expect_parse_error(image(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 8), {"'w'"});
}

TEST(SafetensorsCorrupt, OverlappingOffsets) {
  expect_parse_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           12),
                     {"'a'", "'b'", "overlap"});
}

TEST(SafetensorsCorrupt, SizeShapeMismatch) {
  expect_parse_error(image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                     {"'w'", "[3]", "needs 12 bytes", "span 8"});
  expect_parse_error(image(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
                     {"'w'", "invalid shape"});
}

// Found by fuzz_checkpoint: a shape or offset that is a float (here beyond int64's range) reached
// nlohmann's get<int64_t>(), a float-to-integer cast that is undefined out of range; a negative
// offset wrapped into uint64_t.
TEST(SafetensorsCorrupt, NonIntegerShapesAndOffsets) {
  expect_parse_error(image(R"({"w":{"dtype":"F32","shape":[2.9e38],"data_offsets":[0,4]}})", 4),
                     {"'w'", "shape entry that is not an integer", "2.9e+38"});
  expect_parse_error(image(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
                     {"'w'", "shape entry that is not an integer"});
  expect_parse_error(image(R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4),
                     {"'w'", "int64's range"});
  expect_parse_error(image(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
                     {"'w'", "negative data offset"});
  expect_parse_error(image(R"({"w":{"dtype":"F32","shape":7,"data_offsets":[0,4]}})", 4),
                     {"'w'", "shape that is not a list"});
}

TEST(SafetensorsCorrupt, UnsupportedDtype) {
  for (const std::string dtype : {"F16", "BF16", "F64", "I16", "U8"})
    expect_parse_error(image(R"({"w":{"dtype":")" + dtype + R"(","shape":[2],"data_offsets":[0,4]}})", 4),
                       {"'w'", "dtype " + dtype});
}

// BatchNorm's num_batches_tracked is an int64 scalar in PyTorch: read as a float, written back as I64.
TEST(Safetensors, Int64CountersRoundTrip) {
  const Tensor count = Tensor::from_data({}, std::vector<float>{12345.0f});
  const std::vector<char> bytes =
      safetensors::serialize({{"bn.num_batches_tracked", count, StoredType::kI64}});
  const std::string text(bytes.begin() + 8, bytes.end());
  EXPECT_NE(text.find(R"("dtype":"I64","shape":[])"), std::string::npos) << text;
  const safetensors::File file = safetensors::parse(bytes, "counter");
  ASSERT_EQ(file.tensors.size(), 1u);
  EXPECT_EQ(file.tensors[0].stored, StoredType::kI64);
  EXPECT_EQ(file.tensors[0].tensor.shape(), Shape{});
  EXPECT_EQ(file.tensors[0].tensor.item(), 12345.0f);
  // An I64 entry's size is checked in 8-byte elements.
  expect_parse_error(image(R"({"n":{"dtype":"I64","shape":[2],"data_offsets":[0,8]}})", 8),
                     {"'n'", "needs 16 bytes"});
}

TEST(SafetensorsCorrupt, MetadataValueNotAString) {
  expect_parse_error(image(R"({"__metadata__":{"lr":0.1}})", 0), {"__metadata__.lr", "not a string"});
  expect_parse_error(image(R"({"__metadata__":[1]})", 0), {"__metadata__", "not an object"});
}

TEST(SafetensorsCorrupt, MalformedEntries) {
  expect_parse_error(image(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), {"'w'", "malformed"});
  expect_parse_error(image(R"({"w":5})", 4), {"'w'", "malformed"});
  expect_parse_error(image(R"({"w":{"dtype":"F32","shape":"x","data_offsets":[0,4]}})", 4),
                     {"'w'", "shape that is not a list"});
}

TEST(Safetensors, LoadNamesAMissingFile) {
  const std::string path = temp_path("does_not_exist.safetensors");
  try {
    safetensors::load(path);
    FAIL() << "loading a missing file must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Safetensors, TruncatedFileOnDiskIsRejected) {
  const std::string path = temp_path("truncated.safetensors");
  safetensors::save(path, {{"w", iota({16}, 0.0f)}});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  try {
    safetensors::load(path);
    FAIL() << "a truncated file must not load";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace dptrain

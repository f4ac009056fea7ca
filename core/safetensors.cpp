// safetensors reader and writer: F32 tensors, and I64 for integer counters (held as floats here);
// I32 is read as well, converted to float.
#include "core/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_replacement.h"

namespace dptrain::safetensors {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit

void put_u64_le(std::vector<char>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64_le(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

const Tensor* File::find(const std::string& name) const {
  for (const NamedTensor& t : tensors)
    if (t.name == name) return &t.tensor;
  return nullptr;
}

std::vector<char> serialize(const std::vector<NamedTensor>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    DPTRAIN_CHECK(t.name != "__metadata__" && !header.contains(t.name),
                  "safetensors: duplicate or reserved name '", t.name, "'");
    const bool i64 = t.stored == StoredType::kI64;
    const uint64_t bytes = static_cast<uint64_t>(t.tensor.numel()) * (i64 ? 8 : 4);
    header[t.name] = {{"dtype", i64 ? "I64" : "F32"},
                      {"shape", t.tensor.shape()},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned

  std::vector<char> out;
  out.reserve(8 + text.size() + offset);
  put_u64_le(out, text.size());
  out.insert(out.end(), text.begin(), text.end());
  static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");
  for (const NamedTensor& t : tensors) {
    if (t.stored == StoredType::kI64) {
      for (const float v : t.tensor.values()) {
        const int64_t count = std::llround(v);
        const char* p = reinterpret_cast<const char*>(&count);
        out.insert(out.end(), p, p + sizeof count);
      }
      continue;
    }
    const char* p = reinterpret_cast<const char*>(t.tensor.data());
    out.insert(out.end(), p, p + t.tensor.numel() * sizeof(float));
  }
  return out;
}

namespace {

// A JSON array of integers as int64. nlohmann's get<int64_t>() would cast a float such as 3e38
// (undefined behaviour out of range: found by fuzz_checkpoint) and wrap a negative into uint64_t.
std::vector<int64_t> integers(const json& list, const std::string& source, const std::string& name,
                              const char* field) {
  DPTRAIN_CHECK(list.is_array(), source, ": tensor '", name, "' has a ", field, " that is not a list");
  std::vector<int64_t> out;
  for (const json& v : list) {
    DPTRAIN_CHECK(v.is_number_integer() &&
                      !(v.is_number_unsigned() &&
                        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())),
                  source, ": tensor '", name, "' has a ", field,
                  " entry that is not an integer in int64's range: ", v.dump());
    out.push_back(v.get<int64_t>());
  }
  return out;
}

}  // namespace

File parse(const std::vector<char>& bytes, const std::string& source) {
  DPTRAIN_CHECK(bytes.size() >= 8, source, ": not a safetensors file: ", bytes.size(),
                " bytes, shorter than the 8-byte header length");
  const uint64_t header_len = get_u64_le(bytes.data());
  DPTRAIN_CHECK(header_len <= kMaxHeaderBytes && header_len <= bytes.size() - 8, source, ": header length ",
                header_len, " runs past the end of the file (", bytes.size(), " bytes)");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_len));
  } catch (const json::exception& e) {
    DPTRAIN_FAIL(source, ": header is not valid JSON: ", e.what());
  }
  DPTRAIN_CHECK(header.is_object(), source, ": header is not a JSON object");
  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = bytes.size() - data_begin;

  File file;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      DPTRAIN_CHECK(entry.is_object(), source, ": __metadata__ is not an object");
      for (auto& [key, value] : entry.items()) {
        DPTRAIN_CHECK(value.is_string(), source, ": __metadata__.", key, " is not a string");
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    try {
      const std::string dtype = entry.at("dtype").get<std::string>();
      const std::vector<int64_t> shape = integers(entry.at("shape"), source, name, "shape");
      std::vector<uint64_t> offsets;
      for (const int64_t offset : integers(entry.at("data_offsets"), source, name, "data_offsets")) {
        DPTRAIN_CHECK(offset >= 0, source, ": tensor '", name, "' has a negative data offset");
        offsets.push_back(static_cast<uint64_t>(offset));
      }
      DPTRAIN_CHECK(dtype == "F32" || dtype == "I32" || dtype == "I64", source, ": tensor '", name,
                    "' has dtype ", dtype, "; only F32 (and I32, I64 counters) are supported");
      const uint64_t element_bytes = dtype == "I64" ? 8 : 4;
      DPTRAIN_CHECK(offsets.size() == 2 && offsets[0] <= offsets[1] && offsets[1] <= data_size, source,
                    ": tensor '", name, "' data_offsets out of range (data section is ", data_size,
                    " bytes): the file is truncated or damaged");
      uint64_t numel = 1;
      for (int64_t d : shape) {
        DPTRAIN_CHECK(
            d >= 0 && (d == 0 || numel <= std::numeric_limits<uint32_t>::max() / static_cast<uint64_t>(d)),
            source, ": tensor '", name, "' has an invalid shape");
        numel *= static_cast<uint64_t>(d);
      }
      DPTRAIN_CHECK(offsets[1] - offsets[0] == numel * element_bytes, source, ": tensor '", name, "' shape ",
                    shape_str(shape), " needs ", numel * element_bytes, " bytes but its offsets span ",
                    offsets[1] - offsets[0]);
      spans.push_back({offsets[0], offsets[1], name});
      Tensor t = Tensor::empty(shape);
      const char* src = bytes.data() + data_begin + offsets[0];
      if (dtype == "F32") {
        std::memcpy(t.data(), src, numel * 4);
      } else if (dtype == "I64") {
        for (uint64_t i = 0; i < numel; ++i) {
          int64_t v;
          std::memcpy(&v, src + 8 * i, 8);
          t.data()[i] = static_cast<float>(v);
        }
      } else {
        for (uint64_t i = 0; i < numel; ++i) {
          int32_t v;
          std::memcpy(&v, src + 4 * i, 4);
          t.data()[i] = static_cast<float>(v);
        }
      }
      file.tensors.push_back({name, std::move(t), dtype == "I64" ? StoredType::kI64 : StoredType::kF32});
    } catch (const json::exception& e) {
      DPTRAIN_FAIL(source, ": tensor '", name, "' has a malformed entry: ", e.what());
    }
  }
  // Empty tensors occupy no bytes and cannot overlap anything.
  std::erase_if(spans, [](const Span& s) { return s.begin == s.end; });
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < spans.size(); ++i)
    DPTRAIN_CHECK(spans[i].begin >= spans[i - 1].end, source, ": tensors '", spans[i - 1].name, "' and '",
                  spans[i].name, "' overlap");
  // Keep file order (by offset) so writers and readers agree on what "first" means.
  const auto offsets = [&](const NamedTensor& t) {
    return header[t.name]["data_offsets"].get<std::vector<uint64_t>>();
  };
  std::stable_sort(file.tensors.begin(), file.tensors.end(),
                   [&](const NamedTensor& a, const NamedTensor& b) { return offsets(a) < offsets(b); });
  return file;
}

void save(const std::string& path, const std::vector<NamedTensor>& tensors,
          const std::map<std::string, std::string>& metadata) {
  const std::vector<char> bytes = serialize(tensors, metadata);
  FileReplacement file(path);
  file.out().write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.commit();
}

File load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DPTRAIN_CHECK(in, path, ": cannot open for reading");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse(bytes, path);
}

}  // namespace dptrain::safetensors

// Checkpoint encoding, durable writing, validation, listing and pruning.
#include "trainer/checkpoint_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <utility>

#include "core/error.h"

namespace dptrain::trainer {
namespace {

namespace fs = std::filesystem;

const std::regex kCheckpointName(R"(ckpt-(\d+)\.safetensors)");
const std::regex kTempName(R"(\.ckpt-\d+\.safetensors\.tmp)");
const std::regex kSetAsideName(R"(set-aside-.+-ckpt-\d+\.safetensors)");

std::string hex32(uint32_t v) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

uint32_t crc_of_tensors(const std::vector<const std::vector<NamedTensor>*>& lists) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  for (const auto* list : lists)
    for (const NamedTensor& t : *list)
      crc = crc32_z(crc, reinterpret_cast<const Bytef*>(t.tensor.data()), t.tensor.numel() * sizeof(float));
  return static_cast<uint32_t>(crc);
}

// Over every metadata entry but the checksum itself: a flipped digit in, say, the step count is
// caught like one in the weights.
uint32_t crc_of_metadata(const std::map<std::string, std::string>& metadata) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  for (const auto& [key, value] : metadata) {
    if (key == "metadata_crc32") continue;
    for (const std::string* s : {&key, &value})
      crc = crc32_z(crc, reinterpret_cast<const Bytef*>(s->c_str()), s->size() + 1);  // with the '\0'
  }
  return static_cast<uint32_t>(crc);
}

int64_t parse_count(const Checkpoint& c, const std::string& key) {
  const std::string& text = c.meta(key);
  int64_t value = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  DPTRAIN_CHECK(ec == std::errc() && end == text.data() + text.size() && value >= 0, c.path, ": metadata ",
                key, " = '", text, "' is not a non-negative integer");
  return value;
}

// A failed step of writing `target`: one line naming the file, the step and the reason.
[[noreturn]] void fail_write(const std::string& target, const std::string& step, int error) {
  DPTRAIN_FAIL("cannot write ", target, ": ", step, " failed: ", errno_text(error),
               "; nothing was left behind and earlier files are untouched (is the disk full, the "
               "file system read-only, the directory writable?)");
}

void write_all(int fd, const char* data, std::size_t size, const std::string& target, std::size_t& written) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_write(target, "write after " + std::to_string(written) + " bytes", n < 0 ? errno : EIO);
    data += n;
    size -= static_cast<std::size_t>(n);
    written += static_cast<std::size_t>(n);
  }
}

}  // namespace

const std::string& Checkpoint::meta(const std::string& key) const {
  const auto it = file.metadata.find(key);
  DPTRAIN_CHECK(it != file.metadata.end(), path, ": metadata entry '", key,
                "' is missing; not a dptrain checkpoint?");
  return it->second;
}

std::string checkpoint_file_name(int64_t global_step) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-%08lld.safetensors", static_cast<long long>(global_step));
  return name;
}

std::vector<char> encode_checkpoint(const CheckpointData& data) {
  // Host copies of device tensors (host tensors are used as they are).
  std::vector<NamedTensor> tensors;
  for (const NamedTensor& t : data.parameters)
    tensors.push_back({t.name, t.tensor.to(Device::cpu()), t.stored});
  for (const NamedTensor& t : data.optimizer_state)
    tensors.push_back({kOptimizerPrefix + t.name, t.tensor.to(Device::cpu())});
  std::map<std::string, std::string> metadata = data.metadata;
  const TrainingPosition& p = data.position;
  metadata["format"] = "pt";  // what safetensors' PyTorch loader expects
  metadata["dptrain_checkpoint_version"] = std::to_string(kCheckpointFormatVersion);
  metadata["epochs_completed"] = std::to_string(p.epochs_completed);
  metadata["epoch_samples_done"] = std::to_string(p.epoch_samples_done);
  metadata["global_step"] = std::to_string(p.global_step);
  metadata["samples_seen"] = std::to_string(p.samples_seen);
  metadata["optimizer_steps"] = std::to_string(p.optimizer_steps);
  metadata["crc32"] = hex32(crc_of_tensors({&tensors}));
  metadata["metadata_crc32"] = hex32(crc_of_metadata(metadata));
  return safetensors::serialize(tensors, metadata);
}

void write_file_durably(const std::string& path, const std::vector<char>& bytes,
                        const std::function<void()>& midway) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string temp = (dir / ("." + target.filename().string() + ".tmp")).string();
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_write(path, "creating " + temp, errno);
  // Until the rename, a failure removes the temp file: a full disk keeps no partial checkpoint.
  bool fd_open = true;
  try {
    std::size_t written = 0;
    const std::size_t half = bytes.size() / 2;
    write_all(fd, bytes.data(), half, path, written);
    if (midway) midway();
    write_all(fd, bytes.data() + half, bytes.size() - half, path, written);
    // Network and quota-enforcing file systems may report ENOSPC or EDQUOT only here.
    if (::fsync(fd) != 0) fail_write(path, "fsync of " + std::to_string(bytes.size()) + " bytes", errno);
    fd_open = false;
    if (::close(fd) != 0) fail_write(path, "close", errno);
    if (std::rename(temp.c_str(), path.c_str()) != 0) fail_write(path, "rename from " + temp, errno);
  } catch (...) {
    if (fd_open) ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  // The rename itself is durable only once the directory entry is on disk.
  sync_directory(dir.string());
}

void sync_directory(const std::string& dir) {
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int synced = dir_fd < 0 ? -1 : ::fsync(dir_fd);
  const int error = errno;
  if (dir_fd >= 0) ::close(dir_fd);
  DPTRAIN_CHECK(synced == 0, "could not fsync the directory ", dir, ": ", errno_text(error),
                "; what was just written or renamed in it may not survive a crash of this machine");
}

Checkpoint read_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DPTRAIN_CHECK(in, path, ": cannot open checkpoint for reading");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return validate_checkpoint(safetensors::parse(bytes, path), path);
}

Checkpoint validate_checkpoint(safetensors::File file, const std::string& path) {
  Checkpoint c{path, {}, std::move(file)};

  const std::string& version = c.meta("dptrain_checkpoint_version");
  DPTRAIN_CHECK(version == std::to_string(kCheckpointFormatVersion), path, ": checkpoint format version ",
                version, "; this build reads version ", kCheckpointFormatVersion);
  const std::string stored_meta = c.meta("metadata_crc32"),
                    computed_meta = hex32(crc_of_metadata(c.file.metadata));
  DPTRAIN_CHECK(stored_meta == computed_meta, path, ": metadata checksum mismatch (crc32 stored ",
                stored_meta, ", computed ", computed_meta, "): the file is damaged");
  // parse() keeps file (= data) order, the order the checksum was computed in.
  const std::string stored = c.meta("crc32"), computed = hex32(crc_of_tensors({&c.file.tensors}));
  DPTRAIN_CHECK(stored == computed, path, ": tensor data checksum mismatch (crc32 stored ", stored,
                ", computed ", computed, "): the file is damaged");

  TrainingPosition& p = c.position;
  p.epochs_completed = parse_count(c, "epochs_completed");
  p.epoch_samples_done = parse_count(c, "epoch_samples_done");
  p.global_step = parse_count(c, "global_step");
  p.samples_seen = parse_count(c, "samples_seen");
  p.optimizer_steps = parse_count(c, "optimizer_steps");
  return c;
}

void restore(const Checkpoint& checkpoint, const std::vector<NamedTensor>& parameters,
             const std::vector<NamedTensor>* optimizer_state,
             const std::vector<std::string>& optional_state) {
  const std::string prefix = kOptimizerPrefix;
  const auto optional = [&](const std::string& stored_name) {
    return std::any_of(optional_state.begin(), optional_state.end(),
                       [&](const std::string& name) { return prefix + name == stored_name; });
  };
  // (target, stored name) pairs, all checked before anything is copied: a rejected checkpoint must
  // leave the model as it was.
  std::vector<std::pair<const NamedTensor*, std::string>> targets;
  for (const NamedTensor& p : parameters) targets.emplace_back(&p, p.name);
  if (optimizer_state != nullptr)
    for (const NamedTensor& s : *optimizer_state)
      if (!optional(prefix + s.name) || checkpoint.file.find(prefix + s.name) != nullptr)
        targets.emplace_back(&s, prefix + s.name);
  for (const auto& [target, stored_name] : targets) {
    const Tensor* source = checkpoint.file.find(stored_name);
    DPTRAIN_CHECK(source != nullptr, checkpoint.path, ": tensor '", stored_name,
                  "' is missing (was it written for another model or optimizer?)");
    DPTRAIN_CHECK(source->shape() == target->tensor.shape(), checkpoint.path, ": tensor '", stored_name,
                  "' has shape ", shape_str(source->shape()), " but the configured model's is ",
                  shape_str(target->tensor.shape()), " (was it written for another model.layers?)");
  }
  for (const NamedTensor& t : checkpoint.file.tensors) {
    const bool is_state = t.name.starts_with(prefix);
    if (is_state && (optimizer_state == nullptr || optional(t.name))) continue;
    const bool known =
        std::any_of(targets.begin(), targets.end(), [&](const auto& x) { return x.second == t.name; });
    DPTRAIN_CHECK(known, checkpoint.path, ": tensor '", t.name, "' has no counterpart in the configured ",
                  is_state ? "optimizer (another optimizer.type?)" : "model (another model.layers?)");
  }
  for (const auto& [target, stored_name] : targets)
    target->tensor.copy_from(*checkpoint.file.find(stored_name));
}

std::optional<int64_t> checkpoint_step_of(const std::string& file_name) {
  std::smatch m;
  if (!std::regex_match(file_name, m, kCheckpointName)) return std::nullopt;
  int64_t step = 0;
  const std::string digits = m[1].str();
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  // Not a step this trainer could have written (past int64): not one of its checkpoints.
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return step;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    if (const auto step = checkpoint_step_of(entry.path().filename().string()))
      found.emplace_back(*step, entry.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

void remove_checkpoint(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
  DPTRAIN_CHECK(!ec, path, ": cannot remove this checkpoint (", ec.message(),
                "); check the permissions of its directory, or move it away");
}

std::string set_checkpoint_aside(const std::string& path, const std::string& stamp) {
  const fs::path from(path);
  const fs::path to = from.parent_path() / ("set-aside-" + stamp + "-" + from.filename().string());
  std::error_code ec;
  DPTRAIN_CHECK(!fs::exists(to, ec), path, ": cannot set it aside as ", to.string(),
                ", which exists; move one of them away by hand");
  fs::rename(from, to, ec);
  DPTRAIN_CHECK(!ec, path, ": cannot rename it to ", to.string(), " (", ec.message(),
                "); check the permissions of its directory, or move it away by hand");
  return to.string();
}

std::vector<std::string> list_set_aside(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() && std::regex_match(entry.path().filename().string(), kSetAsideName))
      found.push_back(entry.path().string());
  std::sort(found.begin(), found.end());
  return found;
}

void prune_checkpoints(const std::string& dir, int64_t keep) {
  const std::vector<std::string> all = list_checkpoints(dir);
  for (std::size_t i = static_cast<std::size_t>(keep); keep > 0 && i < all.size(); ++i)
    remove_checkpoint(all[i]);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (std::regex_match(entry.path().filename().string(), kTempName)) fs::remove(entry.path(), ec);
}

std::optional<Checkpoint> newest_valid_checkpoint(
    const std::string& dir, const std::function<void(const Checkpoint&)>& accept,
    const std::function<void(const std::string&, const std::string&)>& report) {
  for (const std::string& path : list_checkpoints(dir)) {
    try {
      Checkpoint c = read_checkpoint(path);
      accept(c);
      return c;
    } catch (const Error& e) {
      report(path, e.what());
    }
  }
  return std::nullopt;
}

}  // namespace dptrain::trainer

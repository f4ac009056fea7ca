// Checkpoint files: round trip of tensors and position, names and listing, pruning, the durable
// write surviving an interrupted writer, and every kind of damage rejected with the file's name and
// the problem (under AddressSanitizer in CI: no crash, no read out of bounds).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"
#include "trainer/checkpoint_file.h"
#include "trainer/checkpoint_policy.h"

namespace dptrain::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

CheckpointData sample_data() {
  CheckpointData d;
  d.parameters = {{"0.weight", test_util::iota({3, 2}, 1.0f)}, {"0.bias", test_util::iota({3}, -2.0f)}};
  d.optimizer_state = {{"0.weight.exp_avg", test_util::iota({3, 2}, 0.5f)},
                       {"0.bias.exp_avg", test_util::iota({3}, 7.0f)}};
  d.position = {2, 640, 123, 4480, 123};
  d.metadata = {{"world_size", "2"}, {"batch_size", "32"}, {"config", R"({"seed":1})"}};
  return d;
}

// Same names and shapes as sample_data(), other values: what a freshly built model holds.
std::vector<NamedTensor> blank_like(const std::vector<NamedTensor>& list) {
  std::vector<NamedTensor> out;
  for (const NamedTensor& t : list) out.push_back({t.name, Tensor::zeros(t.tensor.shape())});
  return out;
}

void expect_equal(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    ASSERT_EQ(a[i].tensor.shape(), b[i].tensor.shape());
    EXPECT_EQ(std::memcmp(a[i].tensor.data(), b[i].tensor.data(), a[i].tensor.numel() * sizeof(float)), 0)
        << a[i].name;
  }
}

class CheckpointFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test_util::make_temp_dir("ckpt"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(int64_t step) const { return (dir_ / checkpoint_file_name(step)).string(); }

  std::string write(int64_t step, const CheckpointData& data = sample_data()) {
    write_file_durably(path(step), encode_checkpoint(data));
    return path(step);
  }

  static void write_raw(const std::string& p, const std::vector<char>& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  // read_checkpoint (and, given targets, restore) must throw naming the file and every fragment.
  void expect_rejected(const std::vector<char>& bytes, std::initializer_list<std::string> fragments,
                       const std::vector<NamedTensor>* parameters = nullptr,
                       const std::vector<NamedTensor>* optimizer_state = nullptr) {
    const std::string p = path(5);
    write_raw(p, bytes);
    try {
      const Checkpoint c = read_checkpoint(p);
      if (parameters != nullptr) restore(c, *parameters, optimizer_state);
      ADD_FAILURE() << "accepted a damaged checkpoint; expected an error mentioning '" << *fragments.begin()
                    << "'";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(p), std::string::npos) << "does not name the file: " << message;
      for (const std::string& f : fragments) EXPECT_NE(message.find(f), std::string::npos) << message;
    }
  }

  fs::path dir_;
};

std::vector<char> encoded() {
  return encode_checkpoint(sample_data());
}

uint64_t header_length(const std::vector<char>& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

// The same file with its JSON header edited (data section unchanged).
std::vector<char> with_header(const std::vector<char>& bytes, const std::function<void(json&)>& edit) {
  const uint64_t n = header_length(bytes);
  json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  edit(header);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();
  std::string out(reinterpret_cast<const char*>(&len), 8);
  out += text;
  out.append(bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n), bytes.end());
  return std::vector<char>(out.begin(), out.end());
}

TEST_F(CheckpointFiles, RoundTripsTensorsPositionAndMetadata) {
  const CheckpointData data = sample_data();
  const Checkpoint c = read_checkpoint(write(123, data));
  EXPECT_EQ(c.position.epochs_completed, 2);
  EXPECT_EQ(c.position.epoch_samples_done, 640);
  EXPECT_EQ(c.position.global_step, 123);
  EXPECT_EQ(c.position.samples_seen, 4480);
  EXPECT_EQ(c.position.optimizer_steps, 123);
  EXPECT_EQ(c.meta("world_size"), "2");
  EXPECT_EQ(c.meta("config"), R"({"seed":1})");
  EXPECT_EQ(c.meta("format"), "pt");
  EXPECT_EQ(c.meta("crc32").size(), 8u);
  // Weights under their own (PyTorch) names, optimizer state under a prefix of its own.
  ASSERT_NE(c.file.find("0.weight"), nullptr);
  ASSERT_NE(c.file.find("optimizer.0.weight.exp_avg"), nullptr);

  const std::vector<NamedTensor> params = blank_like(data.parameters),
                                 state = blank_like(data.optimizer_state);
  restore(c, params, &state);
  expect_equal(params, data.parameters);
  expect_equal(state, data.optimizer_state);

  const std::vector<NamedTensor> weights_only = blank_like(data.parameters);
  restore(c, weights_only, nullptr);
  expect_equal(weights_only, data.parameters);
}

TEST_F(CheckpointFiles, NamesSortByStepAndListingIsNewestFirst) {
  EXPECT_EQ(checkpoint_file_name(1234), "ckpt-00001234.safetensors");
  for (int64_t step : {40, 7, 123456789, 300}) write(step);
  std::ofstream(dir_ / "notes.txt") << "not a checkpoint";
  std::ofstream(dir_ / ".ckpt-00000500.safetensors.tmp") << "an interrupted write";
  // Past int64: no step of this trainer's, so not one of its checkpoints (it once threw "stoll").
  std::ofstream(dir_ / "ckpt-99999999999999999999.safetensors") << "a stray file";
  EXPECT_EQ(checkpoint_step_of("ckpt-00001234.safetensors"), 1234);
  EXPECT_EQ(checkpoint_step_of("ckpt-99999999999999999999.safetensors"), std::nullopt);
  EXPECT_EQ(checkpoint_step_of("model.safetensors"), std::nullopt);
  const std::vector<std::string> listed = list_checkpoints(dir_.string());
  EXPECT_EQ(listed, (std::vector<std::string>{path(123456789), path(300), path(40), path(7)}));
  EXPECT_TRUE(list_checkpoints((dir_ / "absent").string()).empty());
}

TEST_F(CheckpointFiles, PruningKeepsTheNewestAndDropsLeftoverTempFiles) {
  for (int64_t step : {10, 20, 30, 40}) write(step);
  std::ofstream(dir_ / ".ckpt-00000050.safetensors.tmp") << "half";
  prune_checkpoints(dir_.string(), 2);
  EXPECT_EQ(list_checkpoints(dir_.string()), (std::vector<std::string>{path(40), path(30)}));
  EXPECT_FALSE(fs::exists(dir_ / ".ckpt-00000050.safetensors.tmp"));
  prune_checkpoints(dir_.string(), 0);  // 0 keeps all
  EXPECT_EQ(list_checkpoints(dir_.string()).size(), 2u);
}

// A writer that dies half-way leaves the previous state: the old file under the same name intact,
// no new file under a new name, and the newest valid checkpoint still the previous one.
TEST_F(CheckpointFiles, AnInterruptedWriteLeavesThePreviousCheckpointLoadable) {
  const std::string first = write(10);
  CheckpointData changed = sample_data();
  changed.position.global_step = 20;
  changed.parameters[0].tensor.data()[0] = 99.0f;
  const auto die = [] { throw std::runtime_error("writer killed"); };
  EXPECT_THROW(write_file_durably(first, encode_checkpoint(changed), die), std::runtime_error);
  EXPECT_EQ(read_checkpoint(first).position.global_step, 123);  // the old content, whole
  EXPECT_THROW(write_file_durably(path(20), encode_checkpoint(changed), die), std::runtime_error);
  EXPECT_FALSE(fs::exists(path(20)));

  // A SIGKILLed writer leaves its temp file behind: it is neither listed nor loaded.
  const std::vector<char> bytes = encode_checkpoint(changed);
  write_raw((dir_ / ".ckpt-00000020.safetensors.tmp").string(),
            std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2)));
  int rejected = 0;
  const auto found = newest_valid_checkpoint(
      dir_.string(), [](const Checkpoint&) {}, [&](const std::string&, const std::string&) { ++rejected; });
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->path, first);
  EXPECT_EQ(rejected, 0);
}

TEST_F(CheckpointFiles, AutoFallsBackPastADamagedNewestCheckpoint) {
  const std::string good = write(10);
  std::vector<char> damaged = encoded();
  damaged[damaged.size() - 3] ^= 0x10;
  write_raw(path(20), damaged);
  std::vector<std::pair<std::string, std::string>> reports;
  const auto found = newest_valid_checkpoint(
      dir_.string(), [](const Checkpoint&) {},
      [&](const std::string& p, const std::string& reason) { reports.emplace_back(p, reason); });
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->path, good);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].first, path(20));
  EXPECT_NE(reports[0].second.find("checksum mismatch"), std::string::npos) << reports[0].second;

  // A checkpoint the caller rejects (another model) is passed over the same way.
  int calls = 0;
  const auto none = newest_valid_checkpoint(
      dir_.string(), [&](const Checkpoint& c) { DPTRAIN_FAIL(c.path, ": not for this model"); },
      [&](const std::string&, const std::string&) { ++calls; });
  EXPECT_FALSE(none.has_value());
  EXPECT_EQ(calls, 2);
}

TEST_F(CheckpointFiles, RejectsTruncatedFiles) {
  const std::vector<char> bytes = encoded();
  const auto cut = [&](std::size_t n) {
    return std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
  };
  expect_rejected(cut(0), {"shorter than the 8-byte header length"});
  expect_rejected(cut(5), {"shorter than the 8-byte header length"});
  expect_rejected(cut(8 + header_length(bytes) / 2), {"runs past the end of the file"});
  expect_rejected(cut(bytes.size() - 1), {"out of range"});
}

TEST_F(CheckpointFiles, RejectsAFlippedByteInTheData) {
  for (std::size_t from_end : {1u, 20u, 60u}) {
    std::vector<char> bytes = encoded();
    bytes[bytes.size() - from_end] ^= 0x01;
    expect_rejected(bytes, {"tensor data checksum mismatch", "damaged"});
  }
}

// One byte flipped in each tensor in turn, the first and the last of every list included: the
// checksum covers all of them, whatever the order they are written in.
TEST_F(CheckpointFiles, RejectsAFlippedByteInEveryTensor) {
  const std::vector<char> clean = encoded();
  const uint64_t n = header_length(clean);
  const json header = json::parse(clean.begin() + 8, clean.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  int tensors = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const auto begin = entry["data_offsets"][0].get<std::size_t>(),
               end = entry["data_offsets"][1].get<std::size_t>();
    ASSERT_LT(begin, end) << name;
    for (const std::size_t at : {begin, end - 1}) {
      std::vector<char> bytes = clean;
      bytes[8 + n + at] ^= 0x01;
      SCOPED_TRACE(name + " byte " + std::to_string(at));
      expect_rejected(bytes, {"tensor data checksum mismatch"});
    }
    ++tensors;
  }
  EXPECT_GE(tensors, 3);
}

TEST_F(CheckpointFiles, RejectsAFlippedDigitInThePosition) {
  const std::vector<char> bytes =
      with_header(encoded(), [](json& h) { h["__metadata__"]["global_step"] = "124"; });
  expect_rejected(bytes, {"metadata checksum mismatch"});
}

TEST_F(CheckpointFiles, RejectsAHeaderLengthPastTheEnd) {
  std::vector<char> bytes = encoded();
  const uint64_t too_long = bytes.size();
  std::memcpy(bytes.data(), &too_long, 8);
  expect_rejected(bytes, {"header length", "runs past the end"});
}

TEST_F(CheckpointFiles, RejectsAHeaderThatIsNotJson) {
  std::vector<char> bytes = encoded();
  bytes[8] = '[';
  bytes[9] = '!';
  expect_rejected(bytes, {"header is not valid JSON"});
}

TEST_F(CheckpointFiles, RejectsOffsetsOutOfRangeOrOverlapping) {
  expect_rejected(with_header(encoded(),
                              [](json& h) {
                                h["0.bias"]["data_offsets"] = {24, 1u << 30};
                              }),
                  {"'0.bias'", "out of range"});
  expect_rejected(with_header(encoded(),
                              [](json& h) {
                                // Make 0.bias cover 0.weight's first 12 bytes.
                                h["0.bias"]["data_offsets"] = {0, 12};
                              }),
                  {"overlap"});
}

TEST_F(CheckpointFiles, RejectsAWrongDtype) {
  expect_rejected(with_header(encoded(), [](json& h) { h["0.weight"]["dtype"] = "F64"; }),
                  {"'0.weight'", "dtype F64"});
}

TEST_F(CheckpointFiles, RejectsAnotherFormatVersion) {
  expect_rejected(
      with_header(encoded(), [](json& h) { h["__metadata__"]["dptrain_checkpoint_version"] = "2"; }),
      {"format version 2", "reads version 1"});
  expect_rejected(
      with_header(encoded(), [](json& h) { h["__metadata__"].erase("dptrain_checkpoint_version"); }),
      {"'dptrain_checkpoint_version' is missing"});
}

TEST_F(CheckpointFiles, RestoreRejectsAnotherModelOrOptimizerAndChangesNothing) {
  const CheckpointData data = sample_data();
  const std::vector<char> bytes = encode_checkpoint(data);

  std::vector<NamedTensor> wider = {{"0.weight", Tensor::full({4, 2}, 3.0f)},
                                    {"0.bias", Tensor::full({4}, 3.0f)}};
  expect_rejected(bytes, {"'0.weight'", "shape [3, 2]", "configured model's is [4, 2]"}, &wider);
  for (float v : wider[1].tensor.values()) EXPECT_EQ(v, 3.0f);  // untouched

  const std::vector<NamedTensor> params = blank_like(data.parameters);
  const std::vector<NamedTensor> more_state = {{"0.weight.exp_avg", Tensor::zeros({3, 2})},
                                               {"0.bias.exp_avg", Tensor::zeros({3})},
                                               {"0.weight.exp_avg_sq", Tensor::zeros({3, 2})}};
  expect_rejected(bytes, {"'optimizer.0.weight.exp_avg_sq' is missing"}, &params, &more_state);

  const std::vector<NamedTensor> no_state;
  expect_rejected(bytes, {"'optimizer.0.weight.exp_avg'", "no counterpart", "optimizer"}, &params, &no_state);

  const std::vector<NamedTensor> fewer_params = {{"0.weight", Tensor::zeros({3, 2})}};
  expect_rejected(bytes, {"'0.bias'", "no counterpart", "model"}, &fewer_params);
}

// A file system that refuses the bytes, made real with RLIMIT_FSIZE: write(2) fails with EFBIG
// part-way, as it fails with ENOSPC on a full disk or EDQUOT over a quota (e2e_checkpoint_full_disk
// fills a real 1 MiB tmpfs). SIGXFSZ is ignored meanwhile, so the write returns the error instead.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    previous_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_);
  }

 private:
  rlimit saved_{};
  void (*previous_)(int) = nullptr;
};

TEST_F(CheckpointFiles, AFailedWriteNamesTheFileAndReasonAndLeavesNoTempFile) {
  const std::string first = write(10);
  const std::vector<char> bytes = encode_checkpoint(sample_data());
  try {
    FileSizeLimit limit(bytes.size() / 3);
    write_file_durably(path(20), bytes);
    ADD_FAILURE() << "the write succeeded past the file size limit";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& fragment : {path(20), std::string("failed: File too large (EFBIG)"),
                                        std::string("earlier files are untouched")})
      EXPECT_NE(message.find(fragment), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
  EXPECT_FALSE(fs::exists(path(20)));
  EXPECT_FALSE(fs::exists(dir_ / ".ckpt-00000020.safetensors.tmp")) << "the partial temp file was left";
  EXPECT_EQ(read_checkpoint(first).position.global_step, 123);
  EXPECT_EQ(list_checkpoints(dir_.string()), std::vector<std::string>{first});
}

// A resumed run sets aside the checkpoints past its step: rolled back with --resume PATH, their
// higher steps would outrank its own (pruning keeps the highest; --resume auto takes the highest).
// Renamed, not removed: --resume auto may have passed over them for a setting that can be put back.
TEST_F(CheckpointFiles, AResumedRunSetsAsideTheCheckpointsPastItsStep) {
  const auto data_of_step = [](int64_t step) {
    CheckpointData data = sample_data();
    data.position.global_step = step;
    return data;
  };
  for (int64_t step : {10, 20, 30, 40}) write(step, data_of_step(step));
  const CheckpointConfig config{.dir = dir_.string(), .every_epochs = 0, .every_steps = 10, .keep = 3};
  Checkpoints checkpoints(config, /*rank=*/0, InjectedFault{});
  const std::string line = checkpoints.set_aside_after(20);
  EXPECT_NE(line.find("set aside 2 checkpoint(s) past step 20 in " + dir_.string() + " as set-aside-"),
            std::string::npos)
      << line;
  EXPECT_EQ(list_checkpoints(dir_.string()), (std::vector<std::string>{path(20), path(10)}));
  const std::vector<std::string> aside = list_set_aside(dir_.string());
  ASSERT_EQ(aside.size(), 2u);
  std::vector<int64_t> steps;
  for (const std::string& p : aside) steps.push_back(read_checkpoint(p).position.global_step);
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps, (std::vector<int64_t>{30, 40}));
  EXPECT_EQ(checkpoints.set_aside_after(20), "") << "none past it: nothing to say";
  // Set aside again under the same stamp: refused rather than overwritten.
  write(30, data_of_step(30));
  const std::string stamp = fs::path(aside[0]).filename().string().substr(10, 16);
  EXPECT_THROW(set_checkpoint_aside(path(30), stamp), Error);
  fs::remove(path(30));
  // The resumed run's own checkpoints then survive pruning.
  checkpoints.save(data_of_step(25));
  EXPECT_FALSE(checkpoints.last_write_failed());
  EXPECT_EQ(list_checkpoints(dir_.string()), (std::vector<std::string>{path(25), path(20), path(10)}));
  // A fresh start removes the set-aside ones too, and says so.
  EXPECT_NE(checkpoints.clear_earlier().find("removed 3 checkpoint(s) and 2 set aside"), std::string::npos);
  EXPECT_TRUE(list_set_aside(dir_.string()).empty());
}

// checkpoint.on_error: "stop" throws (the job stops with a failure status), "warn" returns and
// training goes on; either way earlier checkpoints stay and nothing partial is left.
TEST_F(CheckpointFiles, OnErrorStopThrowsAndWarnGoesOn) {
  CheckpointConfig config{.dir = dir_.string(), .every_epochs = 0, .every_steps = 10, .keep = 1};
  Checkpoints stop(config, /*rank=*/0, InjectedFault{});
  CheckpointData data = sample_data();
  // 40 KB of weights: the size limit below then still leaves room for the captured warning.
  data.parameters.push_back({"1.weight", Tensor::zeros({10000})});
  data.position.global_step = 10;
  EXPECT_NE(stop.save(data).find("checkpoint: " + path(10)), std::string::npos);
  data.position.global_step = 20;
  const std::size_t size = encode_checkpoint(data).size();
  {
    FileSizeLimit limit(size / 2);
    try {
      stop.save(data);
      ADD_FAILURE() << "on_error stop did not throw";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("checkpoint of step 20"), std::string::npos) << message;
      EXPECT_NE(message.find(path(20)), std::string::npos) << message;
      EXPECT_NE(message.find("checkpoint.on_error \"warn\""), std::string::npos) << message;
    }
    config.on_error = OnCheckpointError::kWarn;
    Checkpoints warn(config, 0, InjectedFault{});
    data.position.global_step = 30;
    testing::internal::CaptureStderr();
    EXPECT_EQ(warn.save(data), "");
    const std::string warning = testing::internal::GetCapturedStderr();
    EXPECT_NE(warning.find("warning: checkpoint of step 30 not written"), std::string::npos) << warning;
    EXPECT_NE(warning.find("the next checkpoint tries again"), std::string::npos) << warning;
    EXPECT_TRUE(warn.last_write_failed());
    EXPECT_FALSE(warn.due_at_end(30)) << "every rank counts it as written: the same schedule on all";
  }
  // keep 1 pruned nothing on the failures: the step-10 checkpoint is the one left, whole.
  EXPECT_EQ(list_checkpoints(dir_.string()), std::vector<std::string>{path(10)});
  EXPECT_EQ(read_checkpoint(path(10)).position.global_step, 10);
  for (const auto& entry : fs::directory_iterator(dir_))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
}

}  // namespace
}  // namespace dptrain::trainer

// MetricsLog: a fresh run's file starts empty; a resumed run's keeps the lines up to the step it goes
// on from and appends, dropping those past it and any line a kill cut short.
#include "trainer/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dptrain::trainer {
namespace {

namespace fs = std::filesystem;

class MetricsLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dptrain_metrics_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    config_.output_dir = dir_.string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path() const { return (dir_ / "metrics.jsonl").string(); }
  void write_file(const std::string& text) const {
    fs::create_directories(dir_);
    std::ofstream(path(), std::ios::binary) << text;
  }
  std::string file() const {
    std::ifstream in(path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // The "epoch step" pairs of the file's lines, as a reader of the file sees them.
  std::string epochs_and_steps() const {
    std::istringstream lines(file());
    std::string pairs;
    for (std::string line; std::getline(lines, line);) {
      const Json entry = Json::parse(line);
      pairs += std::to_string(entry.at("epoch").get<int64_t>()) + ":" +
               std::to_string(entry.at("step").get<int64_t>()) + " ";
    }
    return pairs;
  }
  static void write_epoch(MetricsLog& log, int64_t epoch, int64_t step) {
    EpochMetrics m;
    m.epoch = epoch;
    m.step = step;
    log.write(m, 2);
  }

  fs::path dir_;
  Config config_;
};

TEST_F(MetricsLogTest, AFreshRunStartsTheFileAnew) {
  write_file("{\"epoch\":1,\"step\":10}\n");
  MetricsLog log(config_, /*writer=*/true, std::nullopt);
  write_epoch(log, 1, 7);
  EXPECT_EQ(epochs_and_steps(), "1:7 ");
}

// Resumed from step 20: epoch 3's line (step 30) comes again, and the torn line goes.
TEST_F(MetricsLogTest, AResumeDropsTheLinesPastItsStepAndTornOnes) {
  write_file(
      "{\"epoch\":1,\"step\":10}\n{\"epoch\":2,\"step\":20,\"stopped_early\":\"max_steps\"}\n"
      "{\"epoch\":3,\"step\":30}\n{\"epoch\":4,\"st");
  MetricsLog log(config_, /*writer=*/true, int64_t{20});
  EXPECT_EQ(epochs_and_steps(), "1:10 2:20 ");
  EXPECT_FALSE(fs::exists(path() + ".tmp." + std::to_string(::getpid()))) << "the rewrite left its temp file";
  write_epoch(log, 2, 25);
  EXPECT_EQ(epochs_and_steps(), "1:10 2:20 2:25 ");
}

// Nothing past the step: the file is left as it is, but for a missing last newline, which the next
// line would otherwise be glued to.
TEST_F(MetricsLogTest, AResumeWithNothingToDropKeepsTheFile) {
  write_file("{\"epoch\":1,\"step\":10}\n{\"epoch\":2,\"step\":20}");
  {
    MetricsLog log(config_, /*writer=*/true, int64_t{20});
    write_epoch(log, 3, 30);
  }
  EXPECT_EQ(epochs_and_steps(), "1:10 2:20 3:30 ");
  // No file yet (the run before wrote no line): the resumed run starts one.
  fs::remove(path());
  MetricsLog log(config_, /*writer=*/true, int64_t{20});
  write_epoch(log, 3, 30);
  EXPECT_EQ(epochs_and_steps(), "3:30 ");
}

// Only rank 0 writes: the other ranks neither read nor touch the file.
TEST_F(MetricsLogTest, OnlyTheWriterTouchesTheFile) {
  write_file("{\"epoch\":1,\"step\":10}\n{\"epoch\":2,\"step\":20}\n");
  MetricsLog log(config_, /*writer=*/false, int64_t{10});
  write_epoch(log, 2, 15);
  EXPECT_EQ(epochs_and_steps(), "1:10 2:20 ");
}

}  // namespace
}  // namespace dptrain::trainer

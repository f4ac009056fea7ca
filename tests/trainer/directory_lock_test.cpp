// One job per run directory: a second lock on a held directory is refused naming the holder; the
// file goes when the holder ends; a file left by a dead holder is taken over, saying so.
#include "trainer/directory_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"

namespace dptrain::trainer {
namespace {

namespace fs = std::filesystem;

class RunLock : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_util::temp_path("lock");
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::function<void(const std::string&)> collect() {
    return [this](const std::string& line) { reports_.push_back(line); };
  }
  std::string dir_;
  std::vector<std::string> reports_;
};

TEST_F(RunLock, ASecondJobIsRefusedNamingTheHolder) {
  std::optional<DirectoryLock> first;
  first.emplace(dir_, "output_dir", collect());
  EXPECT_TRUE(fs::exists(first->path()));
  // flock locks belong to an open file, so a second open in this process contends like a second job.
  try {
    DirectoryLock second(dir_, "output_dir", collect());
    ADD_FAILURE() << "a second lock on a held directory was granted";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& fragment :
         {dir_ + " is in use by another dptrain job", ", pid " + std::to_string(::getpid()) + ", started ",
          std::string("another output_dir")})
      EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
  first.reset();
  EXPECT_FALSE(fs::exists(dir_ + "/.dptrain.lock")) << "the holder's file outlived it";
  DirectoryLock again(dir_, "output_dir", collect());
  EXPECT_TRUE(reports_.empty()) << reports_.front();
}

// The directory cannot be made (a file where a folder should be): the error names the key that named it.
TEST_F(RunLock, ADirectoryThatCannotBeMadeIsNamedWithItsKey) {
  fs::create_directories(dir_);
  std::ofstream(dir_ + "/a_file") << "not a directory";
  try {
    DirectoryLock lock(dir_ + "/a_file/checkpoints", "checkpoint.dir", collect());
    ADD_FAILURE() << "a lock under a regular file was granted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create the run directory " + dir_ +
                                         "/a_file/checkpoints (checkpoint.dir): "),
              std::string::npos)
        << e.what();
  }
}

TEST_F(RunLock, ADeadHoldersFileIsTakenOverSayingWhose) {
  fs::create_directories(dir_);
  std::ofstream(dir_ + "/.dptrain.lock") << "host node7, pid 4242, started 2026-11-24T10:00:00Z\n";
  DirectoryLock lock(dir_, "output_dir", collect());
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("locked by a job that is no longer running (host node7, pid 4242"),
            std::string::npos)
      << reports_[0];
  std::ifstream in(lock.path());
  std::string holder;
  std::getline(in, holder);
  EXPECT_NE(holder.find("pid " + std::to_string(::getpid())), std::string::npos) << holder;
}

}  // namespace
}  // namespace dptrain::trainer

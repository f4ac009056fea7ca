// FileReplacement: a reader of the old file keeps it whole, and a replacement that is not committed
// leaves no trace.
#include "core/file_replacement.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"

namespace dptrain {
namespace {

namespace fs = std::filesystem;

class FileReplacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dptrain_file_replacement_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string contents(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  void write(const std::string& text) {
    FileReplacement file(path().string());
    file.out() << text;
    file.commit();
  }
  fs::path path() const { return dir_ / "train_x.npy"; }
  std::size_t entries() const {
    return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir_), {}));
  }
  fs::path dir_;
};

// A reader that opened the old file (as a training job maps its data) reads it whole after the
// replacement; a rewrite in place would have truncated it under the reader.
TEST_F(FileReplacementTest, AReaderOfTheOldFileKeepsReadingItWhole) {
  write("the old contents, 32 bytes long.");
  const int reader = ::open(path().c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  write("new");
  char old[32];
  EXPECT_EQ(::pread(reader, old, sizeof old, 0), static_cast<ssize_t>(sizeof old));
  EXPECT_EQ(std::string(old, sizeof old), "the old contents, 32 bytes long.");
  ::close(reader);
  EXPECT_EQ(contents(path()), "new");
  EXPECT_EQ(entries(), 1u) << "the temp file was left";
}

TEST_F(FileReplacementTest, UncommittedItLeavesTheOldFileAndNoTempFile) {
  write("kept");
  {
    FileReplacement abandoned(path().string());
    abandoned.out() << "never committed";
  }
  EXPECT_EQ(contents(path()), "kept");
  EXPECT_EQ(entries(), 1u) << "the temp file was left";
}

TEST_F(FileReplacementTest, AMissingDirectoryIsNamed) {
  const std::string missing = (dir_ / "absent" / "train_y.npy").string();
  try {
    FileReplacement file(missing);
    ADD_FAILURE() << "a file in a missing directory was opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing + ": cannot open"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dptrain

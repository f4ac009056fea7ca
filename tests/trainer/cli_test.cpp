// The `trainer` executable's command line: bad input gives a non-zero exit and exactly one line on
// stderr, "dptrain: error ...", naming the problem; --print-config prints the resolved JSON.
// Runs the real binary (path from CMake) from the source directory, capturing stdout and stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `<env> trainer <args>` (shell words; env: VAR=value assignments) in the source directory.
RunResult run_trainer(const std::string& args, const std::string& env = "") {
  const std::filesystem::path dir = dptrain::test_util::make_temp_dir("cli");
  const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
  // In a sanitizer build, LeakSanitizer would report Open MPI's allocations that are still live at
  // exit (none of them ours) and turn the exit status into 1; the child runs without leak detection.
  const std::string command = std::string("cd '") + DPTRAIN_SOURCE_DIR + "' && " + env +
                              " ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" '" +
                              DPTRAIN_TRAINER_PATH + "' " + args + " >'" + out + "' 2>'" + err +
                              "' </dev/null";
  const int status = std::system(command.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove_all(dir);
  return r;
}

// Non-zero exit, exactly one stderr line "dptrain: error ..." containing every fragment.
void expect_one_line_error(const std::string& args, std::initializer_list<std::string> fragments,
                           const std::string& env = "") {
  SCOPED_TRACE(env + " trainer " + args);
  const RunResult r = run_trainer(args, env);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr:\n" << r.err;
  EXPECT_TRUE(!r.err.empty() && r.err.back() == '\n') << "stderr:\n" << r.err;
  EXPECT_EQ(r.err.rfind("dptrain: error", 0), 0u) << "stderr:\n" << r.err;
  for (const std::string& f : fragments)
    EXPECT_NE(r.err.find(f), std::string::npos) << "lacks '" << f << "': " << r.err;
  EXPECT_TRUE(r.out.empty()) << "stdout:\n" << r.out;
}

TEST(TrainerCli, MissingConfigFile) {
  expect_one_line_error("--config configs/no_such_file.json",
                        {"configs/no_such_file.json", "cannot open", "No such file or directory",
                         "relative to the current directory"});
  expect_one_line_error("--config configs", {"configs: is a directory; --config takes a JSON file"});
}

// Command-line mistakes read like every other error, with status 1; under a launcher only rank 0
// speaks (here the launcher's variable says rank 1), and --help too.
TEST(TrainerCli, CommandLineMistakes) {
  expect_one_line_error("--config configs/mnist.json --bogus", {"dptrain: error: ", "--bogus", "see --help"});
  expect_one_line_error("", {"--config is required"});
  expect_one_line_error("--print-config-reference=yaml", {"yaml", "see --help"});
  EXPECT_EQ(run_trainer("--config configs/mnist.json --bogus").exit_code, 1);
  const RunResult other_rank = run_trainer("--config configs/mnist.json --bogus", "OMPI_COMM_WORLD_RANK=1");
  EXPECT_EQ(other_rank.exit_code, 1);
  EXPECT_EQ(other_rank.err, "");
  const RunResult help = run_trainer("--help"), help_elsewhere = run_trainer("--help", "PMIX_RANK=3");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--print-config-reference [=dict]"), std::string::npos) << help.out;
  EXPECT_EQ(help_elsewhere.exit_code, 0);
  EXPECT_EQ(help_elsewhere.out, "");
}

TEST(TrainerCli, VersionNamesTheSourceAndTheBuild) {
  const RunResult r = run_trainer("--version");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("dptrain ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" build, CPU kernels for "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MPI"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST(TrainerCli, ConfigThatIsNotJson) {
  expect_one_line_error("--config tests/trainer/CMakeLists.txt",
                        {"tests/trainer/CMakeLists.txt", "not valid JSON"});
}

TEST(TrainerCli, UnknownKeyFromSet) {
  expect_one_line_error("--config configs/mnist.json --set optimizer.lrr=1",
                        {"optimizer.lrr", "not a known key"});
}

// A layer's key is read as the model is built, after the config: its error names the source too.
TEST(TrainerCli, LayerKeyErrorNamesTheConfig) {
  expect_one_line_error(
      "--config configs/mnist_mlp.json --set 'model.layers=[{\"type\": \"flatten\"}, {\"type\": \"dense\", "
      "\"out_feature\": 10}]'",
      {"configs/mnist_mlp.json --set model.layers=[{\"type\": \"flatten\"}, {\"type\": \"dense\", "
       "\"out_feature\": "
       "10}]: config key model.layers[1].out_features is missing (dense)"});
}

TEST(TrainerCli, WrongTypeFromSet) {
  expect_one_line_error("--config configs/mnist.json --set 'data.batch_size=\"x\"'",
                        {"data.batch_size", "expected an integer"});
}

TEST(TrainerCli, MalformedSet) {
  expect_one_line_error("--config configs/mnist.json --set bad", {"bad --set 'bad'", "key.path=VALUE"});
  expect_one_line_error("--config configs/mnist.json --set 'x={'", {"x={", "not JSON"});
  expect_one_line_error("--config configs/mnist.json --set model.layers[3].out_features=5",
                        {"--set cannot index into a list", "--set 'model.layers=[...]'"});
}

// A config error names the file and the --set assignments that the key came from.
TEST(TrainerCli, OutOfRangeFromSet) {
  expect_one_line_error("--config configs/mnist.json --set training.epochs=2 --set data.batch_size=0",
                        {"configs/mnist.json --set training.epochs=2 --set data.batch_size=0: config key "
                         "data.batch_size",
                         "out of range"});
}

TEST(TrainerCli, OutOfRangeInTheFile) {
  const std::filesystem::path dir = dptrain::test_util::make_temp_dir("cli_config");
  const std::string path = (dir / "bad.json").string();
  nlohmann::json config =
      nlohmann::json::parse(slurp(std::string(DPTRAIN_SOURCE_DIR) + "/configs/mnist.json"));
  config["optimizer"]["lr"] = -1;
  std::ofstream(path) << config.dump();
  expect_one_line_error("--config '" + path + "'", {path + ": config key optimizer.lr = -1", "out of range"});
  std::filesystem::remove_all(dir);
}

TEST(TrainerCli, PrintConfigPrintsResolvedJson) {
  const RunResult r = run_trainer(
      "--config configs/mnist.json --set optimizer.lr=0.5 --set training.epochs=2 --print-config");
  ASSERT_EQ(r.exit_code, 0) << "stderr:\n" << r.err;
  EXPECT_TRUE(r.err.empty()) << "stderr:\n" << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << "stdout is not JSON:\n" << r.out;
  EXPECT_EQ(j["seed"], 42);
  EXPECT_EQ(j["data"]["batch_size"], 128);
  EXPECT_EQ(j["data"]["eval_batch_size"], 1000);  // defaults filled in
  EXPECT_EQ(j["optimizer"]["lr"], 0.5);           // both --set flags applied
  EXPECT_EQ(j["training"]["epochs"], 2);
  EXPECT_EQ(j["model"]["layers"].size(), 10u);
}

}  // namespace

// Bad data files reach the user the same way: one line naming the file and what is wrong. Each case
// is a copy of a tiny valid MNIST-layout directory with one file damaged.
class TrainerCliData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = dptrain::test_util::make_temp_dir("cli_data");
    write_idx("train-images-idx3-ubyte", 0x0803, {4, 28, 28});
    write_idx("train-labels-idx1-ubyte", 0x0801, {4});
    write_idx("t10k-images-idx3-ubyte", 0x0803, {2, 28, 28});
    write_idx("t10k-labels-idx1-ubyte", 0x0801, {2});
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // magic, dims, then prod(dims) zero bytes (labels 0 are valid), minus `short_by` bytes.
  void write_idx(const std::string& name, uint32_t magic, std::vector<uint32_t> dims, int short_by = 0) {
    std::ofstream out(dir_ / name, std::ios::binary | std::ios::trunc);
    auto put = [&](uint32_t v) {
      const char be[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                          static_cast<char>(v)};
      out.write(be, 4);
    };
    put(magic);
    uint64_t n = 1;
    for (uint32_t d : dims) {
      put(d);
      n *= d;
    }
    const std::string payload(n - short_by, '\0');
    out.write(payload.data(), static_cast<std::streamsize>(payload.size()));
  }

  std::string args() const {
    return "--config configs/mnist_mlp.json --set data.dir='\"" + dir_.string() +
           "\"' --set training.max_steps=1 --set output_dir='\"" + (dir_ / "run").string() + "\"'";
  }

  std::filesystem::path dir_;
};

TEST_F(TrainerCliData, ValidTinyDatasetTrains) {
  const RunResult r = run_trainer(args());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(TrainerCliData, TruncatedImages) {
  write_idx("train-images-idx3-ubyte", 0x0803, {4, 28, 28}, 100);
  expect_one_line_error(args(), {"train-images-idx3-ubyte", "truncated"});
}

TEST_F(TrainerCliData, WrongMagic) {
  write_idx("train-labels-idx1-ubyte", 0x0D01, {4});
  expect_one_line_error(args(), {"train-labels-idx1-ubyte", "magic"});
}

TEST_F(TrainerCliData, ImageAndLabelCountsDiffer) {
  write_idx("t10k-labels-idx1-ubyte", 0x0801, {3});
  expect_one_line_error(args(), {"t10k", "3"});
}

// Caught at set-up: the tiny data's labels are all 0, which the loss's own check would let pass.
TEST_F(TrainerCliData, FewerOutputsThanClasses) {
  expect_one_line_error(
      args() +
          " --set 'model.layers=[{\"type\": \"flatten\"}, {\"type\": \"dense\", "
          "\"out_features\": 5}]'",
      {"the model has 5 outputs and data.dataset \"mnist\" has 10 classes", "out_features 10"});
}

// The samples a step with data.drop_last, as the sampler counts them: deterministic mode takes a step's
// backward passes as one batch (2 x 3 > 4 here, where 2 alone is not).
TEST_F(TrainerCliData, DropLastWithAStepLargerThanTheData) {
  expect_one_line_error(args() + " --set data.drop_last=true --set data.batch_size=8",
                        {"data.batch_size 8 x 1 rank(s) = 8 samples a step, more than the 4 training samples",
                         "lower data.batch_size, or set data.drop_last to false"});
  expect_one_line_error(
      args() +
          " --set data.drop_last=true --set data.batch_size=2 --set distributed.deterministic=true "
          "--set distributed.backward_passes_per_step=3 --set distributed.deterministic_micro_batch=2",
      {"data.batch_size 2 x 3 backward passes x 1 rank(s) = 6 samples a step"});
}

TEST_F(TrainerCliData, WrongImageSizeForTheModel) {
  write_idx("train-images-idx3-ubyte", 0x0803, {4, 14, 14});
  write_idx("t10k-images-idx3-ubyte", 0x0803, {2, 14, 14});
  expect_one_line_error(args(), {"model.input_shape", "[1, 14, 14]"});
}

TEST_F(TrainerCliData, MissingFile) {
  std::filesystem::remove(dir_ / "t10k-images-idx3-ubyte");
  expect_one_line_error(args(), {"t10k-images-idx3-ubyte", "setup.sh"});
}

TEST_F(TrainerCliData, ResumeFromAMissingCheckpointFails) {
  const std::string missing = (dir_ / "no_such_ckpt.safetensors").string();
  expect_one_line_error(args() + " --resume '" + missing + "'", {missing, "cannot open checkpoint"});
}

TEST_F(TrainerCliData, ResumeAutoWithoutCheckpointsStartsFresh) {
  const RunResult r = run_trainer(args() + " --resume auto");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("no checkpoint in " + (dir_ / "run" / "checkpoints").string() + "; starting fresh"),
            std::string::npos)
      << r.out;
  // The run then writes its own checkpoint at the end, and a second --resume auto finds it done.
  const RunResult again = run_trainer(args() + " --resume auto");
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("ckpt-00000001.safetensors: step 1"), std::string::npos) << again.out;
  EXPECT_NE(again.out.find("training already complete at step 1"), std::string::npos) << again.out;
}

TEST_F(TrainerCliData, EvaluateAndResumeExcludeEachOther) {
  const RunResult r = run_trainer(args() + " --resume auto --evaluate x.safetensors");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("excludes"), std::string::npos) << r.err;
}

// training.progress: what each mode prints into a file (this test's stdout is one).
TEST_F(TrainerCliData, ProgressModes) {
  const auto run = [&](const std::string& mode) {
    const RunResult r = run_trainer(args() + " --set training.progress=" + mode);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
  };
  const std::string lines = run("lines"), bar = run("bar"), off = run("off"), automatic = run("auto");
  EXPECT_EQ(lines.find('\r'), std::string::npos) << lines;
  EXPECT_NE(lines.find("step 1/1 loss"), std::string::npos) << lines;
  EXPECT_NE(bar.find("\repoch 1/5 [==="), std::string::npos) << bar;
  EXPECT_EQ(off.find('\r'), std::string::npos) << off;
  EXPECT_EQ(off.find("step 1/1"), std::string::npos) << off;
  EXPECT_NE(off.find("epoch 1: train loss"), std::string::npos) << "epoch summaries stay: " << off;
  EXPECT_EQ(automatic.find('\r'), std::string::npos)
      << "auto, writing to a file, prints lines: " << automatic;
  EXPECT_NE(automatic.find("step 1/1 loss"), std::string::npos) << automatic;
}

// device "cuda" where no GPU can be used (no driver here, or a build without the CUDA backend):
// one clear line and a non-zero exit, never a crash.
TEST_F(TrainerCliData, DeviceCudaWithoutAGpuIsOneClearLine) {
  const RunResult probe = run_trainer(args() + " --set device=cuda");
  if (probe.exit_code == 0) GTEST_SKIP() << "a GPU is usable here: the run trained on it";
  expect_one_line_error(args() + " --set device=cuda", {"device \"cuda\"", "set device to \"cpu\""});
}

#if defined(DPTRAIN_WITH_CUDA)
// The CUDA backend is a module the trainer opens only for a GPU run. One that cannot be opened (here
// an empty file, found first through LD_LIBRARY_PATH: the build's rpath is a RUNPATH) is one line for
// device "cuda", and a CPU machine for "auto"; a CPU run never opens it.
TEST_F(TrainerCliData, CudaModuleThatCannotBeOpenedFailsCudaAndLeavesAutoOnTheCpu) {
  const std::filesystem::path broken = dir_ / "broken_module";
  std::filesystem::create_directories(broken);
  std::ofstream(broken / "libdptrain_cuda.so").close();
  const std::string env = "LD_LIBRARY_PATH='" + broken.string() + "'";
  expect_one_line_error(args() + " --set device=cuda",
                        {"cannot load the CUDA backend libdptrain_cuda.so", "set device to \"cpu\""}, env);
  const RunResult on_auto = run_trainer(args() + " --set device=auto", env);
  EXPECT_EQ(on_auto.exit_code, 0) << on_auto.err;
  // glibc's loader names every file it opens: the module is not among them.
  const RunResult on_cpu = run_trainer(args() + " --set device=cpu", env + " LD_DEBUG=files");
  EXPECT_EQ(on_cpu.exit_code, 0) << on_cpu.err;
  EXPECT_NE(on_cpu.err.find("file=libmpi.so"), std::string::npos) << on_cpu.err;
  EXPECT_EQ(on_cpu.err.find("libdptrain_cuda"), std::string::npos) << on_cpu.err;
}
#endif

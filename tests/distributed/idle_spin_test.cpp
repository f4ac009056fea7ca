// IdleSpinners (distributed/idle_spin.h), checked against what the kernel reports of each thread.
#include "distributed/idle_spin.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace dptrain::distributed {
namespace {

// /proc/self/task/TID/stat field 41: the thread's scheduling policy (the fields after the command,
// which is in parentheses and may hold spaces, start at field 3).
int policy_of(const std::filesystem::path& task) {
  std::ifstream file(task / "stat");
  std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int number = 3; number <= 41; ++number) fields >> field;
  return std::stoi(field);
}

// The threads of this process that run under SCHED_IDLE.
std::vector<std::filesystem::path> idle_threads() {
  std::vector<std::filesystem::path> found;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task"))
    if (policy_of(task.path()) == SCHED_IDLE) found.push_back(task.path());
  return found;
}

// The signals a thread blocks, from the SigBlk line of /proc/self/task/TID/status.
unsigned long long blocked_signals(const std::filesystem::path& task) {
  std::ifstream status(task / "status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  return 0;
}

TEST(IdleSpinners, RunUnderSchedIdleBlockingSignalsUntilTheirOwnerEnds) {
  ASSERT_TRUE(idle_threads().empty());
  {
    IdleSpinners spinners(3);
    ASSERT_EQ(spinners.why_not(), "");
    EXPECT_EQ(spinners.running(), 3);
    const std::vector<std::filesystem::path> idle = idle_threads();
    EXPECT_EQ(idle.size(), 3u);
    for (const auto& task : idle)
      for (const int signal : {SIGINT, SIGTERM, SIGUSR1})
        EXPECT_TRUE(blocked_signals(task) >> (signal - 1) & 1) << task << " takes signal " << signal;
    // The thread that started them keeps its own mask.
    EXPECT_FALSE(blocked_signals("/proc/thread-self") >> (SIGINT - 1) & 1);
  }
  EXPECT_TRUE(idle_threads().empty());
}

TEST(IdleSpinners, NoneForNoThreads) {
  IdleSpinners spinners(0);
  EXPECT_EQ(spinners.running(), 0);
  EXPECT_EQ(spinners.cpu_seconds(), 0.0);
  EXPECT_TRUE(idle_threads().empty());
}

// While this thread sleeps the spinners fill the idle CPUs (the test runs alone: RUN_SERIAL), and
// their time is the process's but not the rank's.
TEST(IdleSpinners, FillIdleTimeThatIsNotTheRanks) {
  IdleSpinners spinners(1);
  ASSERT_EQ(spinners.running(), 1);
  const double process_before = rank_cpu_seconds(nullptr), rank_before = rank_cpu_seconds(&spinners);
  const double spinners_before = spinners.cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const double spun = spinners.cpu_seconds() - spinners_before;
  const double process_used = rank_cpu_seconds(nullptr) - process_before;
  const double rank_used = rank_cpu_seconds(&spinners) - rank_before;
  EXPECT_GT(spun, 0.2) << "a spinner should run on an idle CPU for most of 0.4 s";
  EXPECT_GE(process_used, spun * 0.99);
  EXPECT_LT(rank_used, 0.05) << "the rank slept; only the spinner ran";
}

// A cgroup tree in a temporary folder: write(path, text) makes the file and its folders.
class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("dptrain_cgroup_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void write(const std::string& path, const std::string& text) {
    std::filesystem::create_directories((root_ / path).parent_path());
    std::ofstream(root_ / path) << text << "\n";
  }
  std::string ration(const std::string& proc_cgroup) { return cpu_time_ration(proc_cgroup, root_.string()); }
  std::string at(const std::string& path) { return (root_ / path).string(); }
  std::filesystem::path root_;
};

TEST_F(CgroupTree, V2WithoutALimitAnywhere) {
  write("cpu.max", "max 100000");
  write("a/cpu.max", "max 100000");
  write("a/b/cpu.max", "max 100000");
  EXPECT_EQ(ration("0::/a/b\n"), "");
}

TEST_F(CgroupTree, V2LimitOfTheOwnCgroupOrOneAbove) {
  write("a/b/cpu.max", "max 100000");
  write("a/cpu.max", "150000 100000");
  EXPECT_EQ(ration("0::/a/b\n"), at("a/cpu.max") + ": 150000 100000");
  write("a/b/cpu.max", "50000 100000");
  EXPECT_EQ(ration("0::/a/b\n"), at("a/b/cpu.max") + ": 50000 100000");
  // Inside a container (a cgroup namespace) the process's cgroup is "/", the container's own.
  write("cpu.max", "200000 100000");
  EXPECT_EQ(ration("0::/\n"), at("cpu.max") + ": 200000 100000");
}

TEST_F(CgroupTree, V1QuotaOfTheCpuController) {
  // A path that the container cannot see: its own cgroup is the hierarchy's root there.
  const std::string proc = "5:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n3:cpuset:/docker/x\n";
  write("cpu,cpuacct/cpu.cfs_quota_us", "-1");
  EXPECT_EQ(ration(proc), "");
  write("cpu,cpuacct/cpu.cfs_quota_us", "50000");
  EXPECT_EQ(ration(proc), at("cpu,cpuacct/cpu.cfs_quota_us") + ": 50000");
  // Other controllers' files say nothing about CPU time.
  write("cpuset/cpu.cfs_quota_us", "50000");
  EXPECT_EQ(ration("3:cpuset:/\n"), "");
}

TEST_F(CgroupTree, NoCgroupOrMalformedLinesMeanNoRation) {
  EXPECT_EQ(ration(""), "");
  write("cpu.max", "max 100000");
  EXPECT_EQ(ration("garbage\n0::relative/path\n:\n"), "");
}

}  // namespace
}  // namespace dptrain::distributed

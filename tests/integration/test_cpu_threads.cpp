// The CPU backend's thread count through the real executable: `threads = 0` takes
// OMP_NUM_THREADS where it is set (as PyTorch and oneDNN do), else every core the process may run
// on, and an explicit `threads` wins over the variable. The count is what the run's log names.
#include <sched.h>

#include <string>

#include "cli_test_support.h"
#include "scoped_env.h"

namespace {

using namespace mixtrain::test;

class CpuThreads : public CliTest {
 protected:
  // One training step of the quickstart into this test's folder: its log names the backend.
  CliResult one_step(const std::string& extra) {
    return run("train " + quickstart() +
               " --set run.steps=1 --set run.eval_every=0 --set checkpoint.every=0 --run-dir " +
               (dir_ / "run").string() + extra);
  }
};

std::string threads_text(int n) {
  return " (" + std::to_string(n) + (n == 1 ? " thread)" : " threads)");
}

TEST_F(CpuThreads, ZeroTakesOmpNumThreads) {
  // 3: neither ctest's 1 nor a 1- or 2-core machine's count, so only OMP_NUM_THREADS gives it.
  const ScopedEnv env("OMP_NUM_THREADS", "3");
  const auto r = one_step("");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(threads_text(3) + ", folder"), std::string::npos) << r.err;
}

TEST_F(CpuThreads, AnExplicitCountWinsOverOmpNumThreads) {
  const ScopedEnv env("OMP_NUM_THREADS", "1");
  const auto r = one_step(" --set backend.threads=3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(threads_text(3) + ", folder"), std::string::npos) << r.err;
}

TEST_F(CpuThreads, ZeroWithoutOmpNumThreadsTakesEveryCoreThisProcessMayUse) {
  const ScopedEnv env("OMP_NUM_THREADS", nullptr);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  const auto r = one_step("");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(threads_text(CPU_COUNT(&cpus)) + ", folder"), std::string::npos) << r.err;
}

}  // namespace

// `backend.type = "cuda"` where no GPU can be used, through the real executable: exit code 2
// before anything trains, and one error with CUDA's own reason and the fix. CUDA_VISIBLE_DEVICES
// is emptied for the child, so the case is the same on a machine with a GPU. Skipped only when
// the CUDA plugin was not built (no CUDA toolkit).
#include <cstdlib>
#include <optional>
#include <string>

#include "cli_test_support.h"

namespace mixtrain::test {
namespace {

class cli_cuda : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
#ifndef MIXTRAIN_HAVE_CUDA_PLUGIN
    GTEST_SKIP() << "the CUDA backend plugin was not built (no CUDA toolkit)";
#endif
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) saved_ = v;
    ::setenv("CUDA_VISIBLE_DEVICES", "", 1);  // no device visible, GPU or not
  }
  void TearDown() override {
    if (saved_)
      ::setenv("CUDA_VISIBLE_DEVICES", saved_->c_str(), 1);
    else
      ::unsetenv("CUDA_VISIBLE_DEVICES");
    CliTest::TearDown();
  }
  std::optional<std::string> saved_;
};

TEST_F(cli_cuda, TrainOnCudaWithoutAUsableGpuExits2WithCudasReasonAndTheFix) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config("mlp-bf16.toml") +
               " --set backend.type=cuda --set run.steps=2 --run-dir " + run_dir.string());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  // One error: where backend.type was set, what (the backend, CUDA's own error name), then how
  // to fix it.
  EXPECT_NE(r.err.find("error: --set backend.type=cuda: 'backend.type': backend 'cuda'"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("no usable CUDA device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cudaError"), std::string::npos) << r.err;  // NoDevice, InsufficientDriver
  EXPECT_NE(r.err.find("HINT:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--set backend.type=cpu"), std::string::npos) << r.err;
  std::size_t errors = 0;
  for (std::size_t at = r.err.find("error:"); at != std::string::npos;
       at = r.err.find("error:", at + 1))
    ++errors;
  EXPECT_EQ(errors, 1u) << r.err;
  // Nothing trained: no step line, no run folder.
  EXPECT_EQ(r.out.find("done:"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(run_dir)) << "the run stopped before creating its folder";
}

TEST_F(cli_cuda, CheckOnCudaWithoutAUsableGpuExits2Too) {
  auto r = run("check " + config("mlp-fp8.toml") + " --set backend.type=cuda");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("no usable CUDA device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--set backend.type=cpu"), std::string::npos) << r.err;
  // Set in a file, the error names its line.
  write_file("cuda.toml", "[backend]\ntype = \"cuda\"\n");
  r = run("check " + config("mlp-fp8.toml") + " --merge cuda.toml", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("cuda.toml:2:8: 'backend.type': backend 'cuda'"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace mixtrain::test

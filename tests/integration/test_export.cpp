// `mixtrain export` of a run: which checkpoint it reads and where the file goes.
#include "cli_test_support.h"

namespace {

using namespace mixtrain::test;
using CliExport = CliTest;

// A run folder or its checkpoints/ folder means the newest checkpoint, as for `eval
// --checkpoint` and `train --resume`; the export lands in the run folder, not in checkpoints/.
TEST_F(CliExport, TakesARunOrItsCheckpointsFolderAndWritesBesideTheRun) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() +
               " --set run.steps=10 --set run.eval_every=0 --set checkpoint.every=5"
               " --set backend.threads=1 --run-dir " +
               run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto checkpoints = run_dir / "checkpoints";
  ASSERT_TRUE(fs::exists(checkpoints / "step-00000005.mxt"));
  ASSERT_TRUE(fs::exists(checkpoints / "step-00000010.mxt"));

  r = run("export " + checkpoints.string() + " --format safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = run_dir / "step-00000010.safetensors";
  EXPECT_TRUE(fs::exists(out)) << r.out;
  EXPECT_FALSE(fs::exists(checkpoints / "step-00000010.safetensors"));
  EXPECT_NE(r.out.find("step-00000010.mxt"), std::string::npos) << r.out;

  // The same from the run folder: the file exists, so it is refused until --force.
  const auto before = slurp(out);
  r = run("export " + run_dir.string() + " --format safetensors");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("already exists"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(out), before);
  r = run("export " + run_dir.string() + " --format safetensors --force");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(slurp(out), before);  // the same checkpoint, exported again

  // A checkpoint file named directly also exports beside the run.
  r = run("export " + (checkpoints / "step-00000005.mxt").string() + " --format safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(run_dir / "step-00000005.safetensors"));
  EXPECT_NE(slurp(run_dir / "step-00000005.safetensors"), before);

  // eval accepts the run folder too, and the export evaluates like the newest checkpoint.
  const auto config = (run_dir / "config.toml").string();
  auto a = run("eval " + config + " --checkpoint " + run_dir.string());
  auto b = run("eval " + config + " --checkpoint " + out.string());
  auto c = run("eval " + config + " --checkpoint " + (checkpoints / "step-00000010.mxt").string());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(json::parse(a.out), json::parse(c.out));
  EXPECT_EQ(json::parse(b.out)["eval_loss"], json::parse(c.out)["eval_loss"]);
}

TEST_F(CliExport, FolderWithoutCheckpointsExits2) {
  fs::create_directories(dir_ / "empty" / "checkpoints");
  auto r = run("export " + (dir_ / "empty").string() + " --format safetensors");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no checkpoint (step-*.mxt"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find((dir_ / "empty" / "checkpoints").string()), std::string::npos) << r.err;
  r = run("export " + (dir_ / "nowhere").string() + " --format safetensors");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
}

}  // namespace

// prepare_run_folder (core/runs/folder.h): which folder a run writes and what it never touches.
// A checkpoint kept outside a run's checkpoints/ claims no folder; a folder a live run holds is
// never shared; a user's config.toml is never replaced; a second continuation from the same step
// keeps the first one's discarded files; a torn last metrics record goes aside whole; a side file
// that cannot be written leaves the metrics as they were.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "mixtrain/core/runs/folder.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;

constexpr const char* kResolved = "# mixtrain resolved config: every effective value\n[run]\n";

class RunFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("mixtrain-run-folder-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  static void write(const fs::path& file, const std::string& text) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  static std::string read(const fs::path& file) {
    std::ifstream in(file);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  static std::set<std::string> names(const fs::path& folder) {
    std::set<std::string> out;
    for (const auto& f : fs::directory_iterator(folder)) out.insert(f.path().filename().string());
    return out;
  }
  RunFolderRequest request() const {
    RunFolderRequest r;
    r.config_dir = (root_ / "runs" / "demo").string();
    r.run_name = "demo";
    r.checkpoint_extension = ".mxt";
    return r;
  }
  // A finished run at `dir`: metrics up to step 30, checkpoints at 20 and 30.
  static void finished_run(const fs::path& dir) {
    write(dir / "config.toml", kResolved);
    write(dir / "metrics.jsonl", "{\"step\":10}\n{\"step\":20}\n{\"step\":30}\n");
    write(dir / "checkpoints" / "step-00000020.mxt", "twenty");
    write(dir / "checkpoints" / "step-00000030.mxt", "thirty");
  }
  fs::path root_;
};

TEST_F(RunFolder, ACheckpointOutsideARunsCheckpointsFolderClaimsNoFolder) {
  // The user's project: a hand-written config beside a folder of kept checkpoints.
  const std::string mine = "# my experiment, with my comments\n[run]\nsteps = 20\n";
  write(root_ / "proj" / "config.toml", mine);
  write(root_ / "proj" / "ckpts" / "step-00000020.mxt", "weights");
  auto r = request();
  r.resumed_from = root_ / "proj" / "ckpts" / "step-00000020.mxt";
  r.resumed_step = 20;
  const auto prepared = prepare_run_folder(r, kResolved);
  EXPECT_EQ(prepared.dir, root_ / "runs" / "demo");
  EXPECT_EQ(read(root_ / "proj" / "config.toml"), mine);
  EXPECT_EQ(names(root_ / "proj"), (std::set<std::string>{"config.toml", "ckpts"}));
  EXPECT_FALSE(continued_run_folder({}, r.resumed_from).has_value());
}

TEST_F(RunFolder, AFolderALiveRunHoldsIsNeverShared) {
  const auto first = prepare_run_folder(request(), kResolved);
  EXPECT_EQ(first.dir, root_ / "runs" / "demo");
  // Started at the same moment: the first has not written metrics.jsonl yet.
  const auto second = prepare_run_folder(request(), kResolved);
  EXPECT_EQ(second.dir, root_ / "runs" / "demo-2");
  // Named outright, it is refused, naming the holder: "in use", also once it has logged (not
  // "finished", whose --resume hint would only meet the lock).
  write(first.dir / "metrics.jsonl", "{\"step\":1}\n");
  auto named = request();
  named.run_dir = first.dir;
  try {
    prepare_run_folder(named, kResolved);
    ADD_FAILURE() << "a folder another run holds was handed out";
  } catch (const sdk::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("in use by process " + std::to_string(::getpid())),
              std::string::npos)
        << e.what();
  }
}

// Checkpoints alone (metrics deleted, or copied in) are a run's: keep-pruning would count them.
TEST_F(RunFolder, AFolderHoldingOnlyCheckpointsHoldsARun) {
  write(root_ / "P" / "checkpoints" / "step-00000100.mxt", "someone else's");
  auto named = request();
  named.run_dir = root_ / "P";
  EXPECT_THROW(prepare_run_folder(named, kResolved), sdk::UserError);
  auto by_default = request();
  by_default.config_dir = (root_ / "P").string();
  EXPECT_EQ(prepare_run_folder(by_default, kResolved).dir, root_ / "P-2");
  EXPECT_EQ(read(root_ / "P" / "checkpoints" / "step-00000100.mxt"), "someone else's");
}

// The user's project with a checkpoints/ folder of its own: resuming one of them continues
// nothing there, and their config.toml stays theirs.
TEST_F(RunFolder, AUsersConfigBesideItsCheckpointsIsNeverReplacedOnResume) {
  const std::string mine = "[run]\nsteps = 40  # mine\n";
  write(root_ / "proj" / "config.toml", mine);
  write(root_ / "proj" / "checkpoints" / "step-00000020.mxt", "weights");
  auto r = request();
  r.resumed_from = root_ / "proj" / "checkpoints" / "step-00000020.mxt";
  r.resumed_step = 20;
  EXPECT_THROW(prepare_run_folder(r, kResolved), sdk::UserError);
  EXPECT_EQ(read(root_ / "proj" / "config.toml"), mine);
  EXPECT_FALSE(fs::exists(root_ / "proj" / ".mixtrain.lock")) << "refused before touching it";
}

TEST_F(RunFolder, ALockGoesWithItsRun) {
  auto named = request();
  named.run_dir = root_ / "runs" / "mine";
  { const auto run = prepare_run_folder(named, kResolved); }
  // The run ended without writing metrics (it failed early): the folder is free again.
  EXPECT_EQ(prepare_run_folder(named, kResolved).dir, named.run_dir);
}

TEST_F(RunFolder, AUsersConfigTomlIsNeverReplaced) {
  const std::string mine = "[run]\nsteps = 5  # mine\n";
  write(root_ / "proj" / "config.toml", mine);
  auto named = request();
  named.run_dir = root_ / "proj";
  EXPECT_THROW(prepare_run_folder(named, kResolved), sdk::UserError);
  EXPECT_EQ(read(root_ / "proj" / "config.toml"), mine);
  EXPECT_EQ(names(root_ / "proj"), (std::set<std::string>{"config.toml"}));  // nothing created
  // One a run wrote (a run that failed before its first metrics) is the run's to replace.
  write(root_ / "proj" / "config.toml", kResolved);
  EXPECT_EQ(prepare_run_folder(named, kResolved).dir, named.run_dir);
}

TEST_F(RunFolder, ASecondContinuationFromTheSameStepKeepsTheFirstOnesFiles) {
  const fs::path dir = root_ / "runs" / "demo";
  finished_run(dir);
  auto r = request();
  r.resumed_from = dir / "checkpoints" / "step-00000020.mxt";
  r.resumed_step = 20;
  const std::string first_said = prepare_run_folder(r, kResolved).moved_aside;
  EXPECT_NE(first_said.find("checkpoints.discarded-after-step-20/"), std::string::npos);
  EXPECT_EQ(read(dir / "checkpoints.discarded-after-step-20" / "step-00000030.mxt"), "thirty");
  // The first continuation ran on to step 30 again, writing another step-30 checkpoint.
  write(dir / "checkpoints" / "step-00000030.mxt", "thirty again");
  write(dir / "metrics.jsonl", read(dir / "metrics.jsonl") + "{\"step\":30}\n");
  const std::string second_said = prepare_run_folder(r, kResolved).moved_aside;
  EXPECT_NE(second_said.find("checkpoints.discarded-after-step-20.2/"), std::string::npos)
      << second_said;
  EXPECT_EQ(read(dir / "checkpoints.discarded-after-step-20" / "step-00000030.mxt"), "thirty");
  EXPECT_EQ(read(dir / "checkpoints.discarded-after-step-20.2" / "step-00000030.mxt"),
            "thirty again");
  EXPECT_EQ(read(dir / "metrics.discarded-after-step-20.jsonl"), "{\"step\":30}\n");
  EXPECT_EQ(read(dir / "metrics.discarded-after-step-20.2.jsonl"), "{\"step\":30}\n");
  EXPECT_EQ(names(dir / "checkpoints"), (std::set<std::string>{"step-00000020.mxt"}));
}

// The continuation abandoned by a resume with other settings keeps the config.toml it trained
// with beside its records (the resumed run's replaces it); one with the same values (its header's
// source aside) has nothing to keep, and a second continuation's copy never overwrites the first.
TEST_F(RunFolder, AContinuationAbandonedForOtherSettingsKeepsItsConfig) {
  const fs::path dir = root_ / "runs" / "demo";
  finished_run(dir);
  auto r = request();
  r.resumed_from = dir / "checkpoints" / "step-00000020.mxt";
  r.resumed_step = 20;
  const std::string same = "# mixtrain resolved config: every effective value. Source: x\n[run]\n";
  EXPECT_EQ(prepare_run_folder(r, same).moved_aside.find("config.toml"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "config.discarded-after-step-20.toml"));
  write(dir / "checkpoints" / "step-00000030.mxt", "thirty again");
  const std::string other = std::string(kResolved) + "steps = 40\n";
  const std::string said = prepare_run_folder(r, other).moved_aside;
  const fs::path kept = dir / "config.discarded-after-step-20.2.toml";
  EXPECT_NE(said.find("the config.toml it last trained with to " + kept.string()),
            std::string::npos)
      << said;
  EXPECT_EQ(read(kept), same);
  EXPECT_EQ(read(dir / "config.toml"), other);
  write(dir / "checkpoints" / "step-00000030.mxt", "thirty a third time");
  prepare_run_folder(r, kResolved);
  EXPECT_EQ(read(dir / "config.discarded-after-step-20.3.toml"), other);
  EXPECT_EQ(read(kept), same);
}

// Resumed at the last step the files hold, there is nothing to move: the files stay as they were
// (found from their tails: a long run's metrics are not read whole), and nothing is said.
TEST_F(RunFolder, AResumeAtTheLastLoggedStepLeavesTheMetricsAsTheyWere) {
  const fs::path dir = root_ / "runs" / "demo";
  finished_run(dir);
  const std::string csv = "step,loss\n10,1\n20,0.5\n30,0.2\n";
  write(dir / "metrics.csv", csv);
  auto r = request();
  r.resumed_from = dir / "checkpoints" / "step-00000030.mxt";
  r.resumed_step = 30;
  EXPECT_EQ(prepare_run_folder(r, kResolved).moved_aside, "");
  EXPECT_EQ(read(dir / "metrics.jsonl"), "{\"step\":10}\n{\"step\":20}\n{\"step\":30}\n");
  EXPECT_EQ(read(dir / "metrics.csv"), csv);
  EXPECT_FALSE(fs::exists(dir / "metrics.discarded-after-step-30.jsonl"));
}

// A crash or a full disk can leave a metrics file's last record torn: a resume in place moves it
// aside with the abandoned records, so both files end with a whole record again.
TEST_F(RunFolder, ATornLastMetricsRecordGoesAsideOnResume) {
  const fs::path dir = root_ / "runs" / "demo";
  finished_run(dir);
  write(dir / "metrics.jsonl", "{\"step\":10}\n{\"step\":20}\n{\"step\":30}\n{\"st");
  write(dir / "metrics.csv", "step,loss\n10,1\n20,0.5\n30,0.2\n40,0.");
  auto r = request();
  r.resumed_from = dir / "checkpoints" / "step-00000030.mxt";
  r.resumed_step = 30;
  const std::string said = prepare_run_folder(r, kResolved).moved_aside;
  EXPECT_NE(said.find("a torn last metrics record"), std::string::npos) << said;
  EXPECT_EQ(read(dir / "metrics.jsonl"), "{\"step\":10}\n{\"step\":20}\n{\"step\":30}\n");
  EXPECT_EQ(read(dir / "metrics.csv"), "step,loss\n10,1\n20,0.5\n30,0.2\n");
  EXPECT_EQ(read(dir / "metrics.discarded-after-step-30.jsonl"), "{\"st\n");
  EXPECT_EQ(read(dir / "metrics.discarded-after-step-30.csv"), "step,loss\n40,0.\n");
}

// The side files are written before the originals are cut: when one cannot be written (here a
// file-size limit, EFBIG, as a full disk gives ENOSPC), the resume fails, the metrics keep every
// record and no side file is left, so the retry uses the same suffix.
TEST_F(RunFolder, ASideFileThatCannotBeWrittenLeavesTheMetricsWhole) {
  const fs::path dir = root_ / "runs" / "demo";
  finished_run(dir);
  std::string jsonl = "{\"step\":10}\n{\"step\":20}\n", long_record = "{\"step\":30,\"x\":\"";
  long_record += std::string(4096, 'x') + "\"}\n";
  write(dir / "metrics.jsonl", jsonl + long_record);
  const std::string csv = "step,loss\n10,1\n20,0.5\n30,0.2\n";
  write(dir / "metrics.csv", csv);
  auto r = request();
  r.resumed_from = dir / "checkpoints" / "step-00000020.mxt";
  r.resumed_step = 20;
  {
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit was{};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &was), 0);
    rlimit small = was;
    small.rlim_cur = 1024;  // the CSV's side file fits, the JSONL's does not
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    EXPECT_THROW(prepare_run_folder(r, kResolved), sdk::UserError);
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &was), 0);
    std::signal(SIGXFSZ, old_handler);
  }
  EXPECT_EQ(read(dir / "metrics.jsonl"), jsonl + long_record);
  EXPECT_EQ(read(dir / "metrics.csv"), csv);
  EXPECT_FALSE(fs::exists(dir / "metrics.discarded-after-step-20.csv"));
  EXPECT_FALSE(fs::exists(dir / "metrics.discarded-after-step-20.jsonl"));
  // The retry, with room, moves both sides under the first suffix.
  const std::string said = prepare_run_folder(r, kResolved).moved_aside;
  EXPECT_NE(said.find("metrics.discarded-after-step-20.*"), std::string::npos) << said;
  EXPECT_EQ(read(dir / "metrics.discarded-after-step-20.jsonl"), long_record);
  EXPECT_EQ(read(dir / "metrics.discarded-after-step-20.csv"), "step,loss\n30,0.2\n");
  EXPECT_EQ(read(dir / "metrics.jsonl"), jsonl);
}

}  // namespace
}  // namespace mixtrain::core

// Integration: `mixtrain compare` on two real quickstart runs trained by the executable.
#include <map>

#include "cli_test_support.h"

namespace {

using namespace mixtrain::test;
class CompareCli : public CliTest {
 protected:
  // A short quickstart run logged every 5 steps (so the smoothed loss, over 25 steps, has points
  // from step 25 on); `sets` are extra --set overrides.
  fs::path train(const std::string& name, const std::string& sets = "") {
    const auto d = dir_ / name;
    auto r = run("train " + quickstart() + " --set run.steps=40 --set run.log_every=5 " + sets +
                 " --run-dir " + d.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return d;
  }
};

TEST_F(CompareCli, ComparesAnAdamwAndAnSgdRun) {
  const auto a = train("adamw"),
             b = train("sgd", "--set optimizer.type=sgd --set optimizer.lr=0.05");
  ASSERT_FALSE(HasFailure());

  auto r = run("compare " + a.string() + " " + b.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("adamw (fp32/none)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sgd (fp32/none)"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(a / "compare.svg"));
  ASSERT_TRUE(fs::exists(a / "compare.md"));
  ASSERT_TRUE(fs::exists(a / "compare.json"));
  EXPECT_NE(slurp(a / "compare.svg").find("<svg"), std::string::npos);

  auto j = json::parse(slurp(a / "compare.json"));
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["baseline"], "adamw");
  EXPECT_EQ(j["runs"][0]["max_rel_loss_gap"].get<double>(), 0.0);
  EXPECT_EQ(j["runs"][1]["optimizer"], "sgd");
  // Logged every 5 steps, smoothed over 25: steps 25, 30, 35 and 40 have full windows.
  EXPECT_EQ(j["loss_gap"]["window_steps"], 25);
  EXPECT_EQ(j["runs"][1]["common_steps"].get<int>(), 8);
  EXPECT_EQ(j["runs"][1]["smoothed_steps"].get<int>(), 4);
  EXPECT_GT(j["runs"][1]["max_rel_loss_gap"].get<double>(), 0.0);
  EXPECT_NE(r.out.find("max gap, 25-step mean loss"), std::string::npos) << r.out;
  EXPECT_NE(slurp(a / "compare.md").find("max gap, 25-step mean loss"), std::string::npos);
  // Optimizers differ, model and data do not: nothing to warn about.
  EXPECT_EQ(r.out.find("warning"), std::string::npos) << r.out;
  EXPECT_EQ(j["warnings"], json::array());
  EXPECT_EQ(j["runs"][1]["samples_per_s_ratio"].is_number(), true);

  // --out puts the files elsewhere and leaves the run folders alone.
  auto out = dir_ / "report";
  auto r2 = run("compare " + b.string() + " " + a.string() + " --out " + out.string());
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_EQ(json::parse(slurp(out / "compare.json"))["baseline"], "sgd");
  EXPECT_FALSE(fs::exists(b / "compare.json"));
}

// A comparison that cannot be written whole (here past a file-size limit, as a full disk fails
// it) exits 2 and leaves the previous comparison's three files as they were.
TEST_F(CompareCli, AFailedWriteLeavesThePreviousComparisonWhole) {
  const auto a = train("adamw"), b = train("sgd", "--set optimizer.type=sgd");
  ASSERT_FALSE(HasFailure());
  const auto out = dir_ / "report";
  ASSERT_EQ(run("compare " + a.string() + " --out " + out.string()).exit_code, 0);
  std::map<std::string, std::string> before;
  for (const char* f : {"compare.json", "compare.md", "compare.svg"}) before[f] = slurp(out / f);
  const auto err = dir_ / "err.txt";
  const std::string cmd = "bash -c 'ulimit -f 2; exec " + std::string(MIXTRAIN_EXE) +
                          " compare " + a.string() + " " + b.string() + " --out " + out.string() +
                          "' >/dev/null 2>" + err.string() + " </dev/null";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << slurp(err);
  EXPECT_EQ(WEXITSTATUS(status), 2) << slurp(err);
  for (const auto& [name, text] : before) EXPECT_EQ(slurp(out / name), text) << name;
  for (const auto& f : fs::directory_iterator(out))
    EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << f.path();
}

TEST_F(CompareCli, WarnsWhenRunsTrainADifferentModelOrDataButNotForAnotherPrecision) {
  // How batches are prepared (prefetch, pinned memory, the evaluation batch) is not the data.
  const auto base = train("base"),
             bf16 = train("bf16",
                          "--set precision.policy=bf16-mixed --set data.prefetch=false "
                          "--set data.pin_memory=false --set data.eval_batch_size=256"),
             noisy = train("noisy", "--set data.noise=2.0");
  ASSERT_FALSE(HasFailure());
  auto r = run("compare " + base.string() + " " + bf16.string() + " " + noisy.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("warning: noisy trains a different model or data than the baseline"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("noise = 2.0 (baseline 1.0)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("warning: bf16"), std::string::npos) << r.out;
  EXPECT_NE(slurp(base / "compare.md").find("> **Warning:** noisy trains"), std::string::npos);
  auto j = json::parse(slurp(base / "compare.json"));
  ASSERT_EQ(j["warnings"].size(), 1u) << j["warnings"];
  EXPECT_EQ(j["runs"][1]["setup_differences"], json::array());
  ASSERT_EQ(j["runs"][2]["setup_differences"].size(), 1u) << j["runs"][2]["setup_differences"];
  EXPECT_NE(j["runs"][2]["setup_differences"][0]["key"].get<std::string>().find("noise"),
            std::string::npos);

  // The chart gains the eval-accuracy and difference-from-baseline panels, one curve per run.
  const auto svg = slurp(base / "compare.svg");
  for (const char* cls :
       {R"(class="diff-curve")", R"(class="eval-curve")", R"(class="eval-curve-dots")"}) {
    std::size_t n = 0;
    for (auto p = svg.find(cls); p != std::string::npos; p = svg.find(cls, p + 1)) ++n;
    EXPECT_EQ(n, 3u) << cls;
  }
}

TEST_F(CompareCli, WarnsWhenRunsRanDifferentNumbersOfSteps) {
  const auto base = train("base"), longer = train("longer", "--set run.steps=60");
  ASSERT_FALSE(HasFailure());
  auto r = run("compare " + base.string() + " " + longer.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("warning: longer ran 60 steps, the baseline 40"), std::string::npos)
      << r.out;
  const auto j = json::parse(slurp(base / "compare.json"));
  ASSERT_EQ(j["warnings"].size(), 1u) << j["warnings"];
}

TEST_F(CompareCli, AutoShowsItsChoiceAndEmulatedThroughputIsMarked) {
  // bf16_gemm = emulated makes the CPU's bf16 emulated on every machine.
  const auto base = train("fp32", "--set backend.bf16_gemm=emulated"),
             emul = train("emul",
                          "--set backend.bf16_gemm=emulated --set precision.policy=bf16-mixed"),
             chosen =
                 train("chosen", "--set backend.bf16_gemm=emulated --set precision.policy=auto");
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(summary(emul)["precision"]["gemm_inputs"]["bf16"]["native"], false);
  EXPECT_EQ(summary(base)["precision"]["gemm_inputs"]["fp32"]["native"], true);
  const auto resolved = summary(chosen)["precision"]["policy"].get<std::string>();
  EXPECT_NE(resolved, "auto");
  EXPECT_EQ(summary(chosen)["policy"], "auto");

  auto r = run("compare " + base.string() + " " + emul.string() + " " + chosen.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("chosen (auto\u2192" + resolved + "/none)"), std::string::npos) << r.out;
  auto j = json::parse(slurp(base / "compare.json"));
  EXPECT_EQ(j["runs"][2]["resolved_policy"], resolved);
  EXPECT_FALSE(j["runs"][0]["samples_per_s_emulated"].get<bool>());
  EXPECT_TRUE(j["runs"][1]["samples_per_s_emulated"].get<bool>());
  EXPECT_NE(r.out.find("x) emulated"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("emul: bf16 GEMMs emulated"), std::string::npos) << r.out;
  EXPECT_NE(slurp(base / "compare.md").find("emul: bf16 GEMMs emulated"), std::string::npos);
}

// A resume that switches the policy (--set precision.policy) leaves a run trained under two: its
// summary names both with the step each began at, a later resume of it keeps them, and compare
// labels it by the chain, not by the policy it ended with. A resume without a switch adds none.
TEST_F(CompareCli, ARunWhosePolicyAResumeSwitchedIsLabelledByBoth) {
  const auto base = train("base", "--set checkpoint.every=20 --set checkpoint.keep=5");
  ASSERT_FALSE(HasFailure());
  const auto switched = dir_ / "switched", later = dir_ / "later", plain = dir_ / "plain";
  auto r = run("train " + quickstart() +
               " --set run.steps=40 --set run.log_every=5 --set checkpoint.every=30 "
               "--set precision.policy=fp16-mixed --resume " +
               (base / "checkpoints" / "step-00000020.mxt").string() + " --run-dir " +
               switched.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json segments = summary(switched)["segments"];
  ASSERT_EQ(segments.size(), 2u) << summary(switched).dump();
  EXPECT_EQ(segments[0]["first_step"], 1);
  EXPECT_EQ(segments[0]["policy"], "fp32");
  EXPECT_EQ(segments[1]["first_step"], 21);
  EXPECT_EQ(segments[1]["policy"], "fp16-mixed");
  EXPECT_EQ(segments[1]["scaler"], "none");
  // The switched run's own checkpoint carries both.
  r = run("train " + quickstart() +
          " --set run.steps=40 --set run.log_every=5 --set precision.policy=fp16-mixed --resume " +
          (switched / "checkpoints" / "step-00000030.mxt").string() + " --run-dir " +
          later.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(summary(later)["segments"], segments);
  r = run("train " + quickstart() + " --set run.steps=40 --set run.log_every=5 --resume " +
          (base / "checkpoints" / "step-00000020.mxt").string() + " --run-dir " + plain.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(summary(plain).contains("segments")) << summary(plain).dump();

  r = run("compare " + base.string() + " " + switched.string() + " " + plain.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("switched (fp32\u2192fp16-mixed@21/none)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("plain (fp32/none)"), std::string::npos) << r.out;
  const auto j = json::parse(slurp(base / "compare.json"));
  EXPECT_EQ(j["runs"][1]["segments"], segments);
  EXPECT_TRUE(j["runs"][2]["segments"].is_null());
}

// A run folder's name may hold any bytes: one that is not UTF-8 (and holds Markdown's
// syntax) trains, writes its summary and compares; every output is valid UTF-8, the Markdown
// shows the brackets as text.
TEST_F(CompareCli, AFolderNameThatIsNotUtf8OrHoldsMarkdownIsWrittenSafely) {
  const auto a = train("a"), b = train("b\xff[x]~~y~~");
  ASSERT_FALSE(HasFailure());
  json parsed;
  EXPECT_NO_THROW(parsed = json::parse(slurp(b / "summary.json")));
  auto r = run("compare '" + a.string() + "' '" + b.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NO_THROW(parsed = json::parse(slurp(a / "compare.json")));
  for (const char* file : {"compare.svg", "compare.md"})
    EXPECT_NO_THROW((void)json(slurp(a / file)).dump()) << file << " is not valid UTF-8";
  const std::string md = slurp(a / "compare.md");
  EXPECT_EQ(md.find("[x]"), std::string::npos) << md;
  EXPECT_EQ(md.find("~~y~~"), std::string::npos) << md;
  EXPECT_NE(md.find("\\[x\\]\\~\\~y"), std::string::npos) << md;
}

TEST_F(CompareCli, AMissingFolderExitsTwoNamingIt) {
  auto r = run("compare " + (dir_ / "no-such-run").string());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("no-such-run"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HINT"), std::string::npos) << r.err;
}

// --out in a folder that does not exist exits 2 with a hint and makes no folder, as predict's and
// export's --out do.
TEST_F(CompareCli, AnOutInAMissingFolderExitsTwoAndCreatesNothing) {
  const auto a = train("adamw");
  ASSERT_FALSE(HasFailure());
  const auto out = dir_ / "missing" / "report";
  auto r = run("compare " + a.string() + " --out " + out.string());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find((dir_ / "missing").string() + ", does not exist"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("HINT: create it first"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "missing"));
  EXPECT_FALSE(fs::exists(a / "compare.json"));
}

TEST_F(CompareCli, NoFolderAtAllIsAUsageError) {
  auto r = run("compare");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("run_dirs is required"), std::string::npos) << r.err;
}

}  // namespace

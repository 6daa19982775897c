// Integration: precision policies and loss scaling through the real executable — the FP16
// underflow demo and its cures, overflow back-off with untouched master weights, BF16 parity,
// per-layer overrides, and the warnings of `mixtrain check`.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli_test_support.h"

namespace {

using namespace mixtrain::test;
using Precision = CliTest;

// The "Try" lines of the demo's own header comment, exactly as written: "mixtrain ..." after
// "# Try" up to the first comment line that is not one.
std::vector<std::string> demo_lines(const std::string& config_text) {
  std::vector<std::string> lines;
  std::istringstream in(config_text);
  bool in_try = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# Try", 0) == 0) in_try = true;
    if (!in_try) continue;
    const auto at = line.find("mixtrain ");
    if (line.rfind("#", 0) != 0 || (at == std::string::npos && !lines.empty())) break;
    if (at != std::string::npos) lines.push_back(line.substr(at + 9));
  }
  return lines;
}

// One test drives all four runs so the FP32 baseline is trained once, by the commands the
// config tells a user to type, from a folder that has the repository's configs/.
TEST_F(Precision, UnderflowDemoFailsInFp16AndIsRescuedByTheDynamicScalerAndByBf16) {
  const auto lines = demo_lines(slurp(config("underflow-demo.toml")));
  ASSERT_EQ(lines.size(), 5u) << "four runs and a compare";
  fs::create_directory_symlink(fs::path(MIXTRAIN_CONFIGS_DIR), dir_ / "configs");
  for (const auto& line : lines) {
    auto r = run(line, dir_);
    ASSERT_EQ(r.exit_code, 0) << "mixtrain " << line << "\n" << r.err;
  }
  const auto runs = dir_ / "runs";
  auto fp32 = summary(runs / "underflow-demo");
  auto fp16_none_dir = runs / "underflow-demo-2";
  auto fp16_none = summary(fp16_none_dir);
  auto fp16_dyn = summary(runs / "underflow-demo-3");
  auto bf16 = summary(runs / "underflow-demo-4");
  EXPECT_EQ(fp16_none["policy"], "fp16-mixed");
  EXPECT_EQ(fp16_dyn["scaler"], "dynamic");
  EXPECT_EQ(bf16["policy"], "bf16-mixed");
  EXPECT_TRUE(fs::exists(runs / "underflow-demo" / "compare.svg"));

  // What the demo shows is learning against none (chance is 1/8), not how close the cures come
  // to FP32: 20 narrow layers amplify a last-bit change in any kernel (the loss's exponentials,
  // a GEMM's blocking on another ISA) into a different run, which ends near 0.95 held-out accuracy
  // or on a plateau near 0.84. Measured over seeds 1-8 with AVX-512 and AVX2 kernels, 400 and 800
  // steps: seed 1's FP32 baseline gave 0.844 with this CPU's kernels and 0.956 with AVX2's, and
  // seed 2's bf16 0.90 against its FP32's 0.95 (bench/RESULTS.md, session 66). So each run that
  // should learn must pass 0.6.
  const double base = fp32["eval_accuracy"].get<double>();
  EXPECT_GT(base, 0.6) << "the FP32 baseline must learn for the demo to mean anything";
  // FP16 without a scaler: the gradients of the early layers flush to zero and it stays at chance
  // (8 classes).
  EXPECT_LT(fp16_none["eval_accuracy"].get<double>(), 0.3);
  EXPECT_GT(fp16_none["final_loss"].get<double>(), 1.5);
  // The cures learn, far from the unscaled run's chance.
  EXPECT_GT(fp16_dyn["eval_accuracy"].get<double>(), 0.6);
  EXPECT_GT(fp16_dyn["final_loss_scale"].get<double>(), 65536.0) << "the scale grew";
  EXPECT_GT(bf16["eval_accuracy"].get<double>(), 0.6);
  EXPECT_EQ(bf16["final_loss_scale"].get<double>(), 1.0);

  // The underflow is measured and reported: at scale 1 most input gradients of some early layer
  // flush to zero in fp16.
  double worst = 0.0;
  for (const auto& j : records(fp16_none_dir / "metrics.jsonl"))
    if (j.contains("underflow"))
      for (const auto& [tensor, v] : j["underflow"].items()) {
        EXPECT_EQ(v["dtype"], "fp16") << tensor;
        worst = std::max(worst, v["flushed_share"].get<double>());
      }
  EXPECT_GT(worst, 0.5);
}

// The overflow demo's "Try" lines, as written: FP32, naive fp16-mixed (every step overflows in the
// input projection's forward: the run diverges, exit 3), `calibrate`, the calibrated block merged,
// naive plus escalation, and the compare. The issue's bar: the calibrated run's held-out loss is
// within 1% of FP32's with at most 1% of its steps skipped, where the naive run's is not.
TEST_F(Precision, OverflowDemoIsFixedByCalibrationAndByEscalation) {
  const auto lines = demo_lines(slurp(config("overflow-demo.toml")));
  ASSERT_EQ(lines.size(), 6u) << "four runs, a calibration and a compare";
  fs::create_directory_symlink(fs::path(MIXTRAIN_CONFIGS_DIR), dir_ / "configs");
  for (const auto& line : lines) {
    auto r = run(line, dir_);
    const bool naive =
        line.find("fp16-mixed") != std::string::npos && line.find("--merge") == std::string::npos &&
        line.find("escalate") == std::string::npos && line.rfind("calibrate", 0) != 0;
    ASSERT_EQ(r.exit_code, naive ? 3 : 0) << "mixtrain " << line << "\n" << r.err;
  }
  const auto runs = dir_ / "runs";
  const auto fp32 = summary(runs / "overflow-demo"), naive = summary(runs / "overflow-demo-2"),
             calibrated = summary(runs / "overflow-demo-3"),
             escalated = summary(runs / "overflow-demo-4");
  const double steps = fp32["steps"].get<double>();
  const double base = fp32["eval_loss"].get<double>();
  auto gap = [&](const nlohmann::json& s) {
    return std::abs(s["eval_loss"].get<double>() - base) / base;
  };
  EXPECT_TRUE(naive["diverged"].get<bool>());
  EXPECT_EQ(naive["skipped_steps"].get<double>(), steps);
  EXPECT_LE(calibrated["skipped_steps"].get<double>(), 0.01 * steps);
  EXPECT_LE(gap(calibrated), 0.01) << calibrated.dump();
  EXPECT_LE(escalated["skipped_steps"].get<double>(), 3.0);
  // Three steps fewer of training and a smaller loss scale after the skips: close, not equal
  // (0.9% on the machine the demo was tuned on; CPUs differ in their kernels).
  EXPECT_LE(gap(escalated), 0.02) << escalated.dump();

  // The calibration pinned the projection, not the whole network.
  const auto block = slurp(dir_ / "calibrated.toml");
  EXPECT_NE(block.find("layers = \"proj\""), std::string::npos) << block;
  EXPECT_EQ(block.find("layers = \"head\""), std::string::npos) << block;
  // compare.md lists the promotion of the escalated run.
  EXPECT_NE(slurp(runs / "overflow-demo" / "compare.md").find("proj fp16 -&gt; fp32 at step 3"),
            std::string::npos);
}

TEST_F(Precision, OverflowBacksOffSkipsAndLeavesMasterWeightsUntouched) {
  // A loss scale of 2^100 overflows fp16 activation gradients on every step.
  const std::string common =
      " --set precision.policy=fp16-mixed --set scaler.type=dynamic"
      " --set run.log_every=1 --set run.eval_every=0";
  auto skipped = dir_ / "skipped";
  auto r = run("train " + quickstart() + common +
               " --set scaler.init_scale=1.2676506002282294e30"
               " --set run.steps=3 --run-dir " +
               skipped.string());
  ASSERT_EQ(r.exit_code, 3) << "every step skipped: the run diverged\n" << r.err;
  EXPECT_NE(r.err.find("skipped"), std::string::npos) << r.err;
  // It had a dynamic scaler: the hint does not offer one.
  EXPECT_EQ(r.err.find("use a dynamic loss scaler"), std::string::npos) << r.err;
  auto recs = records(skipped / "metrics.jsonl");
  int skips = 0;
  for (const auto& j : recs) {
    if (!j.contains("loss")) continue;
    EXPECT_TRUE(j["skipped"].get<bool>()) << j.dump();
    EXPECT_DOUBLE_EQ(j["next_loss_scale"].get<double>(), j["loss_scale"].get<double>() / 2);
    EXPECT_FALSE(j["nonfinite"].get<std::string>().empty()) << "blame names a tensor";
    EXPECT_NE(j["nonfinite"].get<std::string>().find("backward"), std::string::npos) << j.dump();
    ++skips;
  }
  EXPECT_EQ(skips, 3);
  // Master weights are those of initialisation: the same eval loss as a run whose only step
  // changes nothing (lr = 0, no weight decay).
  auto untouched = dir_ / "untouched";
  auto r2 = run("train " + quickstart() + common +
                " --set run.steps=1 --set optimizer.lr=0"
                " --set optimizer.weight_decay=0 --run-dir " +
                untouched.string());
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_EQ(summary(skipped)["eval_loss"].get<double>(),
            summary(untouched)["eval_loss"].get<double>());

  // And a run that starts that high recovers: it backs off until the scale fits, then learns.
  auto recovers = dir_ / "recovers";
  auto r3 = run("train " + quickstart() + common +
                " --set scaler.init_scale=1e12"
                " --set run.steps=200 --set run.log_every=10 --run-dir " +
                recovers.string());
  ASSERT_EQ(r3.exit_code, 0) << r3.err;
  auto s = summary(recovers);
  EXPECT_GT(s["skipped_steps"].get<int>(), 0);
  EXPECT_LT(s["final_loss_scale"].get<double>(), 1e12);
  EXPECT_GT(s["eval_accuracy"].get<double>(), 0.9);
}

TEST_F(Precision, Bf16MixedMatchesFp32OnQuickstart) {
  auto a = dir_ / "fp32", b = dir_ / "bf16";
  ASSERT_EQ(run("train " + quickstart() + " --run-dir " + a.string()).exit_code, 0);
  auto r =
      run("train " + quickstart() + " --set precision.policy=bf16-mixed --run-dir " + b.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NEAR(summary(b)["eval_accuracy"].get<double>(), summary(a)["eval_accuracy"].get<double>(),
              0.01);
  EXPECT_EQ(summary(b)["policy"], "bf16-mixed");
}

TEST_F(Precision, OverridesReachTheLayerTheyNameAndUnknownOnesFail) {
  auto cfg = slurp(quickstart());
  cfg.replace(cfg.find("policy = \"fp32\""), 15, "policy = \"bf16-mixed\"");
  auto with_override = write_file(
      "override.toml", cfg + "\n[[precision.override]]\nlayers = \"head\"\ncompute = \"fp32\"\n");
  auto r = run("check " + with_override.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, std::string> plan;
  std::istringstream lines(r.out);
  // The model summary's rows: "#   <node> <op> <shapes...> <params> <flops> w/g/a/ag".
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string hash, layer, word, last;
    if (!(words >> hash >> layer) || hash != "#") continue;
    while (words >> word) last = word;
    if (std::count(last.begin(), last.end(), '/') != 3) continue;
    std::replace(last.begin(), last.end(), '/', ' ');
    plan[layer] = last;
  }
  EXPECT_EQ(plan["head"], "fp32 fp32 fp32 fp32") << r.out;
  EXPECT_EQ(plan["fc1"], "bf16 bf16 bf16 bf16") << r.out;

  auto bad =
      write_file("bad-override.toml",
                 cfg + "\n[[precision.override]]\nlayers = \"classifier\"\ncompute = \"fp32\"\n");
  auto r2 = run("check " + bad.string());
  EXPECT_EQ(r2.exit_code, 2);
  EXPECT_NE(r2.err.find("'classifier' matches no layer"), std::string::npos) << r2.err;
  EXPECT_NE(r2.err.find("fc1, relu1, fc2, relu2, head"), std::string::npos) << r2.err;
  EXPECT_NE(r2.err.find("bad-override.toml:"), std::string::npos) << r2.err;
}

TEST_F(Precision, CheckWarnsAboutFp16WithoutAScalerAndOddGemmSizes) {
  auto r = run("check " + quickstart() + " --set precision.policy=fp16-mixed");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("scaler.type = \"dynamic\""), std::string::npos) << r.err;
  // head has 10 outputs, not a multiple of 8: on the CPU, whose GEMMs run any size at one rate,
  // a note about a CUDA run rather than a warning.
  EXPECT_NE(r.out.find("# on a CUDA backend (the cpu backend runs GEMMs of any size at one rate, "
                       "so nothing to do here): layer 'head' (linear): GEMM dimension 10 is not a "
                       "multiple of 8"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.err.find("not a multiple of 8"), std::string::npos) << r.err;
  // Nothing else to warn about: the shipped bf16 config checks without warnings.
  auto bf16 = run("check " + config("mlp-bf16.toml") + " --skip-rehearsal");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_NE(bf16.out.find("GEMM dimension 10 is not a multiple of 8"), std::string::npos)
      << bf16.out;
  EXPECT_NE(bf16.out.find("# config OK\n"), std::string::npos) << bf16.out;
  EXPECT_EQ(bf16.err.find("warning"), std::string::npos) << bf16.err;
  auto ok =
      run("check " + quickstart() + " --set precision.policy=fp16-mixed --set scaler.type=dynamic");
  EXPECT_EQ(ok.err.find("scaler.type = \"dynamic\""), std::string::npos) << ok.err;
  // FP32 GEMMs do not use Tensor Cores' 16-bit paths: no size warning.
  auto fp32 = run("check " + quickstart());
  EXPECT_EQ(fp32.err.find("not a multiple of 8"), std::string::npos) << fp32.err;
}

// `auto` chooses its plan from the backend's capabilities, so a resume elsewhere (here: the same
// CPU with its bf16 GEMMs forced to emulation, where auto chooses fp32) would train the rest of
// the run under another plan without a word. Refused, naming both choices; the hint's way that
// continues as trained repeats the run bit for bit, with nothing said of a switch.
TEST_F(Precision, AutoChoosingAnotherPolicyOnResumeIsRefusedWithBothWaysOn) {
  const std::string common =
      " --set precision.policy=auto --set run.steps=12 --set run.log_every=1"
      " --set run.eval_every=0 --set checkpoint.every=6 --set checkpoint.keep=5";
  const auto full = dir_ / "full", resumed = dir_ / "resumed", refused = dir_ / "refused";
  auto r = run("train " + quickstart() + common + " --set backend.cpu.bf16_gemm=onednn --run-dir " +
               full.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  if (r.err.find("auto policy chose bf16-mixed") == std::string::npos)
    GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU, so auto chose the same either way";
  const std::string checkpoint = (full / "checkpoints" / "step-00000006.mxt").string();
  r = run("train " + quickstart() + common + " --set backend.cpu.bf16_gemm=emulated --resume " +
          checkpoint + " --run-dir " + refused.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("precision policy 'auto' chose 'bf16-mixed' for the run, and on this "
                       "backend (cpu) it chooses 'fp32'"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--set precision.policy=bf16-mixed; or switch deliberately: --set "
                       "precision.policy=fp32"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(refused / "metrics.jsonl"));
  // The hint's first way, on the run's own backend path: the losses of the uninterrupted run.
  r = run("train " + quickstart() + common +
          " --set backend.cpu.bf16_gemm=onednn --set precision.policy=bf16-mixed --resume " +
          checkpoint + " --run-dir " + resumed.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("which chose 'bf16-mixed': the run continues under it"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("starts from its initial state"), std::string::npos) << r.err;
  std::map<int, double> want;
  for (const auto& j : records(full / "metrics.jsonl"))
    if (j.contains("loss") && !j.contains("eval_loss"))
      want[j["step"].get<int>()] = j["loss"].get<double>();
  int compared = 0;
  for (const auto& j : records(resumed / "metrics.jsonl"))
    if (j.contains("loss") && !j.contains("eval_loss")) {
      EXPECT_EQ(j["loss"].get<double>(), want.at(j["step"].get<int>())) << "step " << j["step"];
      ++compared;
    }
  EXPECT_EQ(compared, 6);
}

TEST_F(Precision, UnknownPolicyListsThePolicies) {
  auto r = run("check " + quickstart() + " --set precision.policy=bf16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no policy named 'bf16'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bf16-mixed"), std::string::npos) << r.err;
}

}  // namespace

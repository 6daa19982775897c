// Integration: precision policies and loss scaling through the real executable — the FP16
// underflow demo and its cures, overflow back-off with untouched master weights, BF16 parity,
// per-layer overrides, and the warnings of `mixtrain check`.
#include <algorithm>
#include <map>

#include "cli_test_support.h"

namespace {

using namespace mixtrain::test;
using Precision = CliTest;

// One test drives all four runs so the FP32 baseline is trained once.
TEST_F(Precision, UnderflowDemoFailsInFp16AndIsRescuedByTheDynamicScalerAndByBf16) {
  const std::string demo = config("underflow-demo.toml");
  auto train = [&](const std::string& name, const std::string& sets) {
    auto d = dir_ / name;
    auto r = run("train " + demo + " --run-dir " + d.string() + " " + sets);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
    return d;
  };
  auto fp32 = summary(train("fp32", ""));
  auto fp16_none_dir = train("fp16-none", "--set precision.policy=fp16-mixed");
  auto fp16_none = summary(fp16_none_dir);
  auto fp16_dyn = summary(train("fp16-dynamic", "--set precision.policy=fp16-mixed "
                                                "--set scaler.type=dynamic "
                                                "--set scaler.growth_interval=20"));
  auto bf16 = summary(train("bf16-none", "--set precision.policy=bf16-mixed"));

  const double base = fp32["eval_accuracy"].get<double>();
  EXPECT_GT(base, 0.85) << "the FP32 baseline must learn for the demo to mean anything";
  // FP16 without a scaler: the gradients of the early layers flush to zero and it stays at chance
  // (8 classes).
  EXPECT_LT(fp16_none["eval_accuracy"].get<double>(), 0.3);
  EXPECT_GT(fp16_none["final_loss"].get<double>(), 1.5);
  // The cures.
  EXPECT_GT(fp16_dyn["eval_accuracy"].get<double>(), base - 0.05);
  EXPECT_GT(fp16_dyn["final_loss_scale"].get<double>(), 65536.0) << "the scale grew";
  EXPECT_GT(bf16["eval_accuracy"].get<double>(), base - 0.03);
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

TEST_F(Precision, OverflowBacksOffSkipsAndLeavesMasterWeightsUntouched) {
  // A loss scale of 2^100 overflows fp16 activation gradients on every step.
  const std::string common = " --set precision.policy=fp16-mixed --set scaler.type=dynamic"
                             " --set run.log_every=1 --set run.eval_every=0";
  auto skipped = dir_ / "skipped";
  auto r = run("train " + quickstart() + common + " --set scaler.init_scale=1.2676506002282294e30"
               " --set run.steps=3 --run-dir " + skipped.string());
  ASSERT_EQ(r.exit_code, 3) << "every step skipped: the run diverged\n" << r.err;
  EXPECT_NE(r.err.find("skipped"), std::string::npos) << r.err;
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
  auto r2 = run("train " + quickstart() + common + " --set run.steps=1 --set optimizer.lr=0"
                " --set optimizer.weight_decay=0 --run-dir " + untouched.string());
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_EQ(summary(skipped)["eval_loss"].get<double>(), summary(untouched)["eval_loss"].get<double>());

  // And a run that starts that high recovers: it backs off until the scale fits, then learns.
  auto recovers = dir_ / "recovers";
  auto r3 = run("train " + quickstart() + common + " --set scaler.init_scale=1e12"
                " --set run.steps=200 --set run.log_every=10 --run-dir " + recovers.string());
  ASSERT_EQ(r3.exit_code, 0) << r3.err;
  auto s = summary(recovers);
  EXPECT_GT(s["skipped_steps"].get<int>(), 0);
  EXPECT_LT(s["final_loss_scale"].get<double>(), 1e12);
  EXPECT_GT(s["eval_accuracy"].get<double>(), 0.9);
}

TEST_F(Precision, Bf16MixedMatchesFp32OnQuickstart) {
  auto a = dir_ / "fp32", b = dir_ / "bf16";
  ASSERT_EQ(run("train " + quickstart() + " --run-dir " + a.string()).exit_code, 0);
  auto r = run("train " + quickstart() + " --set precision.policy=bf16-mixed --run-dir " + b.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NEAR(summary(b)["eval_accuracy"].get<double>(), summary(a)["eval_accuracy"].get<double>(), 0.01);
  EXPECT_EQ(summary(b)["policy"], "bf16-mixed");
}

TEST_F(Precision, OverridesReachTheLayerTheyNameAndUnknownOnesFail) {
  auto cfg = slurp(quickstart());
  cfg.replace(cfg.find("policy = \"fp32\""), 15, "policy = \"bf16-mixed\"");
  auto with_override = write_file("override.toml", cfg + "\n[[precision.override]]\nlayers = \"head\"\ncompute = \"fp32\"\n");
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

  auto bad = write_file("bad-override.toml", cfg + "\n[[precision.override]]\nlayers = \"classifier\"\ncompute = \"fp32\"\n");
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
  // head has 10 outputs, not a multiple of 8.
  EXPECT_NE(r.err.find("'head' (linear): GEMM dimension 10 is not a multiple of 8"), std::string::npos) << r.err;
  auto ok = run("check " + quickstart() + " --set precision.policy=fp16-mixed --set scaler.type=dynamic");
  EXPECT_EQ(ok.err.find("scaler.type = \"dynamic\""), std::string::npos) << ok.err;
  // FP32 GEMMs do not use Tensor Cores' 16-bit paths: no size warning.
  auto fp32 = run("check " + quickstart());
  EXPECT_EQ(fp32.err.find("not a multiple of 8"), std::string::npos) << fp32.err;
}

TEST_F(Precision, UnknownPolicyListsThePolicies) {
  auto r = run("check " + quickstart() + " --set precision.policy=bf16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no policy named 'bf16'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bf16-mixed"), std::string::npos) << r.err;
}

}  // namespace

// Run comparison: reading run folders, the parity numbers, and the three renderings.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "compare_test_support.h"
#include "mixtrain/core/run_comparison.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::testing_compare {
namespace {

using core::compare_runs;
using json = nlohmann::json;

class Compare : public RunFolders {};

TEST_F(Compare, LargestRelativeGapAndItsStepAreExact) {
  auto c = compare_runs({baseline(), fp16_run()});
  ASSERT_EQ(c.rows.size(), 2u);
  const auto& r = c.rows[1];
  ASSERT_TRUE(r.max_rel_loss_gap.has_value());
  EXPECT_DOUBLE_EQ(*r.max_rel_loss_gap, std::fabs(0.7 - 1.0) / 1.0);
  EXPECT_EQ(r.max_rel_loss_gap_step, 20);
  // Steps 10, 20, 30: 15 has a non-finite loss and 40 was never logged by the baseline.
  EXPECT_EQ(r.common_steps, 3);
}

TEST_F(Compare, TheBaselineHasZeroGapAgainstItself) {
  auto c = compare_runs({baseline(), fp16_run()});
  EXPECT_EQ(c.rows[0].max_rel_loss_gap, 0.0);
  EXPECT_EQ(c.rows[0].common_steps, 3);
  EXPECT_EQ(c.rows[0].eval_accuracy_delta_points, 0.0);
  EXPECT_EQ(c.rows[0].samples_per_s_ratio, 1.0);
}

TEST_F(Compare, GapDividesByAtLeastOneTrillionthWhenTheBaselineLossIsZero) {
  write("zero/metrics.jsonl", "{\"step\":1,\"loss\":0.0}\n{\"step\":2,\"loss\":0.0}\n");
  write("tiny/metrics.jsonl", "{\"step\":1,\"loss\":0.0}\n{\"step\":2,\"loss\":2e-12}\n");
  auto c = compare_runs({root_ / "zero", root_ / "tiny"});
  EXPECT_DOUBLE_EQ(*c.rows[1].max_rel_loss_gap, 2.0);
  EXPECT_EQ(c.rows[1].max_rel_loss_gap_step, 2);
}

TEST_F(Compare, BestLossScaleRangeAndSkippedSteps) {
  auto c = compare_runs({baseline(), fp16_run()});
  EXPECT_EQ(c.rows[0].best_loss, 0.5);
  EXPECT_EQ(c.rows[0].best_loss_step, 30);
  EXPECT_EQ(c.rows[1].best_loss, 0.4);
  EXPECT_EQ(c.rows[1].best_loss_step, 40);
  EXPECT_EQ(c.rows[0].loss_scale_min, 1.0);
  EXPECT_EQ(c.rows[0].loss_scale_max, 1.0);
  EXPECT_EQ(c.rows[1].loss_scale_min, 32768.0);
  EXPECT_EQ(c.rows[1].loss_scale_max, 65536.0);
  EXPECT_EQ(c.rows[0].skipped_steps, 0);
  EXPECT_EQ(c.rows[1].skipped_steps, 1);
}

TEST_F(Compare, DeltasAndRatiosAgainstTheBaseline) {
  auto c = compare_runs({baseline(), fp16_run()});
  const auto& r = c.rows[1];
  EXPECT_DOUBLE_EQ(*r.eval_accuracy_delta_points, (0.85 - 0.8) * 100.0);
  EXPECT_EQ(r.eval_loss, 0.5);
  EXPECT_EQ(r.final_loss, 0.4);
  EXPECT_DOUBLE_EQ(*r.samples_per_s_ratio, 1.5);
  EXPECT_DOUBLE_EQ(*c.rows[0].peak_memory_mib, 2.0);
  EXPECT_DOUBLE_EQ(*r.peak_memory_mib, 1.0);
  EXPECT_DOUBLE_EQ(*r.peak_memory_ratio, 0.5);
  EXPECT_EQ(r.label, "fp16 (fp16-mixed/dynamic)");
}

TEST_F(Compare, AMissingSummaryIsDerivedFromTheMetrics) {
  auto c = compare_runs({baseline(), interrupted_run()});
  const auto& run = c.runs[1];
  EXPECT_FALSE(run.has_summary);
  EXPECT_EQ(run.policy, "bf16-mixed");
  EXPECT_EQ(run.scaler, "static");
  EXPECT_EQ(run.steps_run, 25);
  const auto& r = c.rows[1];
  EXPECT_EQ(r.skipped_steps, 1);
  EXPECT_EQ(r.final_loss, 1.25);
  EXPECT_EQ(r.eval_accuracy, 0.7);
  EXPECT_EQ(r.eval_loss, 1.1);
  EXPECT_DOUBLE_EQ(*r.samples_per_s, 300.0);  // mean of the windows that measured something
  EXPECT_FALSE(r.peak_memory_mib.has_value());
  EXPECT_FALSE(r.peak_memory_ratio.has_value());
  EXPECT_DOUBLE_EQ(*r.eval_accuracy_delta_points, (0.7 - 0.8) * 100.0);
  EXPECT_EQ(r.max_rel_loss_gap, 0.0);  // equal losses at 10 and 20
  EXPECT_EQ(r.max_rel_loss_gap_step, 10);
}

TEST_F(Compare, AMalformedLineIsReportedWithFileAndLine) {
  auto dir = baseline();
  write("base/metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n\n{\"step\":2,\"loss\":\n{\"step\":3,\"loss\":1.0}\n");
  try {
    core::load_run(dir);
    FAIL() << "no error";
  } catch (const sdk::DataError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "metrics.jsonl").string() + ":3"), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
}

TEST_F(Compare, AWronglyTypedFieldIsReportedWithFileAndLine) {
  write("r/metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n{\"step\":2,\"loss\":\"low\"}\n");
  try {
    core::load_run(root_ / "r");
    FAIL() << "no error";
  } catch (const sdk::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'loss'"), std::string::npos) << e.what();
  }
}

TEST_F(Compare, AnInterruptedRunsTornLastLineIsIgnoredButOnlyThere) {
  write("r/metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n{\"step\":2,\"lo");
  auto run = core::load_run(root_ / "r");
  ASSERT_EQ(run.steps.size(), 1u);
  EXPECT_EQ(run.final_loss, 1.0);
  // A finished run (summary.json present) has no excuse for a torn line.
  write("r/summary.json", "{\"steps\":2}");
  EXPECT_THROW(core::load_run(root_ / "r"), sdk::DataError);
}

TEST_F(Compare, BadFoldersAreUserErrorsNamingThePath) {
  try {
    compare_runs({baseline(), root_ / "nope"});
    FAIL() << "no error";
  } catch (const sdk::UserError& e) {
    EXPECT_NE(std::string(e.what()).find((root_ / "nope").string()), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
  fs::create_directories(root_ / "empty");
  try {
    compare_runs({root_ / "empty"});
    FAIL() << "no error";
  } catch (const sdk::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl"), std::string::npos) << e.what();
  }
  EXPECT_THROW(compare_runs(std::vector<fs::path>{}), sdk::UserError);
  write("broken/metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n");
  write("broken/summary.json", "{\"steps\":");
  EXPECT_THROW(compare_runs({root_ / "broken"}), sdk::DataError);
}

TEST_F(Compare, SameFolderNamesFromDifferentParentsStayDistinct) {
  baseline("a/run");
  fp16_run("b/run");
  auto c = compare_runs({root_ / "a/run", root_ / "b/run", root_ / "a/run"});
  EXPECT_EQ(c.rows[0].name, "a/run");
  EXPECT_EQ(c.rows[1].name, "b/run");
  EXPECT_EQ(c.rows[2].name, "a/run#2");
}

TEST_F(Compare, TextMarkdownAndJsonCarryTheSameNumbers) {
  auto c = compare_runs({baseline(), fp16_run(), interrupted_run()});
  const auto text = core::comparison_text(c);
  for (const char* s : {"base (fp32/none)", "fp16 (fp16-mixed/dynamic)", "cut (bf16-mixed/static)",
                        "30.00% @20", "+5.00 pts", "32768..65536", "1.50x", "0.50x", "0.40000 @40"})
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;

  const auto md = core::comparison_markdown(c);
  EXPECT_NE(md.find("| fp16 (fp16-mixed/dynamic) |"), std::string::npos) << md;
  EXPECT_NE(md.find("30.00% @20"), std::string::npos) << md;
  EXPECT_NE(md.find("|:---|---:|"), std::string::npos) << md;

  auto j = json::parse(core::comparison_json(c));
  EXPECT_EQ(j["baseline"], "base");
  ASSERT_EQ(j["runs"].size(), 3u);
  EXPECT_EQ(j["runs"][0]["max_rel_loss_gap"].get<double>(), 0.0);
  EXPECT_TRUE(j["runs"][0]["baseline"].get<bool>());
  EXPECT_DOUBLE_EQ(j["runs"][1]["max_rel_loss_gap"].get<double>(), std::fabs(0.7 - 1.0));
  EXPECT_EQ(j["runs"][1]["max_rel_loss_gap_step"].get<int>(), 20);
  EXPECT_EQ(j["runs"][1]["loss_scale_min"].get<double>(), 32768.0);
  EXPECT_TRUE(j["runs"][2]["peak_memory_mib"].is_null());
  EXPECT_FALSE(j["runs"][2]["has_summary"].get<bool>());
}

TEST_F(Compare, MarkdownEscapesTableAndHtmlSyntaxInRunNames) {
  baseline("a|<b>_c");
  auto md = core::comparison_markdown(compare_runs({root_ / "a|<b>_c"}));
  EXPECT_NE(md.find("| a\\|&lt;b&gt;\\_c (fp32/none) |"), std::string::npos) << md;
}

TEST_F(Compare, WritesExactlyTheThreeFilesAndNothingElse) {
  auto c = compare_runs({baseline(), fp16_run()});
  auto out = root_ / "report";
  write("report/notes.txt", "mine");
  auto written = core::write_comparison(c, out);
  ASSERT_EQ(written.size(), 3u);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(out)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"compare.json", "compare.md", "compare.svg", "notes.txt"}));
  EXPECT_EQ(slurp(out / "notes.txt"), "mine");
  EXPECT_EQ(slurp(out / "compare.json"), core::comparison_json(c));

  write("afile", "x");
  EXPECT_THROW(core::write_comparison(c, root_ / "afile"), sdk::UserError);
  fs::create_directories(root_ / "clash" / "compare.svg");
  EXPECT_THROW(core::write_comparison(c, root_ / "clash"), sdk::UserError);
}

}  // namespace
}  // namespace mixtrain::testing_compare

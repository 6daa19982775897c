// Run comparison: reading run folders, the parity numbers, and the three renderings.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compare_test_support.h"
#include "mixtrain/core/runs/comparison.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::testing_compare {
namespace {

using core::compare_runs;
using json = nlohmann::json;

class Compare : public RunFolders {
 protected:
  // A run folder whose summary.json carries the trainer's "precision" record.
  fs::path run_with_precision(const std::string& name, const std::string& policy,
                              const std::string& resolved, const std::string& dtype, bool native) {
    json gemm = {{"native", native},
                 {"how", native ? "hardware" : "emulated: by " + dtype + " rounding"}};
    json summary = {
        {"steps", 10}, {"samples_per_s", 100.0}, {"policy", policy}, {"scaler", "none"}};
    summary["precision"] = {{"policy", resolved}, {"gemm_inputs", {{dtype, gemm}}}};
    write(name + "/summary.json", summary.dump());
    write(name + "/metrics.jsonl", "{\"step\":10,\"loss\":1.0,\"samples_per_s\":100}\n");
    return root_ / name;
  }
};

TEST_F(Compare, SmoothedLossIsATrailingMeanFromTheFirstFullWindow) {
  // Logged every 10 steps, so W = 50 steps: the first full window is steps 10..50.
  auto run = core::load_run(curve_run("r", 10, 10, {5, 4, 3, 2, 1, 6, 7}));
  const auto s = core::smoothed_losses(run, 10);
  ASSERT_EQ(s.size(), 3u) << "steps 10..40 have no full window";
  EXPECT_DOUBLE_EQ(s.at(50), (5 + 4 + 3 + 2 + 1) / 5.0);
  EXPECT_DOUBLE_EQ(s.at(60), (4 + 3 + 2 + 1 + 6) / 5.0);
  EXPECT_DOUBLE_EQ(s.at(70), (3 + 2 + 1 + 6 + 7) / 5.0);
  // A non-finite loss leaves the mean of the window's finite ones, and has no point itself.
  write("nan/metrics.jsonl",
        "{\"step\":1,\"loss\":1}\n{\"step\":2,\"loss\":2}\n{\"step\":3,\"loss\":null}\n"
        "{\"step\":4,\"loss\":4}\n{\"step\":5,\"loss\":5}\n{\"step\":6,\"loss\":6}\n");
  const auto n = core::smoothed_losses(core::load_run(root_ / "nan"), 1);
  EXPECT_DOUBLE_EQ(n.at(5), (1 + 2 + 4 + 5) / 4.0);
  EXPECT_DOUBLE_EQ(n.at(6), (2 + 4 + 5 + 6) / 4.0);
  EXPECT_EQ(n.count(3), 0u);
}

TEST_F(Compare, TheGapIsMeasuredOnTheSmoothedCurveNotOnSingleBatches) {
  std::vector<double> flat(20, 1.0), noisy, shifted(20, 1.1);
  for (int i = 0; i < 20; ++i) noisy.push_back(i % 2 == 0 ? 1.2 : 0.8);
  auto c = compare_runs({curve_run("base", 1, 1, flat), curve_run("noisy", 1, 1, noisy),
                         curve_run("shifted", 1, 1, shifted)});
  EXPECT_EQ(c.logging_interval, 1);
  EXPECT_EQ(c.smoothing_window_steps(), 5);
  // Single batches of `noisy` are 20% off; its five-step means only by one unpaired batch.
  EXPECT_NEAR(*c.rows[1].max_rel_loss_gap, 0.04, 1e-12);
  EXPECT_EQ(c.rows[1].common_steps, 20);    // both logged every step
  EXPECT_EQ(c.rows[1].smoothed_steps, 16);  // steps 5..20 have a full window
  // A real offset survives the smoothing whole.
  EXPECT_NEAR(*c.rows[2].max_rel_loss_gap, 0.1, 1e-12);
  EXPECT_EQ(c.rows[0].max_rel_loss_gap, 0.0);
  EXPECT_EQ(c.rows[0].smoothed_steps, 16);

  const auto text = core::comparison_text(c);
  EXPECT_NE(text.find("max gap, 5-step mean loss"), std::string::npos) << text;
  EXPECT_NE(text.find("10.00% @5"), std::string::npos) << text;
  EXPECT_NE(text.find("averaged over the trailing 5 steps"), std::string::npos) << text;
  EXPECT_NE(core::comparison_markdown(c).find("max gap, 5-step mean loss"), std::string::npos);
  auto j = json::parse(core::comparison_json(c));
  EXPECT_EQ(j["loss_gap"]["window_steps"], 5);
}

// A run logged every 10 steps against a baseline logged every step, on the same losses: both are
// averaged over the steps both logged, so the gap is 0 (averaging 5 baseline steps against one of
// the run's made a gap of batch noise alone).
TEST_F(Compare, RunsLoggedAtOtherIntervalsAverageTheSameSteps) {
  std::vector<double> every(60), tenth;
  for (int i = 0; i < 60; ++i) every[static_cast<std::size_t>(i)] = 1.0 + (i % 3 == 0 ? 0.5 : 0.0);
  for (int s = 10; s <= 60; s += 10) tenth.push_back(every[static_cast<std::size_t>(s - 1)]);
  auto c = compare_runs({curve_run("base", 1, 1, every), curve_run("tenth", 10, 10, tenth)});
  EXPECT_EQ(c.logging_interval, 1);
  ASSERT_TRUE(c.rows[1].max_rel_loss_gap.has_value());
  EXPECT_EQ(*c.rows[1].max_rel_loss_gap, 0.0);
  EXPECT_EQ(c.rows[1].gap_window_steps, 50);
  EXPECT_EQ(c.rows[1].common_steps, 6);    // steps 10, 20, ..., 60
  EXPECT_EQ(c.rows[1].smoothed_steps, 2);  // steps 50 and 60
  // The other way round as well.
  c = compare_runs({curve_run("tenth", 10, 10, tenth), curve_run("base", 1, 1, every)});
  EXPECT_EQ(*c.rows[1].max_rel_loss_gap, 0.0);
  auto j = json::parse(core::comparison_json(c));
  EXPECT_EQ(j["runs"][1]["max_rel_loss_gap_window_steps"], 50);
}

TEST_F(Compare, TheBaselineComparesWithItselfAsZero) {
  auto c = compare_runs({baseline(), fp16_run()});
  EXPECT_EQ(c.rows[0].eval_accuracy_delta_points, 0.0);
  EXPECT_EQ(c.rows[0].eval_loss_rel_delta, 0.0);
  EXPECT_EQ(c.rows[0].samples_per_s_ratio, 1.0);
}

TEST_F(Compare, GapDividesByAtLeastOneTrillionthWhenTheBaselineLossIsZero) {
  auto c = compare_runs(
      {curve_run("zero", 1, 1, {0, 0, 0, 0, 0}), curve_run("tiny", 1, 1, {0, 0, 0, 0, 1e-11})});
  EXPECT_NEAR(*c.rows[1].max_rel_loss_gap, 2.0, 1e-9);  // mean 2e-12 over 1e-12
  EXPECT_EQ(c.rows[1].max_rel_loss_gap_step, 5);
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
  EXPECT_DOUBLE_EQ(*r.eval_loss_rel_delta, (0.5 - 0.6) / 0.6);
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
  // Three logged steps hold no full window of five intervals: no gap, and the table says why.
  EXPECT_FALSE(r.max_rel_loss_gap.has_value());
  EXPECT_NE(core::comparison_text(c).find("too short to smooth"), std::string::npos);
}

// A skipped step's underflow and FP8 records measured its overflowed pass: they are tagged and
// leave the run's worst shares alone.
TEST_F(Compare, DiagnosticsOfSkippedStepsAreLeftOut) {
  write("r/metrics.jsonl",
        "{\"step\":1,\"underflow\":{\"fc1 input gradient\":{\"flushed_share\":0.1}}}\n"
        "{\"step\":1,\"fp8\":{\"fc1.matmul.input\":{\"saturated_share\":0.2,\"amax\":3}}}\n"
        "{\"step\":1,\"loss\":1.0,\"skipped\":false}\n"
        "{\"step\":2,\"skipped\":true,\"underflow\":{\"fc1 input gradient\":"
        "{\"flushed_share\":0.9}}}\n"
        "{\"step\":2,\"skipped\":true,\"fp8\":{\"fc1.matmul.input\":"
        "{\"saturated_share\":0.8,\"amax\":null}}}\n"
        "{\"step\":2,\"loss\":null,\"skipped\":true}\n");
  const auto run = core::load_run(root_ / "r");
  EXPECT_EQ(run.max_gradient_underflow.at("fc1 input gradient"), 0.1);
  EXPECT_EQ(run.fp8_slots.at("fc1.matmul.input").max_saturated_share, 0.2);
  ASSERT_EQ(run.steps.size(), 2u);
  EXPECT_TRUE(run.steps[1].skipped);
}

// A gradient underflow share that would print as 0.0% is left out of the diagnostics: it tells
// nothing and crowds out the ones that do. A run whose every share is that small says so once.
TEST_F(Compare, UnderflowSharesThatRoundToZeroAreLeftOutOfTheDiagnostics) {
  core::RunComparison c;
  auto& run = c.runs.emplace_back();
  run.name = "r";
  run.max_gradient_underflow = {{"fc1 input gradient", 0.0004}, {"fc2 input gradient", 0.012}};
  std::string text = core::diagnostics_text(c);
  EXPECT_NE(text.find("fc2 input gradient"), std::string::npos) << text;
  EXPECT_NE(text.find("up to 1.2%"), std::string::npos) << text;
  EXPECT_EQ(text.find("fc1 input gradient"), std::string::npos) << text;
  EXPECT_EQ(text.find("0.0%"), std::string::npos) << text;
  run.max_gradient_underflow = {{"fc1 input gradient", 0.0004}, {"fc2 input gradient", 0.0}};
  text = core::diagnostics_text(c);
  EXPECT_EQ(text.find("input gradient"), std::string::npos) << text;
  EXPECT_NE(text.find("every gradient measured flushed under 0.05%"), std::string::npos) << text;
}

// null is metrics.jsonl's spelling of a non-finite number: in an FP8 or underflow record (a
// third-party policy's statistics) it is passed over as a NaN loss is, not an internal error; a
// field of another type is damage named at its line.
TEST_F(Compare, NullDiagnosticsArePassedOverAndWrongTypesNamedAtTheirLine) {
  write("r/metrics.jsonl",
        "{\"step\":1,\"loss\":1.0}\n"
        "{\"step\":1,\"fp8\":{\"fc1.matmul.input\":{\"dtype\":\"fp8_e4m3\",\"scale\":2.0,"
        "\"saturated_share\":0.25}}}\n"
        "{\"step\":2,\"fp8\":{\"fc1.matmul.input\":{\"dtype\":\"fp8_e4m3\",\"scale\":null,"
        "\"saturated_share\":null,\"underflow_share\":null}}}\n"
        "{\"step\":2,\"underflow\":{\"fc1 input gradient\":{\"flushed_share\":null}}}\n"
        "{\"step\":2,\"loss\":0.5}\n");
  const auto run = core::load_run(root_ / "r");
  const auto& slot = run.fp8_slots.at("fc1.matmul.input");
  EXPECT_EQ(slot.max_saturated_share, 0.25);
  EXPECT_EQ(slot.max_underflow_share, 0.0);
  EXPECT_EQ(slot.last_scale, 2.0);
  EXPECT_EQ(run.max_gradient_underflow.at("fc1 input gradient"), 0.0);

  write("r/metrics.jsonl",
        "{\"step\":1,\"loss\":1.0}\n"
        "{\"step\":1,\"fp8\":{\"fc1.matmul.input\":{\"scale\":\"big\"}}}\n");
  try {
    core::load_run(root_ / "r");
    FAIL() << "no error";
  } catch (const sdk::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'scale'"), std::string::npos) << e.what();
  }
}

TEST_F(Compare, AMalformedLineIsReportedWithFileAndLine) {
  auto dir = baseline();
  write("base/metrics.jsonl",
        "{\"step\":1,\"loss\":1.0}\n\n{\"step\":2,\"loss\":\n{\"step\":3,\"loss\":1.0}\n");
  try {
    core::load_run(dir);
    FAIL() << "no error";
  } catch (const sdk::DataError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "metrics.jsonl").string() + ":3"),
              std::string::npos)
        << e.what();
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

// nlohmann::json raises out_of_range, not parse_error, for a number past double's range.
TEST_F(Compare, ANumberPastDoublesRangeIsAMalformedLineNotAnInternalError) {
  write("r/metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n{\"step\":1e400,\"loss\":1}\n");
  try {
    core::load_run(root_ / "r");
    FAIL() << "no error";
  } catch (const sdk::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2"), std::string::npos) << e.what();
  }
  write("r/metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n");
  write("r/summary.json", "{\"steps\": 1e400}\n");
  EXPECT_THROW(core::load_run(root_ / "r"), sdk::DataError);
}

TEST_F(Compare, StepsOutsideZeroToTwoToTheFiftyAreDataErrorsAndHugeCountsAreIgnored) {
  // Crafted values whose arithmetic (intervals, smoothing windows) would overflow int64.
  for (const std::string step : {"-1", "9223372036854775807", "18446744073709551615"}) {
    write("r/metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n{\"step\":" + step + ",\"loss\":1.0}\n");
    try {
      core::load_run(root_ / "r");
      FAIL() << "no error for step " << step;
    } catch (const sdk::DataError& e) {
      EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'step'"), std::string::npos) << e.what();
    }
  }
  write("r/metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n");
  write("r/summary.json", "{\"steps\": 1e300, \"skipped_steps\": -5}\n");
  auto run = core::load_run(root_ / "r");
  EXPECT_EQ(run.steps_run, 0);
  EXPECT_EQ(run.skipped_steps, 0);
}

// A resumed session interrupted before its own first evaluation writes a summary without one: the
// run's evaluation is the last that metrics.jsonl holds. A summary with one keeps its own.
TEST_F(Compare, ASummaryWithoutAnEvaluationTakesTheLastOfTheMetrics) {
  write("r/metrics.jsonl",
        "{\"step\":10,\"loss\":1.0}\n{\"step\":10,\"eval_loss\":0.9,\"eval_accuracy\":0.6}\n"
        "{\"step\":20,\"loss\":0.8}\n{\"step\":20,\"eval_loss\":0.7,\"eval_accuracy\":0.75}\n"
        "{\"step\":25,\"loss\":0.6}\n");
  write("r/summary.json", "{\"steps\":25,\"interrupted\":true,\"final_loss\":0.6}");
  auto run = core::load_run(root_ / "r");
  EXPECT_TRUE(run.has_summary);
  EXPECT_EQ(run.eval_loss, 0.7);
  EXPECT_EQ(run.eval_accuracy, 0.75);
  write("r/summary.json", "{\"steps\":25,\"eval_loss\":0.5,\"eval_accuracy\":0.8}");
  run = core::load_run(root_ / "r");
  EXPECT_EQ(run.eval_loss, 0.5);
  EXPECT_EQ(run.eval_accuracy, 0.8);
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
                        "too short to smooth", "+5.00 pts", "0.50000 (-16.67%)", "32768..65536",
                        "1.50x", "0.50x", "0.40000 @40"})
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;

  const auto md = core::comparison_markdown(c);
  EXPECT_NE(md.find("| fp16 (fp16-mixed/dynamic) |"), std::string::npos) << md;
  EXPECT_NE(md.find("0.50000 (-16.67%)"), std::string::npos) << md;
  EXPECT_NE(md.find("|:---|---:|"), std::string::npos) << md;

  auto j = json::parse(core::comparison_json(c));
  EXPECT_EQ(j["baseline"], "base");
  ASSERT_EQ(j["runs"].size(), 3u);
  EXPECT_TRUE(j["runs"][0]["baseline"].get<bool>());
  EXPECT_TRUE(j["runs"][1]["max_rel_loss_gap"].is_null());
  EXPECT_DOUBLE_EQ(j["runs"][1]["eval_loss_rel_delta"].get<double>(), (0.5 - 0.6) / 0.6);
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
  EXPECT_EQ(names,
            (std::set<std::string>{"compare.json", "compare.md", "compare.svg", "notes.txt"}));
  EXPECT_EQ(slurp(out / "notes.txt"), "mine");
  EXPECT_EQ(slurp(out / "compare.json"), core::comparison_json(c));

  write("afile", "x");
  EXPECT_THROW(core::write_comparison(c, root_ / "afile"), sdk::UserError);
  fs::create_directories(root_ / "clash" / "compare.svg");
  EXPECT_THROW(core::write_comparison(c, root_ / "clash"), sdk::UserError);
}

// An --out whose parent folder is missing is refused, as predict's and export's are: a typo in a
// parent is not made into folders. The last folder alone is created.
TEST_F(Compare, AnOutFolderInAMissingFolderIsRefused) {
  auto c = compare_runs({baseline()});
  try {
    core::write_comparison(c, root_ / "missing" / "report");
    ADD_FAILURE() << "no error";
  } catch (const sdk::UserError& e) {
    EXPECT_NE(std::string(e.what()).find((root_ / "missing").string() + ", does not exist"),
              std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("mkdir -p"), std::string::npos) << e.hint();
  }
  EXPECT_FALSE(fs::exists(root_ / "missing"));
  EXPECT_EQ(core::write_comparison(c, root_ / "new").size(), 3u);
  EXPECT_EQ(core::write_comparison(c, root_ / "new2/").size(), 3u);
}

// A write that fails after some of the three files are whole (past a file-size limit, as a full
// disk fails it: the small JSON and markdown fit, the SVG does not) leaves the previous
// comparison's three files as they were and nothing else: no new one beside old ones, no staging
// or temporary file. In a child process, whose file-size limit is its own.
TEST_F(Compare, AWriteFailingAtTheLastFileLeavesThePreviousThreeWhole) {
  const auto old = compare_runs({baseline()});
  const auto out = root_ / "report";
  core::write_comparison(old, out);
  std::map<std::string, std::string> before;
  for (const char* f : core::kCompareOutputNames) before[f] = slurp(out / f);

  const auto c = compare_runs({baseline(), fp16_run()});
  const auto json_size = core::comparison_json(c).size(),
             md_size = core::comparison_markdown(c).size();
  const auto limit = std::max(json_size, md_size) + 1;
  ASSERT_GT(core::comparison_svg(c).size(), limit) << "the SVG must be the one that does not fit";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
    const rlimit fsize{limit, limit};
    if (::setrlimit(RLIMIT_FSIZE, &fsize) != 0) ::_exit(4);
    try {
      core::write_comparison(c, out);
    } catch (const std::exception&) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3) << "the write should have failed";
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(out)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"compare.json", "compare.md", "compare.svg"}));
  for (const auto& [name, text] : before) EXPECT_EQ(slurp(out / name), text) << name;
}

TEST_F(Compare, AutoIsLabelledWithThePolicyItResolvedTo) {
  auto c = compare_runs({run_with_precision("plain", "fp32", "fp32", "fp32", true),
                         run_with_precision("chosen", "auto", "bf16-mixed", "bf16", true)});
  EXPECT_EQ(c.runs[0].policy_label(), "fp32");
  EXPECT_EQ(c.rows[1].label, "chosen (auto\u2192bf16-mixed/none)");
  EXPECT_NE(core::comparison_text(c).find("chosen (auto\u2192bf16-mixed/none)"), std::string::npos);
  EXPECT_NE(core::comparison_markdown(c).find("chosen (auto\u2192bf16-mixed/none)"),
            std::string::npos);
  auto j = json::parse(core::comparison_json(c));
  EXPECT_EQ(j["runs"][1]["policy"], "auto");
  EXPECT_EQ(j["runs"][1]["resolved_policy"], "bf16-mixed");
  // A summary without the record (an older run) keeps the plain name.
  auto old = core::compare_runs({baseline()});
  EXPECT_EQ(old.rows[0].label, "base (fp32/none)");
  EXPECT_TRUE(json::parse(core::comparison_json(old))["runs"][0]["resolved_policy"].is_null());
}

TEST_F(Compare, ThroughputOfEmulatedFormatsIsMarkedEmulated) {
  auto c = compare_runs({run_with_precision("native", "fp32", "fp32", "fp32", true),
                         run_with_precision("emul", "bf16-mixed", "bf16-mixed", "bf16", false)});
  EXPECT_FALSE(c.rows[0].samples_per_s_emulated);
  EXPECT_TRUE(c.rows[1].samples_per_s_emulated);
  EXPECT_EQ(c.runs[1].emulated_gemm_inputs(), std::vector<std::string>{"bf16"});
  const auto text = core::comparison_text(c);
  EXPECT_NE(text.find("100 (1.00x) emulated"), std::string::npos) << text;
  EXPECT_EQ(text.find("100 emulated"), std::string::npos) << "the native baseline is not marked\n"
                                                          << text;
  EXPECT_NE(text.find("emul: bf16 GEMMs emulated: by bf16 rounding"), std::string::npos) << text;
  EXPECT_NE(core::comparison_markdown(c).find("100 (1.00x) emulated"), std::string::npos);
  auto j = json::parse(core::comparison_json(c));
  EXPECT_FALSE(j["runs"][0]["samples_per_s_emulated"].get<bool>());
  EXPECT_TRUE(j["runs"][1]["samples_per_s_emulated"].get<bool>());
  EXPECT_FALSE(j["runs"][1]["gemm_inputs"]["bf16"]["native"].get<bool>());
}

std::string config_toml(const std::string& precision, int fc1_out,
                        const std::string& synthetic_extra) {
  return "[precision]\npolicy = \"" + precision +
         "\"\n[scaler]\ntype = \"none\"\n"
         "[model]\nloss = \"softmax_cross_entropy\"\n"
         "layers = [ { type = \"linear\", name = \"fc1\", out = " +
         std::to_string(fc1_out) +
         " }, { type = \"relu\" }, { type = \"linear\", name = \"head\", out = 10 } ]\n"
         "[data]\nsource = \"synthetic\"\nbatch_size = 128\n"
         "[data.synthetic]\nrows = 8192\n" +
         synthetic_extra;
}

TEST_F(Compare, RunsThatTrainADifferentModelOrDataAreWarnedKeyByKey) {
  auto run = [&](const std::string& name, const std::string& config) {
    write(name + "/config.toml", config);
    write(name + "/metrics.jsonl", "{\"step\":10,\"loss\":1.0}\n");
    return root_ / name;
  };
  auto c = compare_runs({run("base", config_toml("fp32", 128, "noise = 1.0\n")),
                         // Another precision, same model and data: what a comparison is for.
                         run("same", config_toml("bf16-mixed", 128, "noise = 1.0\n")),
                         run("wider", config_toml("fp32", 64, "noise = 1.0\n")),
                         // 0.1 as the config spells it, not toml++'s 0.10000000000000001.
                         run("noisier", config_toml("fp32", 128, "noise = 0.1\nseed = 3\n"))});
  ASSERT_TRUE(c.rows[1].setup_differences.has_value());
  EXPECT_TRUE(c.rows[1].setup_differences->empty());
  // The token ids an export names are no difference of model (a run from before the keys
  // existed has none).
  const auto ids =
      compare_runs({run("base", config_toml("fp32", 128, "noise = 1.0\n")),
                    run("ids", config_toml("fp32", 128, "noise = 1.0\n") +
                                   "[model.gpt]\nbos_token_id = -2\neos_token_id = 7\n")});
  ASSERT_TRUE(ids.rows[1].setup_differences.has_value());
  EXPECT_TRUE(ids.rows[1].setup_differences->empty());
  ASSERT_EQ(c.rows[2].setup_differences->size(), 1u);
  EXPECT_EQ((*c.rows[2].setup_differences)[0].key, "model.layers[0].out");
  const auto warnings = core::comparison_warnings(c);
  ASSERT_EQ(warnings.size(), 2u) << warnings[0];
  EXPECT_NE(warnings[0].find("wider"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("model.layers[0].out = 64 (baseline 128)"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[1].find("noisier"), std::string::npos) << warnings[1];
  EXPECT_NE(warnings[1].find("data.synthetic.noise = 0.1 (baseline 1.0)"), std::string::npos)
      << warnings[1];
  EXPECT_NE(warnings[1].find("data.synthetic.seed = 3 (baseline (absent))"), std::string::npos)
      << warnings[1];
  for (const auto& w : warnings) EXPECT_EQ(w.find("same"), std::string::npos) << w;

  EXPECT_NE(core::comparison_text(c).find("warning: wider trains a different model or data"),
            std::string::npos);
  EXPECT_NE(
      core::comparison_markdown(c).find("> **Warning:** wider trains a different model or data"),
      std::string::npos);
  auto j = json::parse(core::comparison_json(c));
  EXPECT_EQ(j["warnings"].size(), 2u);
  EXPECT_EQ(j["runs"][1]["setup_differences"], json::array());
  EXPECT_EQ(j["runs"][2]["setup_differences"][0]["key"], "model.layers[0].out");
  EXPECT_EQ(j["runs"][2]["setup_differences"][0]["baseline"], "128");
  EXPECT_EQ(j["runs"][2]["setup_differences"][0]["run"], "64");
}

TEST_F(Compare, RunsWithAnotherSeedAreWarnedAbout) {
  // run.seed draws the synthetic data and the held-out split.
  write("a/config.toml", "[run]\nseed = 1\n" + config_toml("fp32", 128, ""));
  write("b/config.toml", "[run]\nseed = 2\n" + config_toml("bf16-mixed", 128, ""));
  for (const char* r : {"a", "b"})
    write(std::string(r) + "/metrics.jsonl", "{\"step\":10,\"loss\":1.0}\n");
  auto c = compare_runs({root_ / "a", root_ / "b"});
  const auto warnings = core::comparison_warnings(c);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("run.seed = 2 (baseline 1)"), std::string::npos) << warnings[0];
}

TEST_F(Compare, ManyDifferencesAreCountedAndRunsWithoutAConfigAreNamed) {
  write("a/config.toml", "[data]\nx1 = 1\nx2 = 1\nx3 = 1\nx4 = 1\nx5 = 1\nx6 = 1\n");
  write("a/metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n");
  write("b/config.toml", "[data]\nx1 = 2\nx2 = 2\nx3 = 2\nx4 = 2\nx5 = 2\nx6 = 2\n");
  write("b/metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n");
  auto w = core::comparison_warnings(compare_runs({root_ / "a", root_ / "b", fp16_run()}));
  // fp16 also ran more steps than the baseline's one: that is the third warning.
  ASSERT_EQ(w.size(), 3u);
  EXPECT_NE(w[0].find("and 2 more"), std::string::npos) << w[0];
  EXPECT_NE(w[1].find("fp16 ran "), std::string::npos) << w[1];
  EXPECT_NE(w[2].find("no readable config.toml in fp16"), std::string::npos) << w[2];
  // One run alone compares with nothing: nothing to warn about.
  EXPECT_TRUE(core::comparison_warnings(compare_runs({fp16_run()})).empty());
}

}  // namespace
}  // namespace mixtrain::testing_compare

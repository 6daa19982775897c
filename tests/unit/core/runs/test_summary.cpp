// The divergence verdict and summary.json's shape (runs/summary.h).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include "mixtrain/core/runs/summary.h"

namespace {

using mixtrain::core::divergence_reason;
using mixtrain::core::TrainSummary;

TrainSummary every_step_skipped() {
  TrainSummary s;
  s.steps = 3;
  s.applied_steps = 0;
  s.skipped_steps = 3;
  s.final_loss = 2.0;
  return s;
}

TEST(RunSummary, EveryStepSkippedIsADivergenceUnlessTheRunWasInterrupted) {
  auto s = every_step_skipped();
  EXPECT_NE(divergence_reason(s, ""), "");
  // Ctrl-C during the dynamic scaler's first back-off steps is not a divergence.
  s.interrupted = true;
  EXPECT_EQ(divergence_reason(s, ""), "");
  // Non-finite losses on every step still are, interrupted or not.
  s.final_loss = std::numeric_limits<double>::quiet_NaN();
  s.trailing_nonfinite_steps = 3;
  EXPECT_NE(divergence_reason(s, ""), "");
}

// One or two non-finite losses at the end of a run that trained (an fp16 forward overflow the
// skip absorbed) are no divergence; kDivergedTail of them in a row are, and so is a run whose
// every step was non-finite however short.
TEST(RunSummary, ANonFiniteLossDivergesOnlyOnTheLastStepsInARow) {
  TrainSummary s;
  s.steps = 100;
  s.applied_steps = 98;
  s.skipped_steps = 2;
  s.final_loss = std::numeric_limits<double>::infinity();
  for (std::int64_t tail = 1; tail < mixtrain::core::kDivergedTail; ++tail) {
    s.trailing_nonfinite_steps = tail;
    EXPECT_EQ(divergence_reason(s, ""), "") << tail;
  }
  s.trailing_nonfinite_steps = mixtrain::core::kDivergedTail;
  EXPECT_EQ(divergence_reason(s, ""), "the loss was not finite on each of the last 3 steps");
  s.steps = 2;
  s.applied_steps = 0;
  s.trailing_nonfinite_steps = 2;
  EXPECT_NE(divergence_reason(s, ""), "");
  s.applied_steps = 1;
  s.trailing_nonfinite_steps = 1;
  EXPECT_EQ(divergence_reason(s, ""), "");
}

TEST(RunSummary, StopReasonWinsAndAHealthyRunHasNone) {
  auto s = every_step_skipped();
  EXPECT_EQ(divergence_reason(s, "on_nonfinite = stop"), "on_nonfinite = stop");
  s.applied_steps = 3;
  s.skipped_steps = 0;
  EXPECT_EQ(divergence_reason(s, ""), "");
}

TEST(RunSummary, SummaryJsonIsReplacedWholeAndLeavesNoTemporaryFile) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mixtrain_run_summary_test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "summary.json") << "{\"steps\": 1, \"torn"; }
  auto s = every_step_skipped();
  s.interrupted = true;
  mixtrain::core::write_run_summary(dir / "summary.json", s);
  std::ifstream in(dir / "summary.json");
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["interrupted"], true);
  EXPECT_EQ(j["diverged"], false);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1);
  std::filesystem::remove_all(dir);
}

}  // namespace

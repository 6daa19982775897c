// PyTorch parity of the learning-rate schedules (lr_schedule_reference.py under /usr/bin/python3
// with torch): for each schedule, with and without warm-up, LrSchedule::lr_at(k) is the lr that
// torch.optim.lr_scheduler gives the (k + 1)-th optimizer step, to 1e-12 relative, over every
// step of a run (and past its end where torch stays at the last rate: linear, step, multistep;
// torch's cosine restarts its period there, mixtrain's stays at min_lr).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <vector>

#include "mixtrain/core/train/lr_schedule.h"
#include "torch_test_support.h"

namespace mixtrain::test {
namespace {

struct Case {
  core::LrSchedule s;
  std::int64_t n = 0;  // steps compared
};

Case make(const std::string& kind, double base, std::int64_t warmup, std::int64_t total,
          std::int64_t n) {
  Case c;
  c.s.kind = *core::find_choice(kind, core::kLrScheduleKinds);
  c.s.base_lr = base;
  c.s.warmup_steps = warmup;
  c.s.total_steps = total;
  c.n = n;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&](Case c, auto&& edit) {
    edit(c.s);
    out.push_back(c);
  };
  auto none = [](core::LrSchedule&) {};
  add(make("warmup_cosine", 0.1, 5, 60, 60), [](auto& s) { s.min_lr = 1e-3; });
  add(make("warmup_cosine", 0.05, 0, 40, 40), [](auto& s) { s.min_lr = 5e-3; });
  add(make("linear", 3e-4, 10, 80, 80), none);
  add(make("linear", 0.02, 0, 50, 60), [](auto& s) { s.min_lr = 1e-3; });
  add(make("linear", 0.02, 1, 30, 30), [](auto& s) { s.min_lr = 2e-3; });
  add(make("step", 0.1, 0, 50, 50), [](auto& s) {
    s.step_size = 7;
    s.gamma = 0.5;
  });
  add(make("step", 0.1, 4, 50, 50), [](auto& s) {
    s.step_size = 10;
    s.gamma = 0.3;
  });
  add(make("multistep", 0.2, 0, 60, 60), [](auto& s) {
    s.milestones = {10, 25, 40};
    s.gamma = 0.1;
  });
  add(make("multistep", 0.2, 5, 60, 60), [](auto& s) {
    s.milestones = {3, 20};
    s.gamma = 0.5;
  });
  add(make("onecycle", 0.01, 0, 100, 100), none);
  add(make("onecycle", 0.4, 0, 37, 37), [](auto& s) {
    s.pct_start = 0.25;
    s.div_factor = 10.0;
    s.final_div_factor = 100.0;
  });
  add(make("inverse_sqrt", 5e-4, 8, 100, 100), none);
  add(make("inverse_sqrt", 1e-3, 1, 30, 30), none);
  return out;
}

class LrScheduleParity : public CliTest {};

TEST_F(LrScheduleParity, EveryScheduleGivesTorchsLearningRates) {
  if (!torch_available()) GTEST_SKIP() << torch_missing_message("lr schedule parity");
  const auto all = cases();
  json in = json::array();
  for (const auto& c : all)
    in.push_back({{"kind", core::lr_schedule_name(c.s.kind)},
                  {"base_lr", c.s.base_lr},
                  {"min_lr", c.s.min_lr},
                  {"warmup_steps", c.s.warmup_steps},
                  {"total_steps", c.s.total_steps},
                  {"step_size", c.s.step_size},
                  {"gamma", c.s.gamma},
                  {"milestones", c.s.milestones},
                  {"pct_start", c.s.pct_start},
                  {"div_factor", c.s.div_factor},
                  {"final_div_factor", c.s.final_div_factor},
                  {"n", c.n}});
  std::ofstream(dir_ / "cases.json") << in.dump();
  const json r = run_torch_script(dir_, "lr_schedule_reference.py", (dir_ / "cases.json").string());
  ASSERT_TRUE(r.is_object() && r.contains("lrs")) << "the reference printed no JSON";
  ASSERT_EQ(r["lrs"].size(), all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto& c = all[i];
    const auto& theirs = r["lrs"][i];
    ASSERT_EQ(theirs.size(), static_cast<std::size_t>(c.n));
    double worst = 0.0;
    for (std::int64_t k = 0; k < c.n; ++k) {
      const double t = theirs[static_cast<std::size_t>(k)].get<double>(), ours = c.s.lr_at(k);
      const double rel = std::fabs(ours - t) / std::fabs(t);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 1e-12) << core::lr_schedule_name(c.s.kind) << " (case " << i << ", warmup "
                            << c.s.warmup_steps << ") step " << k << ": ours " << ours
                            << ", torch's " << t;
    }
    char text[32];
    std::snprintf(text, sizeof text, "%.3g", worst);
    RecordProperty("case_" + std::to_string(i) + "_" + core::lr_schedule_name(c.s.kind), text);
  }
}

}  // namespace
}  // namespace mixtrain::test

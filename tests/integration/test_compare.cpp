// Integration: `mixtrain compare` on two real quickstart runs trained by the executable.
#include <map>

#include "cli_test_support.h"

namespace {

using namespace mixtrain::test;
using CompareCli = CliTest;

TEST_F(CompareCli, ComparesAnAdamwAndAnSgdRun) {
  const auto a = dir_ / "adamw", b = dir_ / "sgd";
  auto ra = run("train " + quickstart() + " --set run.steps=40 --run-dir " + a.string());
  ASSERT_EQ(ra.exit_code, 0) << ra.err;
  auto rb = run("train " + quickstart() +
                " --set run.steps=40 --set optimizer.type=sgd --set optimizer.lr=0.05 --run-dir " +
                b.string());
  ASSERT_EQ(rb.exit_code, 0) << rb.err;

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
  // Both runs log steps 25 and 40 (log_every = 25 plus the last step), and they differ.
  EXPECT_GE(j["runs"][1]["common_steps"].get<int>(), 1);
  EXPECT_GT(j["runs"][1]["max_rel_loss_gap"].get<double>(), 0.0);
  EXPECT_EQ(j["runs"][1]["samples_per_s_ratio"].is_number(), true);

  // --out puts the files elsewhere and leaves the run folders alone.
  auto out = dir_ / "report";
  auto r2 = run("compare " + b.string() + " " + a.string() + " --out " + out.string());
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_EQ(json::parse(slurp(out / "compare.json"))["baseline"], "sgd");
  EXPECT_FALSE(fs::exists(b / "compare.json"));
}

TEST_F(CompareCli, AMissingFolderExitsTwoNamingIt) {
  auto r = run("compare " + (dir_ / "no-such-run").string());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("no-such-run"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HINT"), std::string::npos) << r.err;
}

TEST_F(CompareCli, NoFolderAtAllIsAUsageError) {
  auto r = run("compare");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
}

}  // namespace

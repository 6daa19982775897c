// A section that selects a component ([data] source, [optimizer] type, [model] preset) reads only
// the selected component's table: what the selection leaves unread is said (key, location and the
// selector), and no hint leads into such a table. Each case follows the hint it tests literally.
#include "cli_test_support.h"
#include "npy_test_support.h"

namespace mixtrain::test {
namespace {

using SelectionHints = CliTest;

// A key of an unselected component's table does nothing: check names it, where it was given and
// the selector that leaves it unread, and says the config has warnings.
TEST_F(SelectionHints, AKeyOfAnUnselectedTableIsReportedWithItsSelector) {
  auto r = run("check " + quickstart() + " --skip-rehearsal --set data.npy.features=x.npy");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "data.npy.features (--set data.npy.features=x.npy) is not read: "
                  "data.source = \"synthetic\" at " +
                      quickstart() + ":"))
      << r.err;
  EXPECT_TRUE(has(r.err, "[data.npy] is read only under data.source = \"npy\"; ignored")) << r.err;
  EXPECT_TRUE(has(r.out, "# config OK (with warnings)")) << r.out;
  // The same for a plugin-backed section, written in a file.
  write_file("opt.toml", "[optimizer.sgd]\nmomentum = 0.5\n");
  r = run("check " + quickstart() + " --skip-rehearsal --merge opt.toml", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "optimizer.sgd.momentum (opt.toml:2:12) is not read: optimizer.type = "
                  "\"adamw\""))
      << r.err;
  // Without one, the shipped config has nothing unread.
  r = run("check " + quickstart() + " --skip-rehearsal");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "is not read")) << r.err;
  EXPECT_TRUE(has(r.out, "# config OK\n")) << r.out;
}

// An unknown key of the selected source whose name only unselected sources take is not sent to
// their tables ("did you mean data.npy.labels", where it would be ignored): the hint names the
// selector that reads them.
TEST_F(SelectionHints, DidYouMeanNeverLeadsIntoAnUnselectedTable) {
  auto r = run("check " + quickstart() + " --skip-rehearsal --set data.synthetic.labels=y.npy");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "'data.synthetic.labels': unknown key")) << r.err;
  EXPECT_FALSE(has(r.err, "did you mean data.")) << r.err;
  EXPECT_TRUE(has(r.err,
                  "(read only under data.source = \"npy\"; this config selects "
                  "\"synthetic\")"))
      << r.err;
  // A key of the selected component's table is still offered where it belongs.
  r = run("check " + quickstart() + " --skip-rehearsal --set run.lr=0.1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "did you mean optimizer.adamw.lr")) << r.err;
  // momentum is sgd's only: named with the selector, not offered as optimizer.sgd.momentum.
  r = run("check " + quickstart() + " --skip-rehearsal --set run.momentum=0.5");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_FALSE(has(r.err, "did you mean optimizer.sgd.momentum")) << r.err;
  EXPECT_TRUE(has(r.err, "[optimizer.sgd] (read only under optimizer.type = \"sgd\"")) << r.err;
}

// A flat key of another source: the hint's first remedy selects the source that reads it, and
// following it literally trains on the user's files.
TEST_F(SelectionHints, AFlatKeyOfAnotherSourceSuggestsSelectingIt) {
  std::vector<float> x(400 * 8);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.1f;
  std::vector<std::int64_t> y(400);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int64_t>(i % 10);
  write_npy(dir_ / "x.npy", "<f4", {400, 8}, x);
  write_npy(dir_ / "y.npy", "<i8", {400}, y);
  const std::string base = "check " + quickstart() + " --skip-rehearsal --set data.features=x.npy";
  auto r = run(base + " --set data.labels=y.npy", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "not of the selected data source 'synthetic' (data.source = "
                  "\"synthetic\" at " +
                      quickstart() + ":"))
      << r.err;
  EXPECT_TRUE(has(r.err,
                  "to use it, select the data source that reads it: data.source = "
                  "\"npy\" or \"idx\" (`--set data.source=npy`)"))
      << r.err;
  r = run(base + " --set data.labels=y.npy --set data.source=npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "# data: 360 training rows, 40 held-out rows, 8 features, 10 classes"))
      << r.out;
}

// A misspelt selector is the error, at its own line, with the name it meant: not a flat key of
// the source it meant, refused against the default selection.
TEST_F(SelectionHints, AMisspeltSelectorIsReportedAtItsOwnLine) {
  write_file("typo.toml",
             "[data]\n"                // 1
             "sourc = \"text\"\n"      // 2
             "block_size = 16\n"       // 3
             "[data.text]\n"           // 4
             "path = \"typo.toml\"\n"  // 5
             "[optimizer]\n"           // 6
             "typ = \"sgd\"\n"         // 7
             "momentum = 0.9\n");      // 8
  auto r = run("check typo.toml --skip-rehearsal", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "typo.toml:2:1: 'data.sourc': unknown key")) << r.err;
  EXPECT_TRUE(has(r.err, "did you mean 'source'?")) << r.err;
  EXPECT_TRUE(has(r.err, "typo.toml:7:1: 'optimizer.typ': unknown key")) << r.err;
  EXPECT_TRUE(has(r.err, "did you mean 'type'?")) << r.err;
  EXPECT_FALSE(has(r.err, "block_size")) << r.err;
  EXPECT_FALSE(has(r.err, "'optimizer.momentum'")) << r.err;
}

// The other preset's table under a preset builds nothing: said, naming both.
TEST_F(SelectionHints, AnotherPresetsTableIsReportedAsIgnored) {
  write_file("tiny.txt", std::string(4000, 'a'));
  const auto r = run("check " + config("gpt-tiny-fp32.toml") +
                         " --skip-rehearsal --set data.text.path=tiny.txt --set "
                         "model.gpt.n_layer=1 --set data.block_size=16 --set "
                         "model.resnet.classes=5",
                     dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "[model.resnet] (--set model.resnet.classes=5) is ignored: [model] "
                  "preset = \"gpt\""))
      << r.err;
}

}  // namespace
}  // namespace mixtrain::test

// The flags a resume's warning offers to keep the checkpoint's values (train/restore_flags.h):
// each one, as the shell hands it to --set, reads back as the old value.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mixtrain/core/config/config.h"
#include "train/restore_flags.h"

namespace mixtrain::core {
namespace {

TEST(RestoreFlags, EachChangeGivesTheSetOfItsOldValue) {
  EXPECT_EQ(restore_flags({"optimizer.adamw.beta1 = 0.9 -> 0.5", "optimizer.warmup_steps = 20 -> 5",
                           "model.label_smoothing = 0.0 -> 0.1"}),
            "--set optimizer.adamw.beta1=0.9 --set optimizer.warmup_steps=20 "
            "--set model.label_smoothing=0.0");
  // A layer of [[model.layers]] as --set addresses it; a plain name needs no quotes.
  EXPECT_EQ(restore_flags({"model.layers[1].type = \"relu\" -> \"gelu\""}),
            "--set model.layers.1.type=relu");
  // A string TOML would read as something else keeps its quotes, and the shell's.
  EXPECT_EQ(restore_flags({"data.path = \"true\" -> \"x\""}), "--set 'data.path=\"true\"'");
  EXPECT_EQ(restore_flags({"data.path = \"a b\" -> \"x\""}), "--set 'data.path=\"a b\"'");
  EXPECT_EQ(restore_flags({"optimizer.milestones = [8, 4] -> [2]"}),
            "--set 'optimizer.milestones=[8, 4]'");
  // What the run did not have cannot be set back; nor can a line that is no change.
  EXPECT_EQ(restore_flags({"precision.override[0].layers = (none) -> \"head\"", "training rows"}),
            "");
}

// What --set makes of a flag's value (the shell's quotes taken off as the shell would).
TEST(RestoreFlags, SetReadsEachFlagBackAsTheOldValue) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.activation = \"relu\" -> \"gelu\"", "relu"},
      {"model.activation = \"true\" -> \"gelu\"", "true"},
      {"model.activation = \"a b\" -> \"gelu\"", "a b"},
      {"model.activation = \"1.5\" -> \"gelu\"", "1.5"}};
  for (const auto& [change, want] : cases) {
    std::string flag = restore_flags({change});
    ASSERT_EQ(flag.rfind("--set ", 0), 0u) << flag;
    flag = flag.substr(6);
    if (flag.front() == '\'') flag = flag.substr(1, flag.size() - 2);
    const auto config = Config::from_string("[model]\n", "test", {flag});
    const auto options = config.table_options("model");
    ASSERT_EQ(options.size(), 1u) << change;
    EXPECT_EQ(options[0].value, sdk::OptionValue(want)) << change;
  }
}

}  // namespace
}  // namespace mixtrain::core

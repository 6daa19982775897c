// Key-by-key differences of two resolved configs (config/resolved_values.h): what an inference
// command names when a checkpoint's run had another model.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "config/resolved_values.h"

namespace mixtrain::core {
namespace {

bool any_model_key(std::string_view key) {
  return key.starts_with("model.");
}

TEST(ChangedValues, NamesEachDifferingKeyOfTheWantedOnesInOrder) {
  const std::string a = "# from a.toml\n[run]\nseed = 1\n\n[model.gpt]\nn_head = 4\nn_layer = 2\n";
  const std::string b = "# from b.toml\n[run]\nseed = 2\n[model.gpt]\nn_head = 2\nn_layer = 2\n";
  EXPECT_EQ(changed_values(a, b, any_model_key),
            (std::vector<std::string>{"model.gpt.n_head = 4 -> 2"}));
  EXPECT_TRUE(changed_values(a, a, any_model_key).empty());
  // run.seed differs, but is not wanted.
  EXPECT_TRUE(
      changed_values(a, b, [](std::string_view k) { return k == "model.gpt.n_layer"; }).empty());
}

TEST(ChangedValues, AKeyOnOneSideOnlyIsNamedWithNone) {
  const std::string a =
      "[[model.layers]]\ntype = \"linear\"\nout = 8\n[[model.layers]]\ntype = \"relu\"\n";
  const std::string b = "[[model.layers]]\ntype = \"linear\"\nout = 8\n";
  EXPECT_EQ(changed_values(a, b, any_model_key),
            (std::vector<std::string>{"model.layers[1].type = \"relu\" -> (none)"}));
  EXPECT_EQ(changed_values(b, a, any_model_key),
            (std::vector<std::string>{"model.layers[1].type = (none) -> \"relu\""}));
  // A key one side was written without (it did not exist then) is no change when asked so.
  EXPECT_TRUE(changed_values(a, b, any_model_key, /*one_sided=*/false).empty());
}

}  // namespace
}  // namespace mixtrain::core

// plugins/scalers/README.md documents every option exactly as the schemas declare it.
#include <gtest/gtest.h>

#include "dynamic_loss_scaler.h"
#include "no_loss_scaler.h"
#include "plugin_test_support.h"
#include "static_loss_scaler.h"

namespace mixtrain::scalers {
namespace {

const std::string kReadme = std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/plugins/scalers/README.md";

void expect_documented(const std::string& component, const sdk::OptionSchema& schema) {
  std::vector<std::string> expected;
  for (const auto& spec : schema) expected.push_back(test::readme_row(spec));
  EXPECT_EQ(test::readme_rows(kReadme, component), expected)
      << "update the `" << component << "` table in " << kReadme;
  EXPECT_NE(test::read_text(kReadme).find("### `" + component + "`"), std::string::npos);
}

TEST(scalers_readme, OptionTablesMatchSchemas) {
  expect_documented("none", NoLossScaler::option_schema());
  expect_documented("static", StaticLossScaler::option_schema());
  expect_documented("dynamic", DynamicLossScaler::option_schema());
}

}  // namespace
}  // namespace mixtrain::scalers

// formats_by_extension (checkpoint/format_set.h): which of the loaded checkpoint formats reads a
// file of an extension two of them claim, and when the clash is the configured format's error.
#include <gtest/gtest.h>

#include "mixtrain/core/checkpoint/format_set.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

class Claims final : public sdk::CheckpointFormat {
 public:
  explicit Claims(std::string ext) : ext_(std::move(ext)) {}
  std::string file_extension() const override { return ext_; }
  void write(const std::filesystem::path&, const sdk::TrainingState&) const override {}
  sdk::TrainingState read(const std::filesystem::path&) const override { return {}; }

 private:
  std::string ext_;
};

NamedFormat format(const std::string& name, const std::string& ext, bool builtin) {
  return {name, "plugin " + name, builtin, std::make_shared<Claims>(ext)};
}

TEST(FormatSet, AConfiguredPluginFormatMayNotShareAnotherFormatsExtension) {
  std::vector<std::string> warnings;
  try {
    formats_by_extension(format("tbck", ".mxt", false), {format("native", ".mxt", true)},
                         "checkpoint.format", warnings);
    FAIL() << "the clash was accepted";
  } catch (const sdk::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint format 'native'"), std::string::npos);
    EXPECT_NE(std::string(e.hint()).find("checkpoint format 'tbck'"), std::string::npos);
  }
  EXPECT_THROW(formats_by_extension(format("a", ".x", false), {format("b", ".x", false)},
                                    "checkpoint.format", warnings),
               sdk::PluginError);
}

TEST(FormatSet, OtherwiseTheFirstKeepsTheExtensionAndEachLaterOneIsWarnedOf) {
  std::vector<std::string> warnings;
  // A built-in configured format keeps its own; a plugin's clash with it is the plugin's.
  auto kept = formats_by_extension(
      format("native", ".mxt", true),
      {format("safetensors", ".safetensors", true), format("tbck", ".mxt", false),
       format("one", ".x", false), format("two", ".x", false)},
      "checkpoint.format", warnings);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].name, "native");
  EXPECT_EQ(kept[1].name, "safetensors");
  EXPECT_EQ(kept[2].name, "one");
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("'tbck'"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("'native'"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("'two'"), std::string::npos) << warnings[1];
  EXPECT_NE(warnings[1].find("'one'"), std::string::npos) << warnings[1];
}

}  // namespace
}  // namespace mixtrain::core

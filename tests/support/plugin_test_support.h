// Test helpers shared by the plugin suites: a log sink that records lines, Options built from raw
// key/value pairs as the host would build them from test.toml, and the README table rows a
// schema must appear as.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/sdk/logging.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain::test {

class CapturingSink final : public sdk::LogSink {
 public:
  struct Line {
    sdk::LogLevel level;
    std::string message;
  };
  void write(sdk::LogLevel level, std::string_view, std::string_view message) override {
    lines.push_back({level, std::string(message)});
  }
  bool enabled(sdk::LogLevel) const override { return true; }

  bool contains(sdk::LogLevel level, const std::string& fragment) const {
    for (const auto& l : lines)
      if (l.level == level && l.message.find(fragment) != std::string::npos) return true;
    return false;
  }
  std::vector<Line> lines;
};

// Raw options on consecutive lines of test.toml, starting at line 4 below the [table] header at
// line 3, so error messages can be checked for "test.toml:L:C".
inline std::vector<sdk::RawOption> raw_options(
    std::vector<std::pair<std::string, sdk::OptionValue>> values) {
  std::vector<sdk::RawOption> raw;
  std::uint32_t line = 4;
  for (auto& [key, value] : values)
    raw.push_back({key, std::move(value), sdk::SourceLocation{"test.toml", line++, 1}});
  return raw;
}

inline sdk::Options resolve(const std::string& table, const sdk::OptionSchema& schema,
                            std::vector<std::pair<std::string, sdk::OptionValue>> values) {
  return sdk::Options::resolve(table, schema, raw_options(std::move(values)),
                               sdk::SourceLocation{"test.toml", 3, 1});
}

inline sdk::PluginContext context(sdk::LogSink* sink, const std::string& plugin,
                                  const std::string& kind, const std::string& name) {
  return {sdk::Logger(sink, kind + "." + name), plugin, name};
}

// "| `name` | type | `default` | range | doc |", the row format of the plugin READMEs.
inline std::string readme_row(const sdk::OptionSpec& spec) {
  std::string type(sdk::option_type_name(spec.type));
  type = type.substr(type.find(' ') + 1);  // "a number" -> "number"
  const auto range = spec.range_text();
  return "| `" + spec.name + "` | " + type + " | `" +
         sdk::option_value_to_string(spec.default_value) + "` | " + (range.empty() ? "-" : range) +
         " | " + spec.doc + " |";
}

// The option rows ("| `...") of the README section "### `component`", in order.
inline std::vector<std::string> readme_rows(const std::string& readme_path,
                                            const std::string& component) {
  std::ifstream in(readme_path);
  std::vector<std::string> rows;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.rfind("### ", 0) == 0)
      inside = line == "### `" + component + "`";
    else if (inside && line.rfind("| `", 0) == 0)
      rows.push_back(line);
  }
  return rows;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `make`, expects a ConfigError and returns it for inspection.
inline sdk::ConfigError expect_config_error(const std::function<void()>& make) {
  try {
    make();
  } catch (const sdk::ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return sdk::ConfigError({}, "", "");
}

inline bool has(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

// Builds a component of type C from raw option values, as the host would from `table`.
template <class C>
void construct(const std::string& table, std::vector<std::pair<std::string, sdk::OptionValue>> values) {
  CapturingSink sink;
  C component(resolve(table, C::option_schema(), std::move(values)),
              context(&sink, "plugin", table, "test"));
}

}  // namespace mixtrain::test

#include "section_description.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace mixtrain::cli {

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// "scaler.dynamic" -> {"scaler", "dynamic"}; {name, ""} without a dot.
std::pair<std::string, std::string> split_last(const std::string& name) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return {name, ""};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

// The section whose selector picks `section` ([scaler] for scaler.dynamic), if any.
const core::ConfigSection* selecting_section(const std::vector<core::ConfigSection>& all,
                                             const core::ConfigSection& section) {
  const auto [parent, child] = split_last(section.name);
  for (const auto& s : all)
    if (s.name == parent && !s.selector.empty() &&
        std::find(s.choices.begin(), s.choices.end(), child) != s.choices.end())
      return &s;
  return nullptr;
}

}  // namespace

namespace {

// A RANGE wider than this wraps onto lines of its own under its column, between the items of a
// list (after ", "): a long one_of list (a plugin's fault modes, a backend's ops) would otherwise
// pad every row of the table to its width, hundreds of characters.
constexpr std::size_t kRangeWidth = 40;

std::vector<std::string> wrapped_range(const std::string& text) {
  std::vector<std::string> lines;
  std::string line;
  for (std::size_t at = 0; at < text.size();) {
    const auto comma = text.find(", ", at);
    const std::size_t end = comma == std::string::npos ? text.size() : comma + 1;  // keeps ','
    const std::string piece = text.substr(at, end - at);
    at = comma == std::string::npos ? text.size() : comma + 2;
    if (!line.empty() && line.size() + 1 + piece.size() > kRangeWidth) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + piece;
  }
  if (!line.empty() || lines.empty()) lines.push_back(line);
  return lines;
}

}  // namespace

void print_section_keys(const std::vector<core::SectionKey>& keys) {
  if (keys.empty()) {
    std::printf("no options\n");
    return;
  }
  std::vector<core::SectionKey> rows{{"OPTION", "TYPE", "DEFAULT", "RANGE", "DOC"}};
  rows.insert(rows.end(), keys.begin(), keys.end());
  std::size_t w[4] = {};
  std::vector<std::vector<std::string>> ranges;
  for (const auto& r : rows) {
    w[0] = std::max(w[0], r.name.size());
    w[1] = std::max(w[1], r.type.size());
    w[2] = std::max(w[2], r.default_text.size());
    ranges.push_back(wrapped_range(r.range));
    for (const auto& line : ranges.back()) w[3] = std::max(w[3], line.size());
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    std::printf("  %-*s  %-*s  %-*s  %-*s  %s\n", static_cast<int>(w[0]), r.name.c_str(),
                static_cast<int>(w[1]), r.type.c_str(), static_cast<int>(w[2]),
                r.default_text.c_str(), static_cast<int>(w[3]), ranges[i][0].c_str(),
                r.doc.c_str());
    for (std::size_t l = 1; l < ranges[i].size(); ++l)
      std::printf("  %-*s  %-*s  %-*s  %s\n", static_cast<int>(w[0]), "", static_cast<int>(w[1]),
                  "", static_cast<int>(w[2]), "", ranges[i][l].c_str());
  }
}

void print_section(const std::vector<core::ConfigSection>& all,
                   const core::ConfigSection& section) {
  const bool layer = section.name.rfind("layer.", 0) == 0;
  if (layer)
    std::printf("%s: %s\n", section.name.c_str(), section.summary.c_str());
  else
    std::printf("%s%s%s: %s\n", section.array_of_tables ? "[[" : "[", section.name.c_str(),
                section.array_of_tables ? "]]" : "]", section.summary.c_str());
  std::printf("defined by: %s\n", section.origin.c_str());
  if (layer) {
    const auto type = split_last(section.name).second;
    std::printf("written as: { type = \"%s\", name = \"...\", ... } in [model] layers or nodes\n",
                type.c_str());
  }
  if (const auto* parent = selecting_section(all, section)) {
    const auto name = split_last(section.name).second;
    std::printf("options go in [%s] (or flat in [%s] while it is selected: %s = \"%s\")\n",
                section.name.c_str(), parent->name.c_str(), parent->selector.c_str(), name.c_str());
  }
  if (!section.selector.empty()) {
    std::vector<std::string> choices;
    for (const auto& c : section.choices)
      choices.push_back(c + (c == section.selector_default ? " (default)" : ""));
    std::printf("%s selects one of: %s; its options go in [%s.NAME] (mixtrain describe %s.NAME)\n",
                section.selector.c_str(), join(choices).c_str(), section.name.c_str(),
                section.name.c_str());
  }
  print_section_keys(section.keys);
}

void print_section_index(const std::vector<core::ConfigSection>& sections) {
  std::printf("config sections (mixtrain describe SECTION prints the keys of one):\n");
  std::size_t width = 0;
  std::vector<std::string> layers;
  for (const auto& s : sections) {
    if (s.name.rfind("layer.", 0) == 0)
      layers.push_back(split_last(s.name).second);
    else
      width = std::max(width, s.name.size());
  }
  for (const auto& s : sections) {
    if (s.name.rfind("layer.", 0) == 0) continue;
    const auto* parent = selecting_section(sections, s);
    std::string line = s.summary;
    if (parent != nullptr)
      line = "[" + parent->name + "] " + parent->selector + " = \"" + split_last(s.name).second +
             "\": " + line;
    std::printf("  %-*s  %s\n", static_cast<int>(width), s.name.c_str(), line.c_str());
  }
  std::printf("layers of [model] layers/nodes (mixtrain describe layer.TYPE):\n  %s\n",
              join(layers).c_str());
}

}  // namespace mixtrain::cli

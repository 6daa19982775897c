#include "section_description.h"

#include <algorithm>
#include <cstdio>
#include <string>

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

void print_section_keys(const std::vector<core::SectionKey>& keys) {
  if (keys.empty()) {
    std::printf("no options\n");
    return;
  }
  std::vector<core::SectionKey> rows{{"OPTION", "TYPE", "DEFAULT", "RANGE", "DOC"}};
  rows.insert(rows.end(), keys.begin(), keys.end());
  std::size_t w[4] = {};
  for (const auto& r : rows) {
    w[0] = std::max(w[0], r.name.size());
    w[1] = std::max(w[1], r.type.size());
    w[2] = std::max(w[2], r.default_text.size());
    w[3] = std::max(w[3], r.range.size());
  }
  for (const auto& r : rows)
    std::printf("  %-*s  %-*s  %-*s  %-*s  %s\n", static_cast<int>(w[0]), r.name.c_str(),
                static_cast<int>(w[1]), r.type.c_str(), static_cast<int>(w[2]),
                r.default_text.c_str(), static_cast<int>(w[3]), r.range.c_str(), r.doc.c_str());
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

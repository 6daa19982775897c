#include "config/resolved_values.h"

#include <map>
#include <sstream>

namespace mixtrain::core {

std::vector<ResolvedValue> resolved_values(const std::string& text) {
  std::vector<ResolvedValue> out;
  std::map<std::string, int> array_entries;  // per array-of-tables name: entries seen
  std::istringstream in(text);
  std::string line, table;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    ResolvedValue l{"", line, number};
    if (line[first] == '[') {
      const bool array = line.compare(first, 2, "[[") == 0;
      const auto open = line.find_first_not_of('[', first);
      const auto close = line.find(']', open);
      table = line.substr(open, close == std::string::npos ? std::string::npos : close - open);
      if (array) table += "[" + std::to_string(array_entries[table]++) + "]";
    } else if (const auto eq = line.find('='); eq != std::string::npos && first != eq) {
      auto key = line.substr(first, eq - first);
      while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
      l.key = table.empty() ? key : table + "." + key;
    }
    out.push_back(std::move(l));
  }
  return out;
}

std::string value_text(const std::string& line) {
  const auto eq = line.find('=');
  auto v = eq == std::string::npos ? line : line.substr(eq + 1);
  const auto first = v.find_first_not_of(" \t");
  return first == std::string::npos ? std::string() : v.substr(first);
}

std::vector<std::string> changed_values(const std::string& a, const std::string& b,
                                        const std::function<bool(std::string_view)>& wanted,
                                        bool one_sided) {
  std::map<std::string, std::string> in_b;
  std::vector<std::string> b_order;
  for (const auto& v : resolved_values(b))
    if (!v.key.empty() && wanted(v.key)) {
      in_b.emplace(v.key, value_text(v.text));
      b_order.push_back(v.key);
    }
  std::vector<std::string> out;
  std::map<std::string, bool> in_a;
  for (const auto& v : resolved_values(a)) {
    if (v.key.empty() || !wanted(v.key)) continue;
    in_a[v.key] = true;
    const auto it = in_b.find(v.key);
    const std::string was = value_text(v.text);
    if (it == in_b.end()) {
      if (one_sided) out.push_back(v.key + " = " + was + " -> (none)");
    } else if (it->second != was)
      out.push_back(v.key + " = " + was + " -> " + it->second);
  }
  if (one_sided)
    for (const auto& key : b_order)
      if (!in_a.count(key)) out.push_back(key + " = (none) -> " + in_b[key]);
  return out;
}

}  // namespace mixtrain::core

#include "console/short_list.h"

#include <algorithm>

namespace mixtrain::core {

std::string short_list(const std::vector<std::string>& items, std::size_t shown) {
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < shown; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > shown) out += " and " + std::to_string(items.size() - shown) + " more";
  return out;
}

std::string quoted_short_list(const std::vector<std::string>& items, std::size_t shown) {
  std::vector<std::string> quoted;
  quoted.reserve(std::min(items.size(), shown));
  for (std::size_t i = 0; i < items.size() && i < shown; ++i)
    quoted.push_back("'" + items[i] + "'");
  std::string out = short_list(quoted, shown);
  if (items.size() > shown) out += " and " + std::to_string(items.size() - shown) + " more";
  return out;
}

}  // namespace mixtrain::core

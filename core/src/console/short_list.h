// short_list: a list of names for one line of a message, which a model of many layers must not
// stretch to kilobytes. Internal to the core.
//
// Contract: the first `shown` items joined by ", ", then " and N more" for the N left out;
// empty for no items. Throws nothing but std::bad_alloc.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mixtrain::core {

std::string short_list(const std::vector<std::string>& items, std::size_t shown);
// The same with each item in single quotes: names a user wrote ('cat', 'dog' and 3 more).
std::string quoted_short_list(const std::vector<std::string>& items, std::size_t shown);

}  // namespace mixtrain::core

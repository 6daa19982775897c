// Config choices: a key whose value is one of a fixed set of names is read once, where the config
// is parsed, into an enum; past that edge the code compares enums, never strings.
//
// Contract
// - A ChoiceTable<E, N> lists each name with its enum value, in the order the docs and errors
//   list them. The schema's one_of takes choice_names(table), so the schema and the enum cannot
//   list different names.
// - parse_choice(o, key, table) reads the resolved string option `key` of `o` into E. A name not
//   in the table is sdk::ConfigError at the key's file:line:col, naming the choices (the error a
//   schema declared with choice_names() gives already; this one covers keys read beside a
//   schema, as each entry of run.metrics).
// - choice_name(value, table) is the name written back where text is wanted (resolved configs,
//   metrics, messages). A value missing from its table is std::logic_error.
#pragma once

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mixtrain/sdk/options.h"

namespace mixtrain::core {

template <class E, std::size_t N>
using ChoiceTable = std::array<std::pair<std::string_view, E>, N>;

template <class E, std::size_t N>
std::vector<std::string> choice_names(const ChoiceTable<E, N>& table) {
  std::vector<std::string> out;
  for (const auto& [name, value] : table) out.emplace_back(name);
  return out;
}

template <class E, std::size_t N>
std::string_view choice_name(E value, const ChoiceTable<E, N>& table) {
  for (const auto& [name, v] : table)
    if (v == value) return name;
  throw std::logic_error("choice_name: a value without a name in its table");
}

// The enum value named `name`, or nullptr.
template <class E, std::size_t N>
const E* find_choice(std::string_view name, const ChoiceTable<E, N>& table) {
  for (const auto& entry : table)
    if (entry.first == name) return &entry.second;
  return nullptr;
}

template <class E, std::size_t N>
E parse_choice(const sdk::Options& o, std::string_view key, const ChoiceTable<E, N>& table) {
  const std::string name = o.get_string(key);
  if (const E* value = find_choice(name, table)) return *value;
  const auto names = choice_names(table);
  const auto near = sdk::closest_match(name, names);
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  o.fail(key, "'" + name + "' is not a valid choice",
         (near.empty() ? "" : "did you mean '" + near + "'? ") + "one of: " + list);
}

}  // namespace mixtrain::core

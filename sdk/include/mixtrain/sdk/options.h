// Declared, typed plugin options.
//
// Contract: every component declares an `OptionSchema` — for each key its type, default, range or
// choices and a one-line doc. The host turns the component's TOML table into `RawOption`s (value +
// file:line:col) and calls `Options::resolve`, which raises `ConfigError` naming the location and
// key for a wrong type, a value out of range, a value not among the choices, a missing required
// key, or an unknown key (with a "did you mean"). A number is never NaN, and is finite unless the
// spec allows +inf (allow_infinity(), for "no ceiling"): a stray inf or 1e999 would otherwise
// reach the arithmetic. A factory then reads values with the typed getters; asking for a key the
// schema does not declare is a programming error (std::logic_error).
// Options are immutable and cheap to copy.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "mixtrain/sdk/error.h"

namespace mixtrain::sdk {

enum class OptionType { boolean, integer, number, string };
std::string_view option_type_name(OptionType t) noexcept;

// monostate means "no value" (a required option without default).
using OptionValue = std::variant<std::monostate, bool, std::int64_t, double, std::string>;
std::string option_value_to_string(const OptionValue& v);  // TOML spelling: true, 3, 0.5, "x"

struct OptionSpec {
  std::string name;
  OptionType type = OptionType::number;
  OptionValue default_value;  // monostate: required
  std::optional<double> min, max;
  bool min_exclusive = false;
  std::vector<std::string> choices;  // only for strings; empty = free text
  std::string doc;

  static OptionSpec boolean(std::string name, bool def, std::string doc);
  static OptionSpec integer(std::string name, std::int64_t def, std::string doc);
  static OptionSpec number(std::string name, double def, std::string doc);
  static OptionSpec string(std::string name, std::string def, std::string doc);
  static OptionSpec required(std::string name, OptionType type, std::string doc);

  OptionSpec& at_least(double v) { min = v; min_exclusive = false; return *this; }
  OptionSpec& greater_than(double v) { min = v; min_exclusive = true; return *this; }
  OptionSpec& at_most(double v) { max = v; return *this; }
  OptionSpec& one_of(std::vector<std::string> c) { choices = std::move(c); return *this; }
  // +inf becomes a valid value (the upper bound is infinity); -inf stays refused.
  OptionSpec& allow_infinity() { max = std::numeric_limits<double>::infinity(); return *this; }
  std::string range_text() const;  // "[0, 1]", "> 0", "one of: a, b", "" when unconstrained
};

using OptionSchema = std::vector<OptionSpec>;

struct RawOption {
  std::string key;
  OptionValue value;
  SourceLocation where;
};

class Options {
 public:
  Options() = default;

  // `table` is the dotted TOML path used in messages ("scaler"). Keys in `host_keys` (e.g.
  // "type") belong to the host and are neither validated nor reported as unknown.
  static Options resolve(std::string table, const OptionSchema& schema,
                         const std::vector<RawOption>& raw, SourceLocation table_where,
                         const std::vector<std::string>& host_keys = {"type"});

  bool get_bool(std::string_view key) const;
  std::int64_t get_int(std::string_view key) const;
  double get_double(std::string_view key) const;  // integers are widened
  std::string get_string(std::string_view key) const;
  bool was_set(std::string_view key) const;  // given in the config, not defaulted
  SourceLocation where(std::string_view key) const;

  // Raise a ConfigError about `key` at its location: for checks a schema cannot express
  // ("min_scale must not exceed max_scale").
  [[noreturn]] void fail(std::string_view key, const std::string& what,
                         const std::string& hint = {}) const;

  // Every declared option with its effective value, in schema order (for resolved configs).
  const std::vector<std::pair<std::string, OptionValue>>& effective() const { return values_; }
  const std::string& table() const { return table_; }

 private:
  const OptionValue& lookup(std::string_view key) const;
  std::string table_;
  std::vector<std::pair<std::string, OptionValue>> values_;
  std::map<std::string, SourceLocation, std::less<>> locations_;
  std::map<std::string, bool, std::less<>> set_;
  SourceLocation table_where_;
};

// The candidate a mistyped `word` most likely means, or empty: first a known alias (the name
// another tool gives it, e.g. learning_rate for lr), then the one candidate that `word` begins
// (fp16 for fp16-mixed), then the Levenshtein-closest within a small distance that leaves some
// of the word standing (lr is not dir).
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace mixtrain::sdk

#include "mixtrain/sdk/options.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace mixtrain::sdk {

std::string_view option_type_name(OptionType t) noexcept {
  switch (t) {
    case OptionType::boolean:
      return "a boolean";
    case OptionType::integer:
      return "an integer";
    case OptionType::number:
      return "a number";
    case OptionType::string:
      return "a string";
  }
  return "?";
}

namespace {

std::string format_double(double v) {
  char buf[64];
  // Whole numbers read as written ("10.0", not "1e+01") while every digit is exact.
  if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // Prefer the shortest representation that round-trips.
  for (int prec = 1; prec <= 17; ++prec) {
    char b2[64];
    std::snprintf(b2, sizeof b2, "%.*g", prec, v);
    if (std::strtod(b2, nullptr) == v) {
      std::string s = b2;
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it a TOML float
      return s;
    }
  }
  return buf;
}

std::string value_type_text(const OptionValue& v) {
  switch (v.index()) {
    case 1:
      return "a boolean";
    case 2:
      return "an integer";
    case 3:
      return "a number";
    case 4:
      return "a string";
    default:
      return "nothing";
  }
}

}  // namespace

std::string option_value_to_string(const OptionValue& v) {
  switch (v.index()) {
    case 1:
      return std::get<bool>(v) ? "true" : "false";
    case 2:
      return std::to_string(std::get<std::int64_t>(v));
    case 3:
      return format_double(std::get<double>(v));
    case 4: {
      std::string out = "\"";
      for (char c : std::get<std::string>(v)) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
          out += '\\';
          out += c;
        } else if (c == '\n') {
          out += "\\n";
        } else if (c == '\r') {
          out += "\\r";
        } else if (c == '\t') {
          out += "\\t";
        } else if (u < 0x20 || u == 0x7f) {
          // TOML basic strings forbid raw control characters; a resolved config must parse.
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", static_cast<unsigned>(u));
          out += buf;
        } else {
          out += c;
        }
      }
      return out + "\"";
    }
    default:
      return "<unset>";
  }
}

OptionSpec OptionSpec::boolean(std::string name, bool def, std::string doc) {
  return {std::move(name), OptionType::boolean, def, {}, {}, false, {}, std::move(doc)};
}
OptionSpec OptionSpec::integer(std::string name, std::int64_t def, std::string doc) {
  return {std::move(name), OptionType::integer, def, {}, {}, false, {}, std::move(doc)};
}
OptionSpec OptionSpec::number(std::string name, double def, std::string doc) {
  return {std::move(name), OptionType::number, def, {}, {}, false, {}, std::move(doc)};
}
OptionSpec OptionSpec::string(std::string name, std::string def, std::string doc) {
  return {std::move(name), OptionType::string, std::move(def), {}, {}, false, {}, std::move(doc)};
}
OptionSpec OptionSpec::required(std::string name, OptionType type, std::string doc) {
  return {std::move(name), type, std::monostate{}, {}, {}, false, {}, std::move(doc)};
}

std::string OptionSpec::range_text() const {
  if (!choices.empty()) {
    std::string s = "one of: ";
    // An empty choice ("none", as model.preset's) shows as "", not as nothing between commas.
    for (std::size_t i = 0; i < choices.size(); ++i)
      s += (i ? ", " : "") + (choices[i].empty() ? std::string("\"\"") : choices[i]);
    return s;
  }
  auto num = [&](double v) {
    // The cast is only defined for a finite bound inside int64's range.
    const bool as_integer =
        type == OptionType::integer && std::isfinite(v) && std::fabs(v) <= 9.2e18;
    return as_integer ? std::to_string(static_cast<std::int64_t>(v)) : format_double(v);
  };
  if (min && max) return (min_exclusive ? "(" : "[") + num(*min) + ", " + num(*max) + "]";
  if (min) return (min_exclusive ? "> " : ">= ") + num(*min);
  if (max) return "<= " + num(*max);
  return {};
}

Options Options::resolve(std::string table, const OptionSchema& schema,
                         const std::vector<RawOption>& raw, SourceLocation table_where,
                         const std::vector<std::string>& host_keys) {
  Options o;
  o.table_ = std::move(table);
  o.table_where_ = std::move(table_where);
  const std::string prefix = o.table_.empty() ? "" : o.table_ + ".";

  std::vector<std::string> known;
  for (const auto& s : schema) known.push_back(s.name);

  for (const auto& r : raw) {
    if (std::find(host_keys.begin(), host_keys.end(), r.key) != host_keys.end()) continue;
    if (std::find(known.begin(), known.end(), r.key) == known.end()) {
      std::string hint;
      auto near = closest_match(r.key, known);
      std::string list;
      for (std::size_t i = 0; i < known.size(); ++i) list += (i ? ", " : "") + known[i];
      if (!near.empty()) hint = "did you mean '" + near + "'? ";
      hint += known.empty() ? "this component takes no options" : "known keys: " + list;
      throw ConfigError(r.where, prefix + r.key, "unknown key", hint);
    }
  }

  for (const auto& spec : schema) {
    const RawOption* given = nullptr;
    for (const auto& r : raw)
      if (r.key == spec.name) given = &r;
    OptionValue v = spec.default_value;
    SourceLocation where = o.table_where_;
    if (given) {
      where = given->where;
      const std::string key = prefix + spec.name;
      const auto& gv = given->value;
      auto type_error = [&] {
        std::string hint = spec.doc.empty() ? "" : spec.name + ": " + spec.doc;
        auto rt = spec.range_text();
        if (!rt.empty()) hint += (hint.empty() ? "" : "; ") + std::string("allowed: ") + rt;
        return ConfigError(where, key,
                           "expected " + std::string(option_type_name(spec.type)) + ", got " +
                               value_type_text(gv) + " " + option_value_to_string(gv),
                           hint);
      };
      switch (spec.type) {
        case OptionType::boolean:
          if (!std::holds_alternative<bool>(gv)) throw type_error();
          v = gv;
          break;
        case OptionType::integer:
          if (!std::holds_alternative<std::int64_t>(gv)) throw type_error();
          v = gv;
          break;
        case OptionType::number:
          if (auto* i = std::get_if<std::int64_t>(&gv))
            v = static_cast<double>(*i);
          else if (std::holds_alternative<double>(gv))
            v = gv;
          else
            throw type_error();
          break;
        case OptionType::string:
          if (!std::holds_alternative<std::string>(gv)) throw type_error();
          v = gv;
          break;
      }
      // Range and choices.
      if (spec.type == OptionType::integer || spec.type == OptionType::number) {
        double x = spec.type == OptionType::integer ? static_cast<double>(std::get<std::int64_t>(v))
                                                    : std::get<double>(v);
        // Infinity passes only a bound that is itself infinite (allow_infinity()).
        const bool inf_allowed =
            x > 0 ? spec.max && std::isinf(*spec.max) : spec.min && std::isinf(*spec.min);
        bool bad = std::isnan(x) || (std::isinf(x) && !inf_allowed) ||
                   (spec.min && (spec.min_exclusive ? x <= *spec.min : x < *spec.min)) ||
                   (spec.max && x > *spec.max);
        if (bad) {
          std::string allowed = spec.range_text();  // empty when only NaN or inf made it bad
          if (!std::isfinite(x))
            allowed = std::string(spec.max && std::isinf(*spec.max)
                                      ? "a number or inf (not nan)"
                                      : "a finite number (not nan or inf)") +
                      (allowed.empty() ? "" : ", " + allowed);
          throw ConfigError(
              where, key, "value " + option_value_to_string(v) + " is out of range",
              "allowed: " + allowed + (spec.doc.empty() ? "" : " (" + spec.doc + ")"));
        }
      }
      if (spec.type == OptionType::string && !spec.choices.empty()) {
        const auto& s = std::get<std::string>(v);
        if (std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end()) {
          auto near = closest_match(s, spec.choices);
          throw ConfigError(
              where, key, "'" + s + "' is not a valid choice",
              (near.empty() ? "" : "did you mean '" + near + "'? ") + spec.range_text());
        }
      }
    } else if (std::holds_alternative<std::monostate>(v)) {
      throw ConfigError(o.table_where_, prefix + spec.name, "required key is missing",
                        "add " + spec.name + " = <" + std::string(option_type_name(spec.type)) +
                            "> to [" + o.table_ + "]" +
                            (spec.doc.empty() ? "" : " (" + spec.doc + ")"));
    }
    o.values_.emplace_back(spec.name, std::move(v));
    o.locations_[spec.name] = where;
    o.set_[spec.name] = given != nullptr;
  }
  return o;
}

const OptionValue& Options::lookup(std::string_view key) const {
  for (const auto& [k, v] : values_)
    if (k == key) return v;
  throw std::logic_error("option '" + std::string(key) + "' is not declared in the schema of [" +
                         table_ + "]");
}

bool Options::get_bool(std::string_view key) const {
  const auto& v = lookup(key);
  if (auto* p = std::get_if<bool>(&v)) return *p;
  throw std::logic_error("option '" + std::string(key) + "' is not a boolean");
}
std::int64_t Options::get_int(std::string_view key) const {
  const auto& v = lookup(key);
  if (auto* p = std::get_if<std::int64_t>(&v)) return *p;
  throw std::logic_error("option '" + std::string(key) + "' is not an integer");
}
double Options::get_double(std::string_view key) const {
  const auto& v = lookup(key);
  if (auto* p = std::get_if<double>(&v)) return *p;
  if (auto* p = std::get_if<std::int64_t>(&v)) return static_cast<double>(*p);
  throw std::logic_error("option '" + std::string(key) + "' is not a number");
}
std::string Options::get_string(std::string_view key) const {
  const auto& v = lookup(key);
  if (auto* p = std::get_if<std::string>(&v)) return *p;
  throw std::logic_error("option '" + std::string(key) + "' is not a string");
}
bool Options::was_set(std::string_view key) const {
  lookup(key);
  auto it = set_.find(key);
  return it != set_.end() && it->second;
}
SourceLocation Options::where(std::string_view key) const {
  auto it = locations_.find(key);
  return it == locations_.end() ? table_where_ : it->second;
}
void Options::fail(std::string_view key, const std::string& what, const std::string& hint) const {
  throw ConfigError(where(key), (table_.empty() ? "" : table_ + ".") + std::string(key), what,
                    hint);
}

}  // namespace mixtrain::sdk

// A run's components by range of steps (runs/component_history.h) and its JSON form
// (component_history_json.h).
#include "mixtrain/core/runs/component_history.h"

#include <utility>

#include "runs/component_history_json.h"

namespace mixtrain::core {

void extend_history(ComponentHistory& history, ComponentSegment next) {
  if (!history.empty() && history.back().same_components(next)) return;
  history.push_back(std::move(next));
}

namespace {

std::string part_of(const ComponentSegment& s, HistoryPart part) {
  switch (part) {
    case HistoryPart::policy:
      return s.resolved_policy.empty() || s.resolved_policy == s.policy
                 ? s.policy
                 : s.policy + "\u2192" + s.resolved_policy;
    case HistoryPart::scaler:
      return s.scaler;
    case HistoryPart::optimizer:
      return s.optimizer;
  }
  return {};
}

}  // namespace

std::string history_text(const ComponentHistory& history, HistoryPart part) {
  std::string text;
  std::string last;
  for (const auto& s : history) {
    const std::string now = part_of(s, part);
    if (text.empty()) {
      text = now;
    } else if (now != last) {
      text += "\u2192" + now + "@" + std::to_string(s.first_step);
    }
    last = now;
  }
  return text;
}

nlohmann::json component_history_to_json(const ComponentHistory& history) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : history) {
    nlohmann::json j = {{"first_step", s.first_step},
                        {"policy", s.policy},
                        {"scaler", s.scaler},
                        {"optimizer", s.optimizer}};
    if (!s.resolved_policy.empty()) j["resolved_policy"] = s.resolved_policy;
    out.push_back(std::move(j));
  }
  return out;
}

std::optional<ComponentHistory> component_history_from_json(const nlohmann::json& j) {
  if (!j.is_array() || j.empty()) return std::nullopt;
  ComponentHistory out;
  for (const auto& e : j) {
    if (!e.is_object() || !e.contains("first_step") || !e["first_step"].is_number_integer())
      return std::nullopt;
    ComponentSegment s;
    s.first_step = e["first_step"].get<std::int64_t>();
    if (s.first_step < 1 || (!out.empty() && s.first_step <= out.back().first_step))
      return std::nullopt;
    for (auto [key, field] : {std::pair{"policy", &s.policy}, std::pair{"scaler", &s.scaler},
                              std::pair{"optimizer", &s.optimizer}}) {
      if (!e.contains(key) || !e[key].is_string()) return std::nullopt;
      *field = e[key].get<std::string>();
    }
    if (e.contains("resolved_policy") && e["resolved_policy"].is_string())
      s.resolved_policy = e["resolved_policy"].get<std::string>();
    out.push_back(std::move(s));
  }
  return out;
}

ComponentHistory history_of_checkpoint(const std::map<std::string, std::string>& metadata) {
  const auto parsed = [&](const char* key) {
    const auto it = metadata.find(key);
    return it == metadata.end() ? nlohmann::json()
                                : nlohmann::json::parse(it->second, nullptr, false);
  };
  if (auto h = component_history_from_json(parsed("history"))) return *h;
  const auto component = [&](const nlohmann::json& j, const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>()
                                                                  : std::string();
  };
  const auto policy = parsed("policy");
  ComponentSegment s;
  s.policy = component(policy, "component");
  s.resolved_policy = component(policy, "resolved");
  s.scaler = component(parsed("scaler"), "component");
  s.optimizer = component(parsed("optimizer"), "component");
  if (s.policy.empty() && s.scaler.empty() && s.optimizer.empty()) return {};
  return {s};
}

}  // namespace mixtrain::core

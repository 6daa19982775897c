#include "precision/escalation.h"

#include <algorithm>
#include <limits>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

using json = nlohmann::json;
using sdk::DType;

namespace {

DType wider(DType t) {
  switch (t) {
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
      return DType::bf16;
    case DType::fp16:
    case DType::bf16:
    case DType::tf32:
      return DType::fp32;
    default:
      return t;
  }
}

json precision_json(const sdk::OpPrecision& p) {
  return {{"weight", sdk::dtype_name(p.weight)},
          {"gemm_input", sdk::dtype_name(p.gemm_input)},
          {"activation", sdk::dtype_name(p.activation)},
          {"activation_grad", sdk::dtype_name(p.activation_grad)}};
}

[[noreturn]] void bad(const std::string& file, const std::string& field, const std::string& what) {
  throw sdk::CheckpointError(file + ": escalation state: '" + field + "' " + what,
                             "the checkpoint is damaged; use an earlier one");
}

sdk::OpPrecision precision_from_json(const json& j, const std::string& file,
                                     const std::string& field) {
  if (!j.is_object()) bad(file, field, "is not an object");
  sdk::OpPrecision p;
  auto read = [&](const char* key, DType& out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) bad(file, field + "." + key, "is not a dtype name");
    auto dt = sdk::parse_dtype(it->get<std::string>());
    if (!dt) bad(file, field + "." + key, "names no dtype: " + it->get<std::string>());
    out = *dt;
  };
  read("weight", p.weight);
  read("gemm_input", p.gemm_input);
  read("activation", p.activation);
  read("activation_grad", p.activation_grad);
  return p;
}

std::int64_t read_step(const json& j, const std::string& file, const std::string& field) {
  if (!j.is_number_integer() || j.get<std::int64_t>() < 0)
    bad(file, field, "is not a step number (an integer >= 0)");
  return j.get<std::int64_t>();
}

const char* kind_name(Escalation::Event::Kind k) {
  switch (k) {
    case Escalation::Event::Kind::promote:
      return "promote";
    case Escalation::Event::Kind::demote:
      return "demote";
    case Escalation::Event::Kind::stuck:
      return "stuck";
  }
  return "?";
}

}  // namespace

bool can_widen(const sdk::OpPrecision& p) {
  return wider(p.weight) != p.weight || wider(p.gemm_input) != p.gemm_input ||
         wider(p.activation) != p.activation || wider(p.activation_grad) != p.activation_grad;
}

sdk::OpPrecision widen(const sdk::OpPrecision& p) {
  return {wider(p.weight), wider(p.gemm_input), wider(p.activation), wider(p.activation_grad)};
}

std::string precision_text(const sdk::OpPrecision& p) {
  if (p.weight == p.gemm_input && p.gemm_input == p.activation && p.activation == p.activation_grad)
    return std::string(sdk::dtype_name(p.weight));
  return "weight=" + std::string(sdk::dtype_name(p.weight)) +
         " gemm_input=" + std::string(sdk::dtype_name(p.gemm_input)) +
         " activation=" + std::string(sdk::dtype_name(p.activation)) +
         " activation_grad=" + std::string(sdk::dtype_name(p.activation_grad));
}

void Escalation::start_from(const std::string& node, const sdk::OpPrecision& plan) {
  auto& n = nodes_[node];
  if (n.stack.empty()) n.stack.push_back(plan);
}

std::optional<Escalation::Event> Escalation::observe(std::int64_t step, bool skipped,
                                                     const std::string& node) {
  if (!settings_.enabled) return std::nullopt;
  if (!skipped) {
    ++clean_steps_;
    // The most recent promotion standing whose node is not pinned at its rung.
    auto latest = promotion_order_.rbegin();
    while (latest != promotion_order_.rend() &&
           nodes_.at(*latest).stack.size() <= nodes_.at(*latest).pinned_size)
      ++latest;
    if (settings_.deescalate_after > 0 && clean_steps_ >= settings_.deescalate_after &&
        latest != promotion_order_.rend()) {
      clean_steps_ = 0;
      const std::string name = *latest;
      promotion_order_.erase(std::next(latest).base());
      auto& n = nodes_.at(name);
      n.demoted_from = std::max(n.demoted_from, n.stack.size());
      Event e{Event::Kind::demote, step, name, n.stack.back(), n.stack[n.stack.size() - 2], {}};
      n.stack.pop_back();
      n.blames.clear();
      events_.push_back(e);
      return e;
    }
    return std::nullopt;
  }
  clean_steps_ = 0;
  if (node.empty()) return std::nullopt;  // the input batch or the loss: no op to widen
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.stack.empty())
    throw std::logic_error("escalation: node '" + node + "' blamed before start_from()");
  auto& n = it->second;
  while (!n.blames.empty() && step - n.blames.front() >= settings_.window) n.blames.pop_front();
  n.blames.push_back(step);
  if (static_cast<std::int64_t>(n.blames.size()) < settings_.after) return std::nullopt;
  const sdk::OpPrecision current = n.stack.back();
  std::vector<std::int64_t> blames(n.blames.begin(), n.blames.end());
  n.blames.clear();
  if (!can_widen(current)) {
    if (n.reported_stuck) return std::nullopt;
    n.reported_stuck = true;
    Event e{Event::Kind::stuck, step, node, current, current, std::move(blames)};
    events_.push_back(e);
    return e;
  }
  n.stack.push_back(widen(current));
  promotion_order_.push_back(node);
  Event e{Event::Kind::promote, step, node, current, n.stack.back(), std::move(blames)};
  if (n.stack.size() <= n.demoted_from) {
    n.pinned_size = std::max(n.pinned_size, n.stack.size());
    e.pinned = true;
  }
  events_.push_back(e);
  return e;
}

std::vector<PrecisionOverride> Escalation::overrides() const {
  std::vector<PrecisionOverride> out;
  for (const auto& [name, n] : nodes_) {
    if (n.stack.size() < 2) continue;
    const auto& p = n.stack.back();
    PrecisionOverride o;
    o.pattern = name;
    o.weight = p.weight;
    o.gemm_input = p.gemm_input;
    o.activation = p.activation;
    o.activation_grad = p.activation_grad;
    o.where = {"[precision.escalate] (promoted during training)", 0, 0};
    out.push_back(std::move(o));
  }
  return out;
}

namespace {
bool same_plan(const sdk::OpPrecision& a, const sdk::OpPrecision& b) {
  return a.weight == b.weight && a.gemm_input == b.gemm_input && a.activation == b.activation &&
         a.activation_grad == b.activation_grad;
}
}  // namespace

std::vector<Escalation::Replanned> Escalation::drop_replanned(
    const std::function<std::optional<sdk::OpPrecision>(const std::string&)>& plan_now) {
  std::vector<Replanned> dropped;
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    const auto now = plan_now(it->first);
    if (it->second.stack.empty() || (now && same_plan(*now, it->second.stack.front()))) {
      ++it;
      continue;
    }
    if (it->second.stack.size() > 1)  // a node only blamed so far is dropped without a word
      dropped.push_back({it->first, it->second.stack.front(), it->second.stack.back(),
                         now.value_or(it->second.stack.front())});
    std::erase(promotion_order_, it->first);
    it = nodes_.erase(it);
  }
  return dropped;
}

bool Escalation::any_promoted() const {
  return !promotion_order_.empty();
}

std::int64_t Escalation::promotions_standing() const {
  return static_cast<std::int64_t>(promotion_order_.size());
}

json escalation_event_json(const Escalation::Event& e) {
  json j = {{"kind", kind_name(e.kind)},
            {"step", e.step},
            {"node", e.node},
            {"from", precision_text(e.from)},
            {"to", precision_text(e.to)},
            {"from_plan", precision_json(e.from)},
            {"to_plan", precision_json(e.to)}};
  if (!e.blames.empty()) j["blamed_at"] = e.blames;
  if (e.pinned) j["pinned"] = true;
  return j;
}

json Escalation::to_json() const {
  json nodes = json::object();
  for (const auto& [name, n] : nodes_) {
    json stack = json::array();
    for (const auto& p : n.stack) stack.push_back(precision_json(p));
    nodes[name] = {{"stack", stack},
                   {"blames", std::vector<std::int64_t>(n.blames.begin(), n.blames.end())},
                   {"reported_stuck", n.reported_stuck},
                   {"demoted_from", n.demoted_from},
                   {"pinned_size", n.pinned_size}};
  }
  json events = json::array();
  for (const auto& e : events_) events.push_back(escalation_event_json(e));
  return {{"nodes", nodes},
          {"promotion_order", promotion_order_},
          {"clean_steps", clean_steps_},
          {"events", events}};
}

namespace {

// The checkpoint's "events": its own record of what escalation did, each kind by its name.
std::vector<Escalation::Event> events_from_json(const json& events, const std::string& file) {
  using Event = Escalation::Event;
  std::vector<Event> out;
  if (!events.is_array()) bad(file, "events", "is not an array");
  for (std::size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    const std::string at = "events." + std::to_string(i);
    if (!e.is_object() || !e.contains("kind") || !e["kind"].is_string() || !e.contains("node") ||
        !e["node"].is_string() || !e.contains("step"))
      bad(file, at, "is not an event");
    Event ev;
    const std::string kind = e["kind"].get<std::string>();
    if (kind == "promote")
      ev.kind = Event::Kind::promote;
    else if (kind == "demote")
      ev.kind = Event::Kind::demote;
    else if (kind == "stuck")
      ev.kind = Event::Kind::stuck;
    else
      bad(file, at + ".kind", "is '" + kind + "', not promote, demote or stuck");
    ev.step = read_step(e["step"], file, at + ".step");
    ev.node = e["node"].get<std::string>();
    if (!e.contains("from_plan") || !e.contains("to_plan")) bad(file, at, "lacks its plans");
    ev.from = precision_from_json(e["from_plan"], file, at + ".from_plan");
    ev.to = precision_from_json(e["to_plan"], file, at + ".to_plan");
    if (auto b = e.find("blamed_at"); b != e.end()) {
      if (!b->is_array()) bad(file, at + ".blamed_at", "is not an array");
      for (const auto& s : *b) ev.blames.push_back(read_step(s, file, at + ".blamed_at"));
    }
    if (auto p = e.find("pinned"); p != e.end()) {
      if (!p->is_boolean()) bad(file, at + ".pinned", "is not a boolean");
      ev.pinned = p->get<bool>();
    }
    out.push_back(std::move(ev));
  }
  return out;
}

}  // namespace

Escalation Escalation::from_json(const json& j, EscalationSettings settings,
                                 const std::string& file) {
  Escalation out(settings);
  if (!j.is_object()) bad(file, "escalation", "is not an object");
  auto field = [&](const char* key) -> const json& {
    auto it = j.find(key);
    if (it == j.end()) bad(file, key, "is missing");
    return *it;
  };
  const json& nodes = field("nodes");
  if (!nodes.is_object()) bad(file, "nodes", "is not an object");
  for (const auto& [name, n] : nodes.items()) {
    const std::string at = "nodes." + name;
    if (!n.is_object() || !n.contains("stack") || !n["stack"].is_array() || n["stack"].empty())
      bad(file, at + ".stack", "is not a non-empty array");
    NodeState s;
    for (std::size_t i = 0; i < n["stack"].size(); ++i) {
      s.stack.push_back(
          precision_from_json(n["stack"][i], file, at + ".stack." + std::to_string(i)));
      if (i > 0 && precision_text(s.stack[i]) != precision_text(widen(s.stack[i - 1])))
        bad(file, at + ".stack." + std::to_string(i), "is not one rung above the entry before it");
    }
    if (!n.contains("blames") || !n["blames"].is_array()) bad(file, at + ".blames", "is missing");
    for (const auto& b : n["blames"]) s.blames.push_back(read_step(b, file, at + ".blames"));
    if (!std::is_sorted(s.blames.begin(), s.blames.end()))
      bad(file, at + ".blames", "is not in step order");
    // Checkpoints written before pinning have neither (nothing pinned, nothing demoted).
    for (const auto& [key, field] :
         {std::pair{"demoted_from", &s.demoted_from}, std::pair{"pinned_size", &s.pinned_size}})
      if (n.contains(key)) {
        const json& v = n[key];
        if (!v.is_number_unsigned() || v.get<std::size_t>() > 64)
          bad(file, at + "." + key, "is not a stack size (an integer from 0 to 64)");
        *field = v.get<std::size_t>();
      }
    if (s.pinned_size > s.stack.size()) bad(file, at + ".pinned_size", "is above the node's stack");
    if (n.contains("reported_stuck")) {
      if (!n["reported_stuck"].is_boolean()) bad(file, at + ".reported_stuck", "is not a boolean");
      s.reported_stuck = n["reported_stuck"].get<bool>();
    }
    out.nodes_[name] = std::move(s);
  }
  const json& order = field("promotion_order");
  if (!order.is_array()) bad(file, "promotion_order", "is not an array");
  std::map<std::string, std::size_t> standing;
  for (const auto& o : order) {
    if (!o.is_string()) bad(file, "promotion_order", "holds a value that is not a node name");
    const std::string name = o.get<std::string>();
    auto it = out.nodes_.find(name);
    if (it == out.nodes_.end())
      bad(file, "promotion_order", "names '" + name + "', which has no state");
    if (++standing[name] >= it->second.stack.size())
      bad(file, "promotion_order", "lists '" + name + "' more often than it was promoted");
    out.promotion_order_.push_back(name);
  }
  for (const auto& [name, n] : out.nodes_)
    if (standing[name] + 1 != n.stack.size())
      bad(file, "nodes." + name + ".stack",
          "holds " + std::to_string(n.stack.size() - 1) + " promotions but promotion_order " +
              std::to_string(standing[name]));
  out.clean_steps_ = read_step(field("clean_steps"), file, "clean_steps");
  out.events_ = events_from_json(field("events"), file);
  return out;
}

}  // namespace mixtrain::core

#include "mixtrain/core/graph/topology.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <unordered_map>

#include "mixtrain/sdk/options.h"

namespace mixtrain::core {

namespace {

[[noreturn]] void fail(const GraphNodeSpec& node, const std::string& what,
                       const std::string& hint) {
  throw sdk::ConfigError(node.where, node.name, what, hint);
}

// The nodes on one cycle among `pending` (nodes never made ready), in the order they read each
// other: follow any unfinished input from a pending node until a node repeats.
std::vector<std::size_t> find_cycle(const std::vector<std::vector<GraphSource>>& sources,
                                    const std::vector<bool>& pending, std::size_t start) {
  std::vector<std::size_t> path;
  std::unordered_map<std::size_t, std::size_t> at;
  std::size_t n = start;
  while (!at.count(n)) {
    at[n] = path.size();
    path.push_back(n);
    for (const auto& s : sources[n])
      if (s.is_node && pending[s.index]) {
        n = s.index;
        break;
      }
  }
  std::vector<std::size_t> cycle(path.begin() + static_cast<std::ptrdiff_t>(at[n]), path.end());
  std::reverse(cycle.begin(), cycle.end());  // as data flows: each node reads the one before it
  return cycle;
}

// Every name a node input may use: the graph's inputs, then each node's (checked unique).
std::unordered_map<std::string, GraphSource> index_names(
    const std::vector<GraphNodeSpec>& nodes, const std::vector<std::string>& graph_inputs) {
  std::unordered_map<std::string, GraphSource> by_name;
  for (std::size_t g = 0; g < graph_inputs.size(); ++g) by_name[graph_inputs[g]] = {false, g};
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const auto& node = nodes[i];
    if (node.name.empty()) fail(node, "a node without a name", "give every node a name = \"...\"");
    auto [it, fresh] = by_name.try_emplace(node.name, GraphSource{true, i});
    if (fresh) continue;
    if (!it->second.is_node)
      fail(node, "the node '" + node.name + "' has the name of a graph input",
           "rename the node; the graph's inputs are read by that name");
    fail(node,
         "the name '" + node.name + "' is used twice: here and at " +
             nodes[it->second.index].where.to_string(),
         "give each node its own name");
  }
  return by_name;
}

// Each node's inputs resolved by name, in the order written.
std::vector<std::vector<GraphSource>> resolve_sources(
    const std::vector<GraphNodeSpec>& nodes,
    const std::unordered_map<std::string, GraphSource>& by_name) {
  std::vector<std::vector<GraphSource>> sources(nodes.size());
  std::vector<std::string> known;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    for (const auto& input : nodes[i].inputs) {
      auto it = by_name.find(input);
      if (it == by_name.end()) {
        if (known.empty())
          for (const auto& [name, source] : by_name) known.push_back(name);
        std::sort(known.begin(), known.end());
        const auto near = sdk::closest_match(input, known);
        fail(nodes[i], "the input '" + input + "' names no node and no graph input",
             (near.empty() ? std::string() : "did you mean '" + near + "'? ") +
                 "inputs name a node declared in the model or a graph input");
      }
      if (it->second.is_node && it->second.index == i)
        fail(nodes[i], "the node '" + nodes[i].name + "' reads its own output",
             "a graph has no loops; read the node before it");
      sources[i].push_back(it->second);
    }
  }
  return sources;
}

// Kahn's algorithm with the declaration index as priority among ready nodes; a cycle is an error
// naming its nodes.
std::vector<std::size_t> forward_order(const std::vector<GraphNodeSpec>& nodes,
                                       const std::vector<std::vector<GraphSource>>& sources) {
  const std::size_t n = nodes.size();
  std::vector<std::size_t> unmet(n, 0);
  std::vector<std::vector<std::size_t>> readers(n);
  for (std::size_t i = 0; i < n; ++i)
    for (const auto& s : sources[i])
      if (s.is_node) {
        ++unmet[i];
        readers[s.index].push_back(i);
      }
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t i = 0; i < n; ++i)
    if (unmet[i] == 0) ready.push(i);
  std::vector<std::size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const std::size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (std::size_t r : readers[i])
      if (--unmet[r] == 0) ready.push(r);
  }
  if (order.size() == n) return order;
  std::vector<bool> pending(n, false);
  for (std::size_t i = 0; i < n; ++i) pending[i] = unmet[i] != 0;
  const auto first =
      static_cast<std::size_t>(std::find(pending.begin(), pending.end(), true) - pending.begin());
  const auto cycle = find_cycle(sources, pending, first);
  std::string names;
  for (std::size_t c : cycle) names += nodes[c].name + " -> ";
  names += nodes[cycle.front()].name;
  fail(nodes[cycle.front()], "the nodes form a cycle: " + names,
       "a model is a graph without loops; break the cycle by reading an earlier node");
}

}  // namespace

GraphTopology plan_graph_topology(const std::vector<GraphNodeSpec>& nodes,
                                  const std::vector<std::string>& graph_inputs) {
  const std::size_t n = nodes.size();
  GraphTopology t;
  std::vector<std::vector<GraphSource>> sources =
      resolve_sources(nodes, index_names(nodes, graph_inputs));
  t.order = forward_order(nodes, sources);
  t.position.assign(n, 0);
  for (std::size_t p = 0; p < n; ++p) t.position[t.order[p]] = p;
  t.consumers.assign(n, {});
  t.input_consumers.assign(graph_inputs.size(), {});
  for (std::size_t i : t.order)
    for (const auto& s : sources[i])
      (s.is_node ? t.consumers : t.input_consumers)[s.index].push_back(i);
  t.sources = std::move(sources);
  t.last_reader.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    t.last_reader[i] = t.consumers[i].empty() ? t.position[i] : t.position[t.consumers[i].back()];
  return t;
}

}  // namespace mixtrain::core

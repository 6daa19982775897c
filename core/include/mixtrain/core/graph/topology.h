// The topology of a model graph before any op is built: which node reads which, the order in which
// they run, and who reads each output (fan-out, where gradients accumulate).
//
// Contract
// - Nodes come in declaration order, each with a name, the names of its inputs (other nodes, or
//   the graph's own inputs such as "x") and the config location it was declared at. An input may
//   be named twice (add(h, h)); it is then read twice.
// - plan_graph_topology() returns the forward order: every node after all of its inputs, and
//   among nodes that are ready together, the one declared first, so a chain runs as written and
//   the order never depends on anything but the config. Backward runs it in reverse.
// - sources[i] is node i's inputs as written, each resolved to a node or a graph input.
// - consumers[i] lists, in forward order, each node that reads node i's output, once per read;
//   input_consumers does the same for the graph's inputs. A tensor with two or more readers
//   accumulates its gradient: the first writer overwrites, later ones add.
// - last_reader[i] is the forward position of node i's last reader (its own position when nothing
//   reads it: the graph's outputs), the end of its live interval in the forward pass.
// - Bad graphs are sdk::ConfigError at the offending node's location, with the node's name as
//   the key: an empty name; a name declared twice (both places named) or equal to a graph input;
//   an input that names nothing (with "did you mean" and the names known); a node that reads
//   itself; a cycle (the nodes on it, in order). Linear in nodes plus edges.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

struct GraphNodeSpec {
  std::string name;                 // "block2.fc1"
  std::vector<std::string> inputs;  // node names or graph inputs
  sdk::SourceLocation where;        // where the config declares the node
};

// What one node input names: a node (its declaration index) or a graph input (its index).
struct GraphSource {
  bool is_node = false;
  std::size_t index = 0;
};

struct GraphTopology {
  std::vector<std::vector<GraphSource>> sources;          // per node, its inputs resolved, in order
  std::vector<std::size_t> order;                         // node indices in forward order
  std::vector<std::size_t> position;                      // position[i]: node i's place in `order`
  std::vector<std::vector<std::size_t>> consumers;        // per node, readers in forward order
  std::vector<std::vector<std::size_t>> input_consumers;  // per graph input, likewise
  std::vector<std::size_t> last_reader;                   // per node, a position in `order`
};

GraphTopology plan_graph_topology(const std::vector<GraphNodeSpec>& nodes,
                                  const std::vector<std::string>& graph_inputs);

}  // namespace mixtrain::core

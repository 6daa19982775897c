// plan_graph_topology: run order, fan-out and the bad graphs a config can describe.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mixtrain/core/graph/topology.h"

namespace {

using mixtrain::core::GraphNodeSpec;
using mixtrain::core::plan_graph_topology;
using mixtrain::sdk::ConfigError;

GraphNodeSpec node(std::string name, std::vector<std::string> inputs, std::uint32_t line) {
  return {std::move(name), std::move(inputs), {"model.toml", line, 1}};
}

std::vector<std::string> names_in_order(const std::vector<GraphNodeSpec>& nodes,
                                        const std::vector<std::size_t>& order) {
  std::vector<std::string> out;
  for (auto i : order) out.push_back(nodes[i].name);
  return out;
}

// The message of the ConfigError that planning `nodes` raises; fails the test when none is.
ConfigError error_of(const std::vector<GraphNodeSpec>& nodes) {
  try {
    plan_graph_topology(nodes, {"x"});
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "no ConfigError";
  return ConfigError({}, "", "");
}

TEST(GraphTopology, AChainRunsAsWritten) {
  const std::vector<GraphNodeSpec> nodes = {node("fc1", {"x"}, 1), node("relu1", {"fc1"}, 2),
                                            node("head", {"relu1"}, 3)};
  const auto t = plan_graph_topology(nodes, {"x"});
  EXPECT_EQ(names_in_order(nodes, t.order), (std::vector<std::string>{"fc1", "relu1", "head"}));
  EXPECT_EQ(t.input_consumers.at(0), (std::vector<std::size_t>{0}));
  EXPECT_EQ(t.last_reader, (std::vector<std::size_t>{1, 2, 2}));  // head is an output
}

TEST(GraphTopology, NodesMayBeDeclaredBeforeTheirInputsAndReadyOnesRunInDeclarationOrder) {
  // x -> fc -> relu -> fc2 -> add(fc, fc2) -> head, declared out of order; b and a are both ready
  // after x and run in declaration order.
  const std::vector<GraphNodeSpec> nodes = {node("head", {"sum"}, 1), node("sum", {"fc", "fc2"}, 2),
                                            node("fc2", {"relu"}, 3), node("relu", {"fc"}, 4),
                                            node("fc", {"x"}, 5),     node("b", {"x"}, 6),
                                            node("a", {"x"}, 7)};
  const auto t = plan_graph_topology(nodes, {"x"});
  EXPECT_EQ(names_in_order(nodes, t.order),
            (std::vector<std::string>{"fc", "relu", "fc2", "sum", "head", "b", "a"}));
  for (std::size_t p = 0; p < t.order.size(); ++p) EXPECT_EQ(t.position[t.order[p]], p);
}

TEST(GraphTopology, AResidualOutputHasTwoReadersAndLivesUntilTheLast) {
  const std::vector<GraphNodeSpec> nodes = {
      node("fc1", {"x"}, 1), node("relu", {"fc1"}, 2), node("fc2", {"relu"}, 3),
      node("res", {"fc2", "fc1"}, 4), node("head", {"res"}, 5)};
  const auto t = plan_graph_topology(nodes, {"x"});
  EXPECT_EQ(t.consumers[0], (std::vector<std::size_t>{1, 3}));  // relu, then res
  EXPECT_EQ(t.last_reader[0], t.position[3]);
  EXPECT_EQ(t.consumers[4], (std::vector<std::size_t>{}));
}

TEST(GraphTopology, AnInputReadTwiceIsTwoReads) {
  const std::vector<GraphNodeSpec> nodes = {node("h", {"x"}, 1), node("double", {"h", "h"}, 2)};
  const auto t = plan_graph_topology(nodes, {"x"});
  EXPECT_EQ(t.consumers[0], (std::vector<std::size_t>{1, 1}));
  EXPECT_EQ(names_in_order(nodes, t.order), (std::vector<std::string>{"h", "double"}));
}

TEST(GraphTopology, ALongChainPlans) {
  // Linear time: a 100,000-node chain, each reading the one before (declared last to first).
  std::vector<GraphNodeSpec> nodes;
  const int n = 100000;
  for (int i = n - 1; i >= 0; --i)
    nodes.push_back(node("n" + std::to_string(i), {i == 0 ? "x" : "n" + std::to_string(i - 1)},
                         static_cast<std::uint32_t>(i + 1)));
  const auto t = plan_graph_topology(nodes, {"x"});
  ASSERT_EQ(t.order.size(), static_cast<std::size_t>(n));
  EXPECT_EQ(nodes[t.order.front()].name, "n0");
  EXPECT_EQ(nodes[t.order.back()].name, "n" + std::to_string(n - 1));
}

TEST(GraphTopology, ANameUsedTwiceNamesBothPlaces) {
  const auto e = error_of({node("fc", {"x"}, 3), node("fc", {"x"}, 9)});
  EXPECT_EQ(e.key(), "fc");
  EXPECT_EQ(e.where().line, 9u);
  EXPECT_NE(std::string(e.what()).find("model.toml:3:1"), std::string::npos) << e.what();
}

TEST(GraphTopology, ADanglingInputSuggestsTheNearestName) {
  const auto e = error_of({node("fc1", {"x"}, 1), node("head", {"fc_1"}, 2)});
  EXPECT_EQ(e.key(), "head");
  EXPECT_EQ(e.where().line, 2u);
  EXPECT_NE(std::string(e.what()).find("'fc_1' names no node"), std::string::npos) << e.what();
  EXPECT_NE(e.hint().find("did you mean 'fc1'"), std::string::npos) << e.hint();
}

TEST(GraphTopology, ACycleNamesItsNodesInOrder) {
  const auto e = error_of({node("a", {"x", "c"}, 1), node("b", {"a"}, 2), node("c", {"b"}, 3),
                           node("after", {"c"}, 4)});
  const std::string what = e.what();
  EXPECT_NE(what.find("cycle"), std::string::npos) << what;
  // One rotation of a -> b -> c -> a, whichever node it starts from.
  const bool named = what.find("a -> b -> c -> a") != std::string::npos ||
                     what.find("b -> c -> a -> b") != std::string::npos ||
                     what.find("c -> a -> b -> c") != std::string::npos;
  EXPECT_TRUE(named) << what;
}

TEST(GraphTopology, SelfLoopsEmptyNamesAndShadowedInputsAreRefused) {
  EXPECT_NE(std::string(error_of({node("a", {"a"}, 1)}).what()).find("reads its own output"),
            std::string::npos);
  EXPECT_NE(std::string(error_of({node("", {"x"}, 1)}).what()).find("without a name"),
            std::string::npos);
  EXPECT_NE(std::string(error_of({node("x", {"x"}, 1)}).what()).find("name of a graph input"),
            std::string::npos);
}

}  // namespace

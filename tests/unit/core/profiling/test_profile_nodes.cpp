// The profiler's node table (profiling_backend.h: node_entries, format_node_profile): the executor
// files each backend op of a model node under that node's name as well as its type, the loss
// outside any node stays out of it, a scope opened inside a node keeps the node, reset() clears
// it, and the printed table gives a convolution's rate from its node's forward FLOPs and the
// node's shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cnn_test_support.h"
#include "cpu_test_backend.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/graph/model_summary.h"
#include "mixtrain/core/profiling/profiling_backend.h"
#include "profiling/profile_scope.h"

namespace mixtrain::core {
namespace {

using cnn_testing::feed;
using cnn_testing::graph;
using cnn_testing::image;
using test_support::cpu;
using test_support::op;

const ProfileNodeEntry* find(const std::vector<ProfileNodeEntry>& rows, const std::string& node,
                             const std::string& op) {
  const auto it = std::find_if(rows.begin(), rows.end(), [&](const ProfileNodeEntry& r) {
    return r.node == node && r.entry.op == op;
  });
  return it == rows.end() ? nullptr : &*it;
}

TEST(ProfileNodes, EachNodesOpsAreFiledUnderItsNameAndTheTablePrintsTheirRates) {
  auto profiler = make_profiling_backend(cpu());
  Model m(
      profiler,
      graph({op("conv2d", "c1", {{"out", 4}, {"kernel", 3}, {"padding", 1}, {"bias", false}},
                {"input"}),
             op("batchnorm2d", "b1", {}, {"c1"}), op("relu", "r1", {}, {"b1"}),
             op("global_avgpool", "gap", {}, {"r1"}), op("linear", "fc", {{"out", 3}}, {"gap"})}),
      3 * 6 * 6, 3, image(3, 6, 6));
  const std::int64_t batch = 2;
  m.allocate(batch);
  feed(m, batch, 5);
  profiler->reset();
  m.forward(batch);
  (void)m.loss(batch, 1.0f, true);
  m.backward(batch);

  const auto nodes = profiler->node_entries();
  const auto* forward = find(nodes, "c1", "conv2d_forward");
  ASSERT_NE(forward, nullptr);
  EXPECT_EQ(forward->entry.scope, "conv2d");
  EXPECT_EQ(forward->entry.calls, 1);
  const auto* wgrad = find(nodes, "c1", "conv2d_backward_weights");
  ASSERT_NE(wgrad, nullptr);
  EXPECT_EQ(wgrad->entry.calls, 1);
  EXPECT_NE(find(nodes, "b1", "batchnorm_forward_training"), nullptr);
  EXPECT_NE(find(nodes, "fc", "gemm"), nullptr);
  // The loss is no node's: it is in the op table only.
  for (const auto& r : nodes) EXPECT_NE(r.entry.op, "softmax_cross_entropy") << r.node;
  const auto ops = profiler->entries();
  EXPECT_TRUE(std::any_of(ops.begin(), ops.end(),
                          [](const ProfileEntry& e) { return e.op == "softmax_cross_entropy"; }));
  // Every node row is a share of its (scope, op) row: the same calls, never more time.
  for (const auto& r : nodes) {
    double seconds = 0.0;
    std::int64_t calls = 0;
    for (const auto& n : nodes)
      if (n.entry.scope == r.entry.scope && n.entry.op == r.entry.op) {
        seconds += n.entry.seconds;
        calls += n.entry.calls;
      }
    const auto it = std::find_if(ops.begin(), ops.end(), [&](const ProfileEntry& e) {
      return e.scope == r.entry.scope && e.op == r.entry.op;
    });
    ASSERT_NE(it, ops.end()) << r.node << " " << r.entry.op;
    EXPECT_LE(calls, it->calls) << r.entry.op;
    EXPECT_LE(seconds, it->seconds * (1 + 1e-12)) << r.entry.op;
  }

  // The printed table: c1's shapes from the summary and its forward's rate, none for batch norm.
  std::map<std::string, ProfileNodeInfo> info;
  const ModelSummary summary = summarize_model(m, batch);
  for (const auto& n : summary.nodes)
    info[n.name] = {node_shapes_text(n),
                    static_cast<double>(n.forward_flops_per_sample) * static_cast<double>(batch)};
  ASSERT_EQ(info.at("c1").shapes, "[3, 6, 6] -> [4, 6, 6]");
  const std::string table = format_node_profile(*profiler, 1, info, 100);
  std::string c1_forward, b1_line;
  for (std::size_t at = 0, end; at < table.size(); at = end + 1) {
    end = table.find('\n', at);
    const std::string line = table.substr(at, end - at);
    if (line.find(" c1 ") != std::string::npos && line.find("conv2d_forward") != std::string::npos)
      c1_forward = line;
    if (line.find(" b1 ") != std::string::npos &&
        line.find("batchnorm_forward_training") != std::string::npos)
      b1_line = line;
  }
  ASSERT_FALSE(c1_forward.empty()) << table;
  EXPECT_NE(c1_forward.find("[3, 6, 6] -> [4, 6, 6]"), std::string::npos) << c1_forward;
  const double rate = info.at("c1").forward_flops_per_call / forward->entry.seconds * 1e-12;
  char expected[32];
  std::snprintf(expected, sizeof expected, " %.1f ", rate);
  EXPECT_NE(c1_forward.find(expected), std::string::npos) << c1_forward << " wants" << expected;
  ASSERT_FALSE(b1_line.empty()) << table;
  EXPECT_NE(b1_line.find(" - "), std::string::npos) << "no rate for batch norm: " << b1_line;

  profiler->reset();
  EXPECT_TRUE(profiler->node_entries().empty());
  EXPECT_EQ(format_node_profile(*profiler, 1, info), "");
}

TEST(ProfileNodes, AScopeInsideANodeKeepsItAndOneOutsideHasNone) {
  auto profiler = make_profiling_backend(cpu());
  Tensor x(profiler, sdk::DType::fp32, sdk::Shape{8});
  std::vector<float> h(8, 1.0f);
  profiler->reset();
  {
    const ProfileScope outer("conv2d", "layer1.0.conv1");
    const ProfileScope inner("cast scope");  // no node of its own: the enclosing one's
    profiler->copy_from_host(x.view(), h.data());
  }
  {
    const ProfileScope optimizer("optimizer");  // outside every node
    profiler->copy_from_host(x.view(), h.data());
  }
  const auto nodes = profiler->node_entries();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].node, "layer1.0.conv1");
  EXPECT_EQ(nodes[0].entry.scope, "cast scope");
  EXPECT_EQ(nodes[0].entry.calls, 1);
  EXPECT_EQ(profiler->entries().size(), 2u) << "both copies are in the op table";
  EXPECT_EQ(ProfileScope::node(), nullptr) << "the scopes closed";
}

TEST(ProfileNodes, ASumOfLinearsFilesEachGemmUnderItsLinear) {
  // The add runs both linears' GEMMs in its pass (add.h); the table still names the linears.
  auto profiler = make_profiling_backend(cpu());
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {op("linear", "base", {{"out", 6}}, {"input"}),
                 op("linear", "a", {{"out", 2}, {"bias", false}}, {"input"}),
                 op("linear", "b", {{"out", 6}, {"bias", false}}, {"a"}),
                 op("add", "sum", {}, {"base", "b"}), op("linear", "head", {{"out", 3}}, {"sum"})};
  Model m(profiler, spec, 5, 3);
  const std::int64_t batch = 4;
  m.allocate(batch);
  feed(m, batch, 5);
  profiler->reset();
  m.forward(batch);
  const auto nodes = profiler->node_entries();
  for (const char* linear : {"base", "b"}) {
    const auto* gemm = find(nodes, linear, "gemm");
    ASSERT_NE(gemm, nullptr) << linear;
    EXPECT_EQ(gemm->entry.scope, "linear");
    EXPECT_EQ(gemm->entry.calls, 1) << linear;
  }
  EXPECT_EQ(find(nodes, "sum", "gemm"), nullptr);
  EXPECT_EQ(find(nodes, "sum", "add"), nullptr) << "the add ran no pass of its own";
}

}  // namespace
}  // namespace mixtrain::core

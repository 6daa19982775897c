// The model as a graph, through the real executable: the sequential `layers` form and the same
// model written as explicit `nodes` train to identical metrics; a residual graph trains; and bad
// graphs exit 2 naming the node and the config's line.
#include "cli_test_support.h"

namespace mixtrain::test {
namespace {

// Everything but the timing of a metrics record.
json without_timing(json r) {
  r.erase("samples_per_s");
  return r;
}

const char* kCommon = R"(
[run]
seed = 3
steps = 60
log_every = 10
eval_every = 30

[backend]
type = "cpu"

[precision]
policy = "bf16-mixed"

[scaler]
type = "dynamic"

[optimizer]
type = "adamw"

[data]
source = "synthetic"
batch_size = 64

[data.synthetic]
kind = "clusters"
rows = 2048
features = 16
num_classes = 5
)";

class ModelGraph : public CliTest {
 protected:
  // Trains `model` (a [model] table) and returns its metrics records.
  std::vector<json> train(const std::string& name, const std::string& model,
                          const std::string& extra = "") {
    const auto cfg = write_file(name + ".toml", std::string(kCommon) + model);
    const auto r = run("train " + cfg.string() + " --set run.dir=" + (dir_ / name).string() + extra);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return records(dir_ / name / "metrics.jsonl");
  }
};

TEST_F(ModelGraph, LayersAndTheSameModelAsNodesTrainToIdenticalMetrics) {
  // bf16-mixed with a dynamic scaler, a fused relu and a fused gelu, a layernorm: every path of
  // the chain the sequential form took before the graph.
  const auto layers = train("layers", R"(
[model]
layers = [
  { type = "linear", name = "fc1", out = 32 },
  { type = "relu" },
  { type = "linear", name = "fc2", out = 32 },
  { type = "gelu", name = "act" },
  { type = "layernorm", name = "ln" },
  { type = "linear", name = "head", out = 5 },
]
)");
  const auto nodes = train("nodes", R"(
[[model.nodes]]
name = "fc1"
type = "linear"
out = 32
inputs = ["input"]

[[model.nodes]]
name = "relu1"
type = "relu"
inputs = ["fc1"]

[[model.nodes]]
name = "fc2"
type = "linear"
out = 32
inputs = ["relu1"]

[[model.nodes]]
name = "act"
type = "gelu"
inputs = ["fc2"]

[[model.nodes]]
name = "ln"
type = "layernorm"
inputs = ["act"]

[[model.nodes]]
name = "head"
type = "linear"
out = 5
inputs = ["ln"]
)");
  ASSERT_EQ(layers.size(), nodes.size());
  ASSERT_GE(layers.size(), 6u);
  for (std::size_t i = 0; i < layers.size(); ++i)
    EXPECT_EQ(without_timing(layers[i]), without_timing(nodes[i])) << "record " << i;
}

TEST_F(ModelGraph, AResidualGraphWithReshapeTrains) {
  const auto m = train("residual", R"(
[model]
nodes = [
  { name = "fc1", type = "linear", out = 16, inputs = ["input"] },
  { name = "relu1", type = "relu", inputs = ["fc1"] },
  { name = "fc2", type = "linear", out = 16, inputs = ["relu1"] },
  { name = "res", type = "add", inputs = ["fc2", "input"] },
  { name = "tokens", type = "reshape", shape = [4, 4], inputs = ["res"] },
  { name = "mix", type = "linear", out = 4, inputs = ["tokens"] },
  { name = "flat", type = "flatten", inputs = ["mix"] },
  { name = "head", type = "linear", out = 5, inputs = ["flat"] },
]
)",
                       " --set run.steps=200 --set run.log_every=20 --set run.eval_every=0");
  ASSERT_GE(m.size(), 10u);
  EXPECT_LT(m[9]["loss"].get<double>(), 0.5 * m[0]["loss"].get<double>());
  // The resolved config writes the arrays back, so the run folder's config trains again.
  const auto again = run("check " + (dir_ / "residual" / "config.toml").string());
  EXPECT_EQ(again.exit_code, 0) << again.err;
}

TEST_F(ModelGraph, BadGraphsExit2NamingTheNodeAndTheLine) {
  struct Case {
    const char* what;
    const char* nodes;
    std::vector<std::string> expect;
  };
  const Case cases[] = {
      {"cycle",
       R"({ name = "a", type = "linear", out = 5, inputs = ["b"] },
  { name = "b", type = "relu", inputs = ["a"] },)",
       {"cycle", "b -> a -> b"}},
      {"dangling",
       R"({ name = "fc", type = "linear", out = 5, inputs = ["fc0"] },)",
       {"fc0", "did you mean"}},
      {"shape mismatch",
       R"({ name = "fc", type = "linear", out = 8, inputs = ["input"] },
  { name = "sum", type = "add", inputs = ["fc", "input"] },
  { name = "head", type = "linear", out = 5, inputs = ["sum"] },)",
       {"'sum'", "shape mismatch", "[8]", "[16]"}},
      {"duplicate",
       R"({ name = "fc", type = "linear", out = 8, inputs = ["input"] },
  { name = "fc", type = "linear", out = 5, inputs = ["fc"] },)",
       {"'fc'"}},
      {"two outputs",
       R"({ name = "side", type = "linear", out = 8, inputs = ["input"] },
  { name = "head", type = "linear", out = 5, inputs = ["input"] },)",
       {"'side'", "two outputs"}},
      {"bad reshape",
       R"({ name = "r", type = "reshape", shape = [3, -1], inputs = ["input"] },
  { name = "flat", type = "flatten", inputs = ["r"] },
  { name = "head", type = "linear", out = 5, inputs = ["flat"] },)",
       {"'r'", "[3, -1]"}},
      {"shape on a linear",
       R"({ name = "head", type = "linear", out = 5, shape = [5], inputs = ["input"] },)",
       {"unknown key 'shape'"}},
      {"a node without inputs",
       R"({ name = "head", type = "linear", out = 5 },)",
       {"needs its inputs"}},
  };
  for (const auto& c : cases) {
    const std::string text = std::string(kCommon) + "\n[model]\nnodes = [\n  " + c.nodes + "\n]\n";
    const auto cfg = write_file("bad.toml", text);
    const auto r = run("check " + cfg.string());
    EXPECT_EQ(r.exit_code, 2) << c.what << ":\n" << r.err;
    EXPECT_NE(r.err.find("bad.toml:"), std::string::npos) << c.what << ":\n" << r.err;
    for (const auto& e : c.expect) EXPECT_NE(r.err.find(e), std::string::npos) << c.what << ": " << e << "\n" << r.err;
  }
}

}  // namespace
}  // namespace mixtrain::test

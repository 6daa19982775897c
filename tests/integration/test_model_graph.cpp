// The model as a graph, through the real executable: the sequential `layers` form and the same
// model written as explicit `nodes` train to identical metrics; a residual graph trains; a
// repeated block trains like its nodes written out; override globs reach into blocks; and bad
// graphs and blocks exit 2 naming the node and the config's line.
#include "cli_test_support.h"
#include "metrics_records.h"

namespace mixtrain::test {
namespace {

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
    const auto r =
        run("train " + cfg.string() + " --set run.dir=" + (dir_ / name).string() + extra);
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
    EXPECT_EQ(without_measures(layers[i]), without_measures(nodes[i])) << "record " << i;
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
      {"the logits a view of the input",
       R"({ name = "f", type = "flatten", inputs = ["input"] },)",
       {"the logits node 'f' is a view of the input"}},
  };
  for (const auto& c : cases) {
    const std::string text = std::string(kCommon) + "\n[model]\nnodes = [\n  " + c.nodes + "\n]\n";
    const auto cfg = write_file("bad.toml", text);
    const auto r = run("check " + cfg.string());
    EXPECT_EQ(r.exit_code, 2) << c.what << ":\n" << r.err;
    EXPECT_NE(r.err.find("bad.toml:"), std::string::npos) << c.what << ":\n" << r.err;
    for (const auto& e : c.expect)
      EXPECT_NE(r.err.find(e), std::string::npos) << c.what << ": " << e << "\n" << r.err;
  }
}

TEST_F(ModelGraph, BadStateSettingsExit2NamingTheKeyAndTheLine) {
  struct Case {
    const char* what;
    std::string text;
    std::vector<std::string> expect;
  };
  const std::string tied = R"(
[model]
nodes = [
  { name = "embed", type = "linear", out = 8, inputs = ["input"] },
  { name = "head", type = "linear", out = 5, inputs = ["embed"], tie_weight = "TIE" },
]
)";
  auto with_tie = [&](const std::string& tie) {
    std::string t = tied;
    t.replace(t.find("TIE"), 3, tie);
    return t;
  };
  const Case cases[] = {
      {"accumulate 0", with_tie("embed.weight") + "\n", {"run.accumulate", "out of range"}},
      {"tie to a missing parameter",
       with_tie("fc9.weight"),
       {"tie_weight", "fc9.weight", "names no parameter", "embed.weight"}},
      {"tie of another shape",
       with_tie("embed.weight"),
       {"'head'", "'embed'", "[5, 8]", "[8, 16]"}},
      {"eval with an EMA that is not kept",
       R"(
[model]
layers = [ { type = "linear", out = 5 } ]
[eval]
weights = "ema"
)",
       {"eval.weights", "[ema] decay"}},
  };
  for (const auto& c : cases) {
    std::string text = std::string(kCommon) + c.text;
    if (std::string(c.what) == "accumulate 0")
      text.replace(text.find("steps = 60"), 10, "steps = 60\naccumulate = 0");
    const auto cfg = write_file("bad.toml", text);
    const auto r = run("check " + cfg.string());
    EXPECT_EQ(r.exit_code, 2) << c.what << ":\n" << r.err;
    EXPECT_NE(r.err.find("bad.toml:"), std::string::npos) << c.what << ":\n" << r.err;
    for (const auto& e : c.expect)
      EXPECT_NE(r.err.find(e), std::string::npos) << c.what << ": " << e << "\n" << r.err;
  }
}

// A residual block defined once: x -> fc1 -> relu -> fc2 -> add(fc2, x).
const char* kResidualBlock = R"(
[model.blocks.residual]
inputs = ["x"]
output = "sum"
nodes = [
  { name = "fc1", type = "linear", out = 16, inputs = ["x"] },
  { name = "act", type = "relu", inputs = ["fc1"] },
  { name = "fc2", type = "linear", out = 16, inputs = ["act"] },
  { name = "sum", type = "add", inputs = ["fc2", "x"] },
]
)";

TEST_F(ModelGraph, ARepeatedBlockTrainsLikeTheSameNodesWrittenOut) {
  // Two repetitions, then a second instance whose fc1 is wider (set), then the head: against the
  // same graph written node by node, under bf16-mixed with a dynamic scaler.
  const auto blocks = train("blocks", std::string(kResidualBlock) + R"(
[model]
nodes = [
  { name = "res", block = "residual", repeat = 2, inputs = ["input"] },
  { name = "wide", block = "residual", inputs = ["res"], set = { fc1 = { out = 24 } } },
  { name = "head", type = "linear", out = 5, inputs = ["wide"] },
]
)");
  const auto nodes = train("blocks-written-out", R"(
[model]
nodes = [
  { name = "res.0.fc1", type = "linear", out = 16, inputs = ["input"] },
  { name = "res.0.act", type = "relu", inputs = ["res.0.fc1"] },
  { name = "res.0.fc2", type = "linear", out = 16, inputs = ["res.0.act"] },
  { name = "res.0.sum", type = "add", inputs = ["res.0.fc2", "input"] },
  { name = "res.1.fc1", type = "linear", out = 16, inputs = ["res.0.sum"] },
  { name = "res.1.act", type = "relu", inputs = ["res.1.fc1"] },
  { name = "res.1.fc2", type = "linear", out = 16, inputs = ["res.1.act"] },
  { name = "res.1.sum", type = "add", inputs = ["res.1.fc2", "res.0.sum"] },
  { name = "wide.fc1", type = "linear", out = 24, inputs = ["res.1.sum"] },
  { name = "wide.act", type = "relu", inputs = ["wide.fc1"] },
  { name = "wide.fc2", type = "linear", out = 16, inputs = ["wide.act"] },
  { name = "wide.sum", type = "add", inputs = ["wide.fc2", "res.1.sum"] },
  { name = "head", type = "linear", out = 5, inputs = ["wide.sum"] },
]
)");
  ASSERT_EQ(blocks.size(), nodes.size());
  ASSERT_GE(blocks.size(), 6u);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    EXPECT_EQ(without_measures(blocks[i]), without_measures(nodes[i])) << "record " << i;
  // The resolved config holds the expanded nodes and trains again.
  const auto again = run("check " + (dir_ / "blocks" / "config.toml").string());
  EXPECT_EQ(again.exit_code, 0) << again.err;
}

TEST_F(ModelGraph, PrecisionOverrideGlobsSelectNodesInsideBlocks) {
  const std::string model = std::string(kResidualBlock) + R"(
[model]
nodes = [
  { name = "res", block = "residual", repeat = 3, inputs = ["input"] },
  { name = "head", type = "linear", out = 5, inputs = ["res"] },
]
)";
  // Every fc1 of every repetition in fp32, the rest in bf16: the run's resolved config keeps
  // the glob, and a glob that matches nothing is refused with the block's node names.
  const auto ok = write_file("glob.toml", std::string(kCommon) + model +
                                              "\n[[precision.override]]\nlayers = \"res.*.fc1\"\n"
                                              "compute = \"fp32\"\n");
  const auto r = run("check " + ok.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto none =
      write_file("noglob.toml", std::string(kCommon) + model +
                                    "\n[[precision.override]]\nlayers = \"res.*.fc3\"\n"
                                    "compute = \"fp32\"\n");
  const auto bad = run("check " + none.string());
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("res.*.fc3"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("res.2.fc1"), std::string::npos) << bad.err;
}

TEST_F(ModelGraph, BadBlocksExit2NamingTheEntryAndTheLine) {
  struct Case {
    const char* what;
    const char* text;
    std::vector<std::string> expect;
  };
  const Case cases[] = {
      {"repeated 0 times",
       R"(nodes = [
  { name = "res", block = "residual", repeat = 0, inputs = ["input"] },
  { name = "head", type = "linear", out = 5, inputs = ["res"] },
])",
       {"repeated 0 times", "repeat"}},
      {"unknown block",
       R"(nodes = [
  { name = "res", block = "residul", inputs = ["input"] },
  { name = "head", type = "linear", out = 5, inputs = ["res"] },
])",
       {"unknown block 'residul'", "did you mean 'residual'"}},
      {"set for a node the block lacks",
       R"(nodes = [
  { name = "res", block = "residual", inputs = ["input"], set = { fc3 = { out = 8 } } },
  { name = "head", type = "linear", out = 5, inputs = ["res"] },
])",
       {"no node 'fc3'", "fc1, act, fc2, sum"}},
      {"an instance with a type",
       R"(nodes = [
  { name = "res", type = "linear", block = "residual", inputs = ["input"] },
  { name = "head", type = "linear", out = 5, inputs = ["res"] },
])",
       {"no type of its own"}},
      {"an instance with the wrong input count",
       R"(nodes = [
  { name = "res", block = "residual", inputs = ["input", "input"] },
  { name = "head", type = "linear", out = 5, inputs = ["res"] },
])",
       {"takes 1 inputs (x), got 2"}},
      {"a shape mismatch inside an instance",
       R"(nodes = [
  { name = "res", block = "residual", inputs = ["input"], set = { fc2 = { out = 8 } } },
  { name = "head", type = "linear", out = 5, inputs = ["res"] },
])",
       {"'res.sum'", "shape mismatch"}},
  };
  for (const auto& c : cases) {
    const std::string text = std::string(kCommon) + kResidualBlock + "\n[model]\n" + c.text + "\n";
    const auto cfg = write_file("bad.toml", text);
    const auto r = run("check " + cfg.string());
    EXPECT_EQ(r.exit_code, 2) << c.what << ":\n" << r.err;
    EXPECT_NE(r.err.find("bad.toml:"), std::string::npos) << c.what << ":\n" << r.err;
    for (const auto& e : c.expect)
      EXPECT_NE(r.err.find(e), std::string::npos) << c.what << ": " << e << "\n" << r.err;
  }
  // A block that contains itself, through another.
  const auto cyclic = write_file("cyclic.toml", std::string(kCommon) + R"(
[model.blocks.a]
inputs = ["x"]
nodes = [{ name = "inner", block = "b", inputs = ["x"] }]

[model.blocks.b]
inputs = ["x"]
nodes = [{ name = "inner", block = "a", inputs = ["x"] }]

[model]
nodes = [
  { name = "outer", block = "a", inputs = ["input"] },
  { name = "head", type = "linear", out = 5, inputs = ["outer"] },
]
)");
  const auto r = run("check " + cyclic.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("uses itself (a, b, a)"), std::string::npos) << r.err;
}

// Errors inside expanded blocks name the entry the config writes (the block's node, or the
// instance's list entry), beside its line:column, never an index into the expanded nodes; a typo
// among a block's keys is answered with every key a block takes.
TEST_F(ModelGraph, BlockErrorsNameTheEntryTheConfigWrites) {
  struct Case {
    const char* what;
    const char* text;
    std::vector<std::string> expect;
  };
  const Case cases[] = {
      {"a block node nothing reads",
       R"(
[model.blocks.residual]
inputs = ["x"]
output = "sum"
nodes = [
  { name = "fc1", type = "linear", out = 16, inputs = ["x"] },
  { name = "dead", type = "linear", out = 16, inputs = ["x"] },
  { name = "sum", type = "add", inputs = ["fc1", "x"] },
]
[model]
nodes = [
  { name = "res", block = "residual", inputs = ["input"] },
  { name = "head", type = "linear", out = 5, inputs = ["res"] },
])",
       {"bad.toml:35:3: 'model.blocks.residual.nodes[1]': node 'res.dead' is read by no other"}},
      {"a tie after a repeated instance",
       R"(
[model.blocks.residual]
inputs = ["x"]
nodes = [
  { name = "fc1", type = "linear", out = 16, inputs = ["x"] },
  { name = "sum", type = "add", inputs = ["fc1", "x"] },
]
[model]
nodes = [
  { name = "res", block = "residual", repeat = 3, inputs = ["input"] },
  { name = "head", type = "linear", out = 5, tie_weight = "nowhere.weight", inputs = ["res"] },
])",
       {"'model.nodes[1].tie_weight': node 'head': tie_weight = \"nowhere.weight\" names no "
        "parameter"}},
      {"a typo among a block's keys",
       R"(
[model.blocks.residual]
inputs = ["x"]
outptu = "fc1"
nodes = [
  { name = "fc1", type = "linear", out = 16, inputs = ["x"] },
]
[model]
nodes = [
  { name = "res", block = "residual", inputs = ["input"] },
  { name = "head", type = "linear", out = 5, inputs = ["res"] },
])",
       {"bad.toml:32:1: 'model.blocks.residual.outptu': unknown key",
        "did you mean 'output'? known keys: inputs, nodes, output"}},
  };
  for (const auto& c : cases) {
    const auto cfg = write_file("bad.toml", std::string(kCommon) + c.text + "\n");
    const auto r = run("check " + cfg.string());
    EXPECT_EQ(r.exit_code, 2) << c.what << ":\n" << r.err;
    for (const auto& e : c.expect)
      EXPECT_NE(r.err.find(e), std::string::npos) << c.what << ": " << e << "\n" << r.err;
  }
}

// A preset's table beside a list of layers builds nothing (the list is the model): a warning
// naming the table and what selects it, where it used to be dropped without a word.
TEST_F(ModelGraph, APresetsTableBesideALayersListIsAWarning) {
  const auto unused = write_file("unused.toml", std::string(kCommon) + R"(
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 5 } ]
[model.gpt]
n_layer = 2
)");
  const auto r = run("check --skip-rehearsal " + unused.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[model.gpt] (" + unused.string() +
                       ":32:1) is ignored: [model] selects no preset and builds its model.layers "
                       "list; preset = \"gpt\" selects that table"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace mixtrain::test

// `mixtrain describe` through the real executable: it lists every section a config may hold, each
// key it prints is one the config reader accepts (at the default it prints), the selectors'
// defaults are what an empty section resolves to, and an unknown section exits 2 with a
// "did you mean".
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli_test_support.h"

namespace mixtrain::test {
namespace {

using Describe = CliTest;

struct KeyRow {
  std::string name, type, default_text;
};

// The key rows of `describe SECTION`: the lines under the "  OPTION  TYPE ..." header. Columns
// are aligned, so each row is split at the header's column starts.
std::vector<KeyRow> key_rows(const std::string& out) {
  std::istringstream in(out);
  std::string line;
  std::size_t type_at = 0, default_at = 0, range_at = 0;
  std::vector<KeyRow> rows;
  while (std::getline(in, line)) {
    if (line.rfind("  OPTION ", 0) == 0) {
      type_at = line.find("TYPE");
      default_at = line.find("DEFAULT");
      range_at = line.find("RANGE");
      continue;
    }
    if (type_at == 0 || line.size() < range_at) continue;
    auto trim = [](std::string s) {
      while (!s.empty() && s.back() == ' ') s.pop_back();
      return s;
    };
    // A long RANGE continues on lines of its own, with the other columns blank.
    if (trim(line.substr(2, type_at - 2)).empty()) continue;
    rows.push_back({trim(line.substr(2, type_at - 2)),
                    trim(line.substr(type_at, default_at - type_at)),
                    trim(line.substr(default_at, range_at - default_at))});
  }
  return rows;
}

const std::string kMinimalModel = "[model]\nlayers = [{ type = \"linear\", out = 10 }]\n";

TEST_F(Describe, ListsEveryTableTheConfigReaderKnowsAndEveryComponentAndLayer) {
  // The reader's own list of tables, from its error for an unknown one.
  const auto bad = write_file("bad.toml", kMinimalModel + "[nosuch]\nx = 1\n");
  auto r = run("check " + bad.string());
  ASSERT_EQ(r.exit_code, 2);
  const auto at = r.err.find("known tables: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  std::string list = r.err.substr(at + 14);
  list = list.substr(0, list.find('\n'));
  std::vector<std::string> tables;
  std::istringstream names(list);
  for (std::string t; std::getline(names, t, ',');)
    tables.push_back(t.substr(t.find_first_not_of(' ')));
  ASSERT_GE(tables.size(), 10u) << list;

  r = run("describe");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& t : tables) EXPECT_TRUE(has(r.out, "\n  " + t + " ")) << t << "\n" << r.out;
  for (const std::string s :
       {"data.npy", "data.cifar10", "data.tokens", "data.normalize", "model.gpt", "model.resnet",
        "precision.override", "precision.bf16-mixed", "scaler.dynamic", "optimizer.adamw",
        "checkpoint.safetensors", "backend.cpu"})
    EXPECT_TRUE(has(r.out, "\n  " + s + " ")) << s << "\n" << r.out;
  EXPECT_TRUE(has(r.out, "conv2d, batchnorm2d")) << r.out;

  // Each listed section describes itself, a component with its plugin.
  r = run("describe scaler.dynamic");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "[scaler.dynamic]: ")) << r.out;
  EXPECT_TRUE(has(r.out, "defined by: plugin 'scalers'")) << r.out;
  EXPECT_TRUE(has(r.out, "or flat in [scaler] while it is selected: type = \"dynamic\"")) << r.out;
  r = run("describe layer.conv2d");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "{ type = \"conv2d\"")) << r.out;
  EXPECT_TRUE(has(r.out, "\n  kernel ")) << r.out;
}

TEST_F(Describe, EveryKeyItPrintsIsAcceptedAtTheDefaultItPrints) {
  // The host's tables and a few components' tables, selected or not (an unselected component's
  // table is still validated).
  std::string sets;
  int keys = 0;
  for (const std::string section :
       {"run", "data", "data.synthetic", "model", "optimizer", "checkpoint", "ema", "eval",
        "scaler.dynamic", "optimizer.sgd", "backend.cpu", "precision.fp8-delayed"}) {
    auto r = run("describe " + section);
    ASSERT_EQ(r.exit_code, 0) << section << ": " << r.err;
    const auto rows = key_rows(r.out);
    ASSERT_FALSE(rows.empty()) << section << "\n" << r.out;
    for (const auto& row : rows) {
      if (row.default_text == "(required)" || row.type.find("list") != std::string::npos ||
          row.type.find("table") != std::string::npos)
        continue;
      sets += " --set '" + section + "." + row.name + "=" + row.default_text + "'";
      ++keys;
    }
  }
  ASSERT_GT(keys, 50);
  const auto config = write_file("minimal.toml", kMinimalModel);
  auto r = run("check " + config.string() + sets);
  EXPECT_EQ(r.exit_code, 0) << sets << "\n" << r.err;
  // And a key it does not print is refused there.
  r = run("check " + config.string() + " --set run.stepz=3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "did you mean 'steps'")) << r.err;
}

// Keys read as lists, and keys read beside an op's options, are described as the reader takes
// them: data.normalize's statistics are number lists, a reshape's shape is a required integer list.
TEST_F(Describe, ListKeysAndAReshapesShapeAreDescribedAsTheReaderTakesThem) {
  auto r = run("describe data.normalize");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, KeyRow> rows;
  for (const auto& row : key_rows(r.out)) rows[row.name] = row;
  for (const char* key : {"mean", "std"}) {
    EXPECT_EQ(rows[key].type, "number list") << key << "\n" << r.out;
    EXPECT_EQ(rows[key].default_text, "[]") << key << "\n" << r.out;
  }
  r = run("describe layer.reshape");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  rows.clear();
  for (const auto& row : key_rows(r.out)) rows[row.name] = row;
  ASSERT_TRUE(rows.count("shape")) << r.out;
  EXPECT_EQ(rows["shape"].type, "integer list");
  EXPECT_EQ(rows["shape"].default_text, "(required)");
  // model.blocks is a table of blocks, one sub-table each, which the reader requires (a list of
  // tables is refused), while layers and nodes are lists of tables.
  r = run("describe model");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  rows.clear();
  for (const auto& row : key_rows(r.out)) rows[row.name] = row;
  EXPECT_EQ(rows["blocks"].type, "table of tables") << r.out;
  EXPECT_EQ(rows["blocks"].default_text, "{}") << r.out;
  EXPECT_EQ(rows["layers"].type, "table list") << r.out;
  EXPECT_EQ(rows["nodes"].type, "table list") << r.out;
  const auto listed = write_file("blocks.toml", kMinimalModel + "[[model.blocks]]\nname = \"b\"\n");
  r = run("check " + listed.string() + " --skip-rehearsal");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "model.blocks is a table of blocks, one sub-table per block")) << r.err;
  // A layer without a shape key says nothing of one.
  r = run("describe layer.linear");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& row : key_rows(r.out)) EXPECT_NE(row.name, "shape") << r.out;
  // What the rows say is what the reader takes.
  const auto config = write_file(
      "reshape.toml",
      "[model]\nlayers = [{ type = \"reshape\", shape = [1, -1] }, { type = \"flatten\" }, "
      "{ type = \"linear\", out = 10 }]\n");
  r = run("check " + config.string() + " --skip-rehearsal");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(Describe, SelectorDefaultsAreWhatAConfigWithoutThemResolvesTo) {
  const auto config = write_file("minimal.toml", kMinimalModel);
  auto check = run("check " + config.string());
  ASSERT_EQ(check.exit_code, 0) << check.err;
  const std::map<std::string, std::string> selectors = {
      {"data", "source"},    {"precision", "policy"},  {"scaler", "type"},
      {"optimizer", "type"}, {"checkpoint", "format"}, {"backend", "type"}};
  for (const auto& [section, selector] : selectors) {
    auto r = run("describe " + section);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto marker = r.out.find(" (default)");
    ASSERT_NE(marker, std::string::npos) << section << "\n" << r.out;
    const auto start = r.out.find_last_of(" ", marker - 1) + 1;
    const std::string def = r.out.substr(start, marker - start);
    EXPECT_TRUE(has(check.out, "[" + section + "]\n" + selector + " = \"" + def + "\"\n"))
        << section << " default " << def << "\n"
        << check.out;
  }
}

TEST_F(Describe, AnUnknownSectionExits2WithTheNearestName) {
  auto r = run("describe scaler.dynamc");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "no config section 'scaler.dynamc'")) << r.err;
  EXPECT_TRUE(has(r.err, "did you mean 'scaler.dynamic'?")) << r.err;
  // plugins --describe's host/ and data/ spellings print the same sections.
  EXPECT_EQ(run("plugins --describe host/run").out, run("describe run").out);
  EXPECT_EQ(run("plugins --describe data/npy").out, run("describe data.npy").out);
}

}  // namespace
}  // namespace mixtrain::test

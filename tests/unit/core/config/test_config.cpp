// core::Config: TOML parsing with locations, and `--set` overrides.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "mixtrain/core/config/config.h"

namespace sdk = mixtrain::sdk;
using mixtrain::core::Config;

namespace {

// Line and column numbers below refer to this text (columns are 1-based).
const char* const kText =
    "[run]\n"                           // 1
    "name = \"demo\"\n"                 // 2
    "steps = 300\n"                     // 3
    "\n"                                // 4
    "[optimizer]\n"                     // 5
    "type = \"adamw\"\n"                // 6
    "lr   = 0.003\n"                    // 7
    "\n"                                // 8
    "[model]\n"                         // 9
    "layers = [\n"                      // 10
    "  { type = \"linear\", out = 8 },\n"  // 11
    "  { type = \"relu\" },\n"          // 12
    "  { type = \"linear\", out = 2 },\n"  // 13
    "]\n"                               // 14
    "\n"                                // 15
    "[[precision.override]]\n"          // 16
    "layers = \"fc*\"\n";               // 17

Config parse(const std::vector<std::string>& overrides = {}) {
  return Config::from_string(kText, "demo.toml", overrides);
}

std::optional<sdk::ConfigError> config_error(const std::string& text,
                                             const std::vector<std::string>& overrides = {}) {
  try {
    Config::from_string(text, "bad.toml", overrides);
  } catch (const sdk::ConfigError& e) {
    return e;
  }
  return std::nullopt;
}

const sdk::RawOption* find(const std::vector<sdk::RawOption>& raw, const std::string& key) {
  for (const auto& r : raw)
    if (r.key == key) return &r;
  return nullptr;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// toml++ recurses once per nesting level; tens of thousands overflow the stack. Refused at the
// line.
TEST(sdk_Config, AnAbsurdlyDottedKeyIsRefusedAtItsLine) {
  std::string parts = "a";
  for (int i = 0; i < 50000; ++i) parts += ".a";
  // A header, a key, and a key inside an inline table, on its own line or one that continues a
  // list (toml++ recursed into the last two and crashed).
  for (const std::string& text :
       {"[run]\nsteps = 1\n[" + parts + "]\n", "  " + parts + " = 1\n", "x = {" + parts + " = 1}\n",
        "x = [\n  {b = \"1.5\", " + parts + " = 1},\n]\n",
        // a header whose first part is a quoted ']'
        "[\"]\"" + parts.substr(1) + "]\nb = 1\n"}) {
    auto e = config_error(text);
    ASSERT_TRUE(e.has_value());
    EXPECT_TRUE(contains(e->what(), "50001 dotted parts")) << e->what();
  }
  EXPECT_EQ(config_error("  " + parts.substr(0, 2000) + " = 1\n")->where().line, 1u);
  EXPECT_EQ(config_error("  " + parts.substr(0, 2000) + " = 1\n")->where().column, 3u);
  // A dotted key of ordinary depth is TOML as usual.
  EXPECT_FALSE(config_error("a.b.c = 1\n").has_value());
  // Inline tables nested on one line: each key is short, the tree they make is deep.
  std::string nested = "1";
  for (int i = 0; i < 200; ++i) nested = "{k.k.k.k.k.k.k = " + nested + "}";  // 1200 parts
  EXPECT_TRUE(contains(config_error("x = " + nested + "\n")->what(), "dotted parts on one line"));
  // Quoted parts count as parts; their own dots do not.
  std::string quoted = "\"a\"";
  for (int i = 0; i < 50000; ++i) quoted += ".\"a.b\"";
  EXPECT_TRUE(contains(config_error(quoted + " = 1\n")->what(), "50001 dotted parts"));
}

// A line that continues a list is no key: a thousand dotted strings or decimals on it are fine.
TEST(sdk_Config, ALongListOfDottedEntriesIsNoDeepKey) {
  std::string names = "[train]\ntrainable = [\n  ";
  std::string numbers = "[run]\nx = [\n  ";
  for (int i = 0; i < 1500; ++i) {
    names += "\"fc1.weight\", ";
    numbers += "1.5, ";
  }
  names += "\n]\n";
  numbers += "\n]\n";
  // A nested list of decimals on a line of its own starts with '[' yet is no header.
  std::string nested = "[run]\nx = [\n  [";
  for (int i = 0; i < 1500; ++i) nested += "0.5, ";
  nested += "],\n]\n";
  EXPECT_FALSE(config_error(nested).has_value()) << config_error(nested)->what();
  EXPECT_FALSE(config_error(names).has_value()) << config_error(names)->what();
  EXPECT_FALSE(config_error(numbers).has_value()) << config_error(numbers)->what();
}

TEST(sdk_Config, SyntaxErrorHasLineAndColumn) {
  //                                  col: 12345678
  auto e = config_error("[run]\nsteps = 10\nname = @oops\n");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->where().file, "bad.toml");
  EXPECT_EQ(e->where().line, 3u);
  EXPECT_EQ(e->where().column, 8u);
  EXPECT_EQ(std::string(e->what()).rfind("bad.toml:3:8: TOML syntax error", 0), 0u) << e->what();

  e = config_error("a = 1\n[table\nb = 2\n");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->where().line, 2u);

  // A duplicate key is a syntax error at the second definition.
  e = config_error("[run]\nsteps = 1\nsteps = 2\n");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->where().line, 3u);
}

TEST(sdk_Config, MissingFileIsAConfigError) {
  try {
    Config::from_file("/nonexistent/mixtrain/run.toml");
    FAIL() << "no error";
  } catch (const sdk::ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "/nonexistent/mixtrain/run.toml")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cannot open")) << e.what();
  }
}

TEST(sdk_Config, ValuesAndTablesPointAtTheirLines) {
  auto c = parse();
  EXPECT_EQ(c.source_name(), "demo.toml");
  EXPECT_EQ(c.location("run").to_string(), "demo.toml:1:1");
  EXPECT_EQ(c.location("run.name").to_string(), "demo.toml:2:8");
  EXPECT_EQ(c.location("run.steps").to_string(), "demo.toml:3:9");
  EXPECT_EQ(c.location("optimizer").to_string(), "demo.toml:5:1");
  EXPECT_EQ(c.location("optimizer.lr").to_string(), "demo.toml:7:8");
  EXPECT_EQ(c.location("model.layers.1").to_string(), "demo.toml:12:3");
  EXPECT_EQ(c.location("model.layers.2.out").to_string(), "demo.toml:13:28");
  EXPECT_EQ(c.location("nothing.here").to_string(), "demo.toml");

  // The key's own place, for errors about the key (an unknown one): its name, not its value.
  EXPECT_EQ(c.key_location("optimizer.lr").to_string(), "demo.toml:7:1");
  EXPECT_EQ(c.key_location("run.steps").to_string(), "demo.toml:3:1");
  EXPECT_EQ(c.key_location("model.layers.2.out").to_string(), "demo.toml:13:22");
  EXPECT_EQ(c.key_location("nothing.here").to_string(), "demo.toml");
  // A --set key has no place in the file: it names the --set, as location() does.
  const auto set = parse({"optimizer.lr=0.5"});
  EXPECT_EQ(set.key_location("optimizer.lr").to_string(), set.location("optimizer.lr").to_string());
  EXPECT_NE(set.key_location("optimizer.lr").to_string(), "demo.toml:7:1");

  auto raw = c.table_options("optimizer");
  ASSERT_EQ(raw.size(), 2u);
  const auto* lr = find(raw, "lr");
  ASSERT_NE(lr, nullptr);
  EXPECT_EQ(std::get<double>(lr->value), 0.003);
  EXPECT_EQ(lr->where.to_string(), "demo.toml:7:8");

  auto layers = c.table_array("model.layers");
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[2].where.to_string(), "demo.toml:13:3");
  const auto* out = find(layers[2].options, "out");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(std::get<std::int64_t>(out->value), 2);
  EXPECT_EQ(out->where.to_string(), "demo.toml:13:28");

  auto overrides = c.table_array("precision.override");
  ASSERT_EQ(overrides.size(), 1u);
  EXPECT_EQ(overrides[0].where.line, 16u);
  EXPECT_EQ(overrides[0].options[0].where.to_string(), "demo.toml:17:10");
}

TEST(sdk_Config, TableAccessors) {
  auto c = parse();
  auto keys = c.top_level_keys();
  std::sort(keys.begin(), keys.end());  // no order is promised
  EXPECT_EQ(keys, (std::vector<std::string>{"model", "optimizer", "precision", "run"}));
  EXPECT_TRUE(c.has_table("run"));
  EXPECT_TRUE(c.has_table("model.layers.0"));
  EXPECT_FALSE(c.has_table("run.steps"));
  EXPECT_FALSE(c.has_table("scaler"));
  EXPECT_TRUE(c.table_options("scaler").empty());
  EXPECT_TRUE(c.table_array("data.files").empty());
  // Arrays of tables are skipped by table_options; [model] has nothing else.
  EXPECT_TRUE(c.table_options("model").empty());
  // Only the listed keys are skipped.
  auto raw = c.table_options("optimizer", {"type"});
  ASSERT_EQ(raw.size(), 1u);
  EXPECT_EQ(raw[0].key, "lr");
}

TEST(sdk_Config, NonScalarValuesAreRejectedWithTheirLocation) {
  auto c = Config::from_string("[scaler]\ntype = \"static\"\nscale = [1, 2]\n", "s.toml");
  try {
    c.table_options("scaler");
    FAIL() << "no error";
  } catch (const sdk::ConfigError& e) {
    EXPECT_EQ(e.key(), "scaler.scale");
    EXPECT_EQ(e.where().line, 3u);
  }
  // A scalar where a table is expected.
  auto d = Config::from_string("scaler = 3\n", "s.toml");
  EXPECT_THROW(d.table_options("scaler"), sdk::ConfigError);
  EXPECT_THROW(d.table_array("scaler"), sdk::ConfigError);
}

TEST(sdk_Config, StringArray) {
  auto c = Config::from_string("[plugins]\npaths = [\"a\", \"b\"]\n[x]\np = \"one\"\nq = [1]\n",
                               "p.toml");
  EXPECT_EQ(c.string_array("plugins.paths"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.string_array("x.p"), (std::vector<std::string>{"one"}));
  EXPECT_TRUE(c.string_array("nothing").empty());
  EXPECT_THROW(c.string_array("x.q"), sdk::ConfigError);
}

TEST(sdk_ConfigOverride, ExistingKeyIsReplacedAndPointsAtTheOverride) {
  auto c = parse({"run.steps=20"});
  auto raw = c.table_options("run");
  const auto* steps = find(raw, "steps");
  ASSERT_NE(steps, nullptr);
  EXPECT_EQ(std::get<std::int64_t>(steps->value), 20);
  EXPECT_EQ(steps->where.to_string(), "--set run.steps=20");
  // Other keys keep their file locations.
  EXPECT_EQ(find(raw, "name")->where.to_string(), "demo.toml:2:8");
}

TEST(sdk_ConfigOverride, TypedValues) {
  auto c = parse({"run.seed=7", "optimizer.lr=0.5", "optimizer.nesterov=true",
                  "optimizer.type=sgd", "run.name=\"quoted name\"", "optimizer.big=1e-8",
                  "run.dir=runs/x y", "optimizer.neg=-3"});
  auto run = c.table_options("run");
  EXPECT_EQ(std::get<std::int64_t>(find(run, "seed")->value), 7);
  EXPECT_EQ(std::get<std::string>(find(run, "name")->value), "quoted name");
  // Not a TOML value: taken as the string it is.
  EXPECT_EQ(std::get<std::string>(find(run, "dir")->value), "runs/x y");
  auto opt = c.table_options("optimizer");
  EXPECT_EQ(std::get<double>(find(opt, "lr")->value), 0.5);
  EXPECT_EQ(std::get<bool>(find(opt, "nesterov")->value), true);
  EXPECT_EQ(std::get<std::string>(find(opt, "type")->value), "sgd");
  EXPECT_EQ(std::get<double>(find(opt, "big")->value), 1e-8);
  EXPECT_EQ(std::get<std::int64_t>(find(opt, "neg")->value), -3);
}

TEST(sdk_ConfigOverride, NewKeysAndNewTables) {
  auto c = parse({"scaler.type=dynamic", "scaler.init_scale=1024.0", "run.eval_every=5"});
  EXPECT_TRUE(c.has_table("scaler"));
  auto scaler = c.table_options("scaler");
  ASSERT_EQ(scaler.size(), 2u);
  EXPECT_EQ(std::get<std::string>(find(scaler, "type")->value), "dynamic");
  EXPECT_EQ(std::get<double>(find(scaler, "init_scale")->value), 1024.0);
  EXPECT_EQ(find(scaler, "type")->where.to_string(), "--set scaler.type=dynamic");
  EXPECT_EQ(std::get<std::int64_t>(find(c.table_options("run"), "eval_every")->value), 5);
}

TEST(sdk_ConfigOverride, LaterOverrideWins) {
  auto c = parse({"run.steps=5", "run.steps=6"});
  const auto run = c.table_options("run");
  const auto* steps = find(run, "steps");
  ASSERT_NE(steps, nullptr);
  EXPECT_EQ(std::get<std::int64_t>(steps->value), 6);
  EXPECT_EQ(steps->where.to_string(), "--set run.steps=6");
}

TEST(sdk_ConfigOverride, IntoArraysOfTablesByIndex) {
  auto c = parse({"model.layers.1.out=7", "model.layers.2.out=5", "precision.override.0.compute=bf16"});
  auto layers = c.table_array("model.layers");
  ASSERT_EQ(layers.size(), 3u);
  const auto* out1 = find(layers[1].options, "out");
  ASSERT_NE(out1, nullptr);
  EXPECT_EQ(std::get<std::int64_t>(out1->value), 7);
  EXPECT_EQ(out1->where.to_string(), "--set model.layers.1.out=7");
  EXPECT_EQ(std::get<std::int64_t>(find(layers[2].options, "out")->value), 5);
  EXPECT_EQ(std::get<std::int64_t>(find(layers[0].options, "out")->value), 8);
  auto ov = c.table_array("precision.override");
  EXPECT_EQ(std::get<std::string>(find(ov[0].options, "compute")->value), "bf16");
}

// An entry of a plain list, or a whole entry of an array of tables, is replaced by index.
TEST(sdk_ConfigOverride, ReplacesAListEntryByIndex) {
  const char* const text = "[model]\nblocks = [3, 3, 3]\nlayers = [{ type = \"relu\" }]\n";
  auto c = Config::from_string(text, "demo.toml",
                               {"model.blocks.1=5", "model.layers.0={type=\"linear\", out=4}"});
  EXPECT_EQ(c.integer_array("model.blocks"), (std::vector<std::int64_t>{3, 5, 3}));
  const auto layers = c.table_array("model.layers");
  ASSERT_EQ(layers.size(), 1u);
  EXPECT_EQ(std::get<std::string>(find(layers[0].options, "type")->value), "linear");
  EXPECT_EQ(std::get<std::int64_t>(find(layers[0].options, "out")->value), 4);
  const auto error = config_error(text, {"model.blocks.3=1"});
  ASSERT_TRUE(error.has_value());
  EXPECT_TRUE(contains(error->what(), "index 3 is out of range (the array has 3 entries)"))
      << error->what();
  EXPECT_TRUE(contains(error->hint(), "model.blocks=[...]")) << error->hint();
}

// A command line's bytes that are not UTF-8 are refused at the --set: kept, they would make the
// run's config.toml unreadable (a resume included).
TEST(sdk_ConfigOverride, AValueThatIsNotUtf8IsRefused) {
  const auto error = config_error(kText, {"run.name=f\xff\xfeo"});
  ASSERT_TRUE(error.has_value());
  EXPECT_TRUE(contains(error->what(), "the value is not valid UTF-8 text")) << error->what();
  EXPECT_NO_THROW(parse({"run.name=f\xc3\xa9o"}));  // é
}

// A list under a name the table's reader does not read as a list is most often a list key
// misspelled: the error says so and names the nearest list key, not "arrays are not valid".
TEST(sdk_ConfigTableOptions, AListUnderAnotherNameNamesTheNearestListKey) {
  const auto c = Config::from_string("[optimizer]\nlr = 0.1\nmilestone = [100, 200]\n", "o.toml");
  try {
    (void)c.table_options("optimizer", {"milestones"});
    ADD_FAILURE() << "no error";
  } catch (const sdk::ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "o.toml:3:13")) << e.what();
    EXPECT_TRUE(contains(e.what(), "a list, but no list of [optimizer] has that name")) << e.what();
    EXPECT_EQ(e.hint(), "did you mean 'milestones'?");
  }
  try {
    (void)c.table_options("optimizer");
    ADD_FAILURE() << "no error";
  } catch (const sdk::ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "a list, but [optimizer] takes no list")) << e.what();
  }
}

TEST(sdk_ConfigOverride, MalformedOverridesAreConfigErrors) {
  struct Case {
    std::string spec, message;
  };
  const std::vector<Case> cases = {
      {"noequals", "key=value"},
      {"=5", "key=value"},
      {"a..b=1", "empty key segment"},
      {".a=1", "empty key segment"},
      {"a.=1", "empty key segment"},
      {"model.layers.9.out=1", "index 9 is out of range (the array has 3 entries)"},
      {"run.steps.deep=1", "the parent of 'deep' is neither a table nor a list"},
      {"run.steps.deep.x=1", "'run.steps' is not a table"},
      {"model.layers.x.out=1", "'model.layers' is an array"},
      {"model.layers.x=1", "the parent of 'x' is a list, so it must be an index"},
      // Meant as TOML (a list, a table, a quoted string) but not valid: said, not kept as text.
      {"run.name=\"abc", "the value is not valid TOML"},
      {"model.layers=[{type=\"relu\"}", "the value is not valid TOML"},
  };
  for (const auto& c : cases) {
    try {
      parse({c.spec});
      ADD_FAILURE() << c.spec << ": no error";
    } catch (const sdk::ConfigError& e) {
      EXPECT_TRUE(contains(e.what(), c.message)) << c.spec << ": " << e.what();
      // The message says which override it was.
      EXPECT_TRUE(contains(e.what(), "--set " + c.spec)) << e.what();
    }
  }
}

// An index past a list's end, inside the key as at its end, says which entries exist, and the
// entries it names can be set.
TEST(sdk_ConfigOverride, AnIndexOutOfRangeNamesTheEntriesThatExist) {
  try {
    parse({"model.layers.9.out=1"});
    ADD_FAILURE() << "no error";
  } catch (const sdk::ConfigError& e) {
    EXPECT_TRUE(contains(e.hint(),
                         "set an entry from model.layers.0 to model.layers.2, or give "
                         "the whole list: model.layers=[...]"))
        << e.hint();
  }
  EXPECT_NO_THROW(parse({"model.layers.2.out=1"}));
}

// --merge: a file over the config, before --set. Tables merge key by key; an array (of tables too)
// is replaced whole; merged values point at their own file; --set still wins.
TEST(sdk_ConfigMerge, TablesMergeArraysReplaceAndLocationsNameTheMergedFile) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mixtrain_merge_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "precision.toml";
  {
    std::ofstream(file) << "[optimizer]\n"                     // 1
                           "lr = 0.01\n"                       // 2
                           "\n"                                // 3
                           "[[precision.override]]\n"          // 4
                           "layers = \"head\"\n"               // 5
                           "compute = \"fp32\"\n"              // 6
                           "\n"                                // 7
                           "[[precision.override]]\n"          // 8
                           "layers = \"fc1\"\n"                // 9
                           "[scaler]\n"                        // 10
                           "type = \"dynamic\"\n";             // 11
  }
  const Config c = Config::from_string(kText, "demo.toml", {"optimizer.lr=0.5"}, {file});
  // [optimizer] merged key by key: type stays from the config, lr came from the file, then --set.
  const auto opt = c.table_options("optimizer");
  ASSERT_NE(find(opt, "type"), nullptr);
  EXPECT_EQ(std::get<std::string>(find(opt, "type")->value), "adamw");
  EXPECT_EQ(find(opt, "type")->where.file, "demo.toml");
  EXPECT_DOUBLE_EQ(std::get<double>(find(opt, "lr")->value), 0.5);
  // The config's one override entry ("fc*") is replaced by the file's two.
  const auto entries = c.table_array("precision.override");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(std::get<std::string>(find(entries[0].options, "layers")->value), "head");
  EXPECT_EQ(entries[0].where.file, file.string());
  EXPECT_EQ(entries[0].where.line, 4u);  // the entry's [[precision.override]] line
  EXPECT_EQ(std::get<std::string>(find(entries[1].options, "layers")->value), "fc1");
  // A table the config lacked arrives whole, at the merged file's line, and relative paths in the
  // merged values resolve against its folder; the config's own against the config's.
  EXPECT_EQ(c.location("scaler.type").file, file.string());
  EXPECT_EQ(c.location("scaler.type").line, 11u);
  EXPECT_EQ(c.path_base("scaler.type"), dir);
  EXPECT_EQ(c.path_base("run.name"), c.base_dir());
  EXPECT_EQ(c.path_base("optimizer.lr"), std::filesystem::current_path());  // the --set
  std::filesystem::remove_all(dir);
}

TEST(sdk_ConfigMerge, AMissingFolderOrBrokenFileIsAConfigErrorNamingIt) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mixtrain_merge_bad_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "broken.toml") << "[precision\npolicy = 1\n"; }
  const std::vector<std::pair<std::filesystem::path, std::string>> cases = {
      {dir / "missing.toml", "cannot open the file given to --merge"},
      {dir, "this is a folder, not a TOML file to merge"},
      {dir / "broken.toml", "TOML syntax error"},
  };
  for (const auto& [path, message] : cases) {
    try {
      Config::from_string(kText, "demo.toml", {}, {path});
      ADD_FAILURE() << path << ": no error";
    } catch (const sdk::ConfigError& e) {
      EXPECT_TRUE(contains(e.what(), message)) << e.what();
      EXPECT_TRUE(contains(e.what(), path.string())) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

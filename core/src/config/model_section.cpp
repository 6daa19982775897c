#include "config/model_section.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "config/model_presets.h"
#include "config/reading.h"
#include "graph/ops/op_registry.h"
#include "mixtrain/core/checkpoint/hf_folder.h"
#include "mixtrain/core/config/host_schemas.h"

namespace mixtrain::core {

namespace {

// The [model] section of the resolved config. loss_chunk_rows and loss_pad_classes unset are left
// unset there: their effective values depend on the class count and the backend
// (graph/model_spec.h), and a resumed run or an evaluation reading the resolved config on another
// backend must decide them as a run there would.
ResolvedSection model_section_of(const sdk::Options& model, const ModelSpec& spec) {
  ResolvedSection m = section_of("model", {}, model);
  // recompute is a list, read beside the schema: written as the op types it resolved to.
  std::erase_if(m.values, [](const auto& kv) { return kv.first == "recompute"; });
  std::string types = "[";
  for (std::size_t i = 0; i < spec.recompute.size(); ++i)
    types += (i ? ", " : "") + sdk::option_value_to_string(spec.recompute[i]);
  m.raw_values.emplace_back("recompute", types + "]");
  const auto leave_unset = [&](const std::string& key, std::string note) {
    if (model.was_set(key)) return;
    std::erase_if(m.values, [&](const auto& v) { return v.first == key; });
    m.comments.push_back(std::move(note));
  };
  leave_unset(
      "loss_chunk_rows",
      "loss_chunk_rows unset: for a model of 4096 classes or more, 512 rows on a backend whose "
      "GEMMs reach their rate at a few hundred rows (the CPU) and 1024 on others (CUDA), "
      "else 0 (whole)");
  leave_unset("loss_pad_classes",
              "loss_pad_classes unset: 64 on a backend whose GEMMs want rows 16 bytes apart (CUDA) "
              "for a class count that is not a multiple of 8, else 0");
  return m;
}

const std::vector<std::string> kArrayKeys = {"inputs", "shape"};

// [model] recompute: op types whose outputs the backward computes again (ModelSpec::recompute),
// each one the op table marks recomputable.
void read_recompute(const Config& config, ModelSpec& model) {
  const std::string key = "model.recompute";
  const auto types = config.string_array(key);
  const bool array = config.is_array(key);
  model.recompute_where = config.location(key);
  const std::string recomputable = join_names(recomputable_op_types());
  for (std::size_t i = 0; i < types.size(); ++i) {
    const auto where =
        array ? config.location(key + "." + std::to_string(i)) : model.recompute_where;
    const std::string entry = array ? key + "[" + std::to_string(i) + "]" : key;
    const OpDefinition* op = find_op(types[i]);
    if (op == nullptr)
      throw sdk::ConfigError(
          where, entry, "'" + types[i] + "' is no op type",
          "name op types whose outputs the backward may compute again: " + recomputable);
    if (!op->recomputable)
      throw sdk::ConfigError(where, entry,
                             "a " + types[i] +
                                 "'s output cannot be computed again for the backward: the op "
                                 "table does not mark it recomputable (its forward moves state "
                                 "a second run would move again, or it is not worth running twice)",
                             "recompute only " + recomputable + ", or remove '" + types[i] + "'");
    if (std::find(model.recompute.begin(), model.recompute.end(), types[i]) ==
        model.recompute.end())
      model.recompute.push_back(types[i]);
  }
}

// One entry of a node list (the model's or a block's), before blocks are expanded.
struct RawNode {
  std::string table;   // "model.nodes[3]", for messages
  std::string dotted;  // "model.nodes.3", for Config lookups
  sdk::SourceLocation where;
  std::vector<sdk::RawOption> options;  // the op's keys, with type and name
  std::string type, name, block;
  std::vector<std::string> inputs;
  std::vector<std::int64_t> shape;
  std::int64_t repeat = 1;
  sdk::SourceLocation repeat_where;
  // Where block and inputs were written: a --set of either is blamed on the --set, not the entry.
  sdk::SourceLocation block_where, inputs_where;
  std::map<std::string, std::vector<sdk::RawOption>> set;  // block node -> options it changes
  sdk::SourceLocation set_where;
};

struct BlockDef {
  std::string name;
  sdk::SourceLocation where;
  std::vector<std::string> inputs;
  std::string output;  // a node of the block
  std::vector<RawNode> nodes;
};

std::string toml_list(const std::vector<std::string>& items) {
  std::string text = "[";
  for (std::size_t k = 0; k < items.size(); ++k)
    text += (k ? ", " : "") + sdk::option_value_to_string(items[k]);
  return text + "]";
}

std::string toml_list(const std::vector<std::int64_t>& items) {
  std::string text = "[";
  for (std::size_t k = 0; k < items.size(); ++k) text += (k ? ", " : "") + std::to_string(items[k]);
  return text + "]";
}

// Reads one entry: the block keys (block, repeat, set) apart from the op's.
RawNode read_node(const Config& config, const TableEntry& entry, const std::string& list,
                  std::size_t i) {
  RawNode n;
  n.table = list + "[" + std::to_string(i) + "]";
  n.dotted = list + "." + std::to_string(i);
  n.where = entry.where;
  n.block = string_key(entry.options, "block", "", n.table);
  n.block_where = key_location(entry.options, "block", n.where);
  n.inputs_where =
      config.is_array(n.dotted + ".inputs") ? config.location(n.dotted + ".inputs") : n.where;
  for (const auto& r : entry.options) {
    if (r.key == "block") continue;
    if (r.key == "repeat") {
      const auto* v = std::get_if<std::int64_t>(&r.value);
      if (v == nullptr) throw sdk::ConfigError(r.where, n.table + ".repeat", "expected an integer");
      n.repeat = *v;
      n.repeat_where = r.where;
      continue;
    }
    n.options.push_back(r);
  }
  n.type = string_key(n.options, "type", "", n.table);
  n.name = string_key(n.options, "name", "", n.table);
  n.inputs = config.string_array(n.dotted + ".inputs");
  n.shape = config.integer_array(n.dotted + ".shape");
  if (n.block.empty()) {
    reject_nested(config, n.dotted);
    if (!n.repeat_where.file.empty())
      throw sdk::ConfigError(n.repeat_where, n.table + ".repeat",
                             "repeat belongs to a block instance",
                             "write block = \"<block>\" beside it, or drop repeat");
    return n;
  }
  reject_nested(config, n.dotted, {"set"});
  if (!n.type.empty())
    throw sdk::ConfigError(key_location(n.options, "type", n.where), n.table + ".type",
                           "a block instance has no type of its own (block = \"" + n.block + "\")",
                           "drop type; the block's nodes have theirs");
  if (n.repeat < 1)
    throw sdk::ConfigError(
        n.repeat_where, n.table + ".repeat",
        "block '" + n.block + "' is repeated " + std::to_string(n.repeat) + " times",
        "repeat is at least 1; remove the node to leave the block out");
  for (const auto& r : n.options)
    if (r.key != "name")
      throw sdk::ConfigError(r.where, n.table + "." + r.key,
                             "unknown key '" + r.key + "' for a block instance",
                             "a block instance takes name, block, inputs, repeat and set = { "
                             "<node> = { <option> = value } }");
  const std::string set = n.dotted + ".set";
  if (config.has_table(set)) {
    n.set_where = config.location(set);
    if (!config.table_options(set).empty())
      throw sdk::ConfigError(n.set_where, n.table + ".set", "set maps block nodes to options",
                             "set = { fc1 = { out = 128 } }");
    for (const auto& node : config.nested_keys(set)) {
      reject_nested(config, set + "." + node);
      n.set[node] = config.table_options(set + "." + node);
    }
  }
  return n;
}

std::map<std::string, BlockDef> read_blocks(const Config& config) {
  std::map<std::string, BlockDef> blocks;
  if (!config.has_table("model.blocks")) {
    // `blocks = 5` or `[[model.blocks]]`: [model] skips the key, so it would vanish unread.
    if (config.is_array("model.blocks") || config.location("model.blocks").line != 0)
      throw sdk::ConfigError(config.location("model.blocks"), "model.blocks",
                             "model.blocks is a table of blocks, one sub-table per block",
                             "define a block as [model.blocks.residual] inputs = [\"x\"], "
                             "nodes = [...]; the ResNet preset's blocks per stage go in "
                             "[model.resnet] blocks = [3, 4, 6, 3]");
    return blocks;
  }
  if (!config.table_options("model.blocks").empty())
    throw sdk::ConfigError(config.location("model.blocks"), "model.blocks",
                           "model.blocks holds one table per block",
                           "[model.blocks.residual] inputs = [\"x\"], nodes = [...]");
  for (const auto& name : config.nested_keys("model.blocks")) {
    const std::string table = "model.blocks." + name;
    reject_nested(config, table, {"nodes"});
    BlockDef b;
    b.name = name;
    b.where = config.location(table);
    const auto raw = config.table_options(table, kArrayKeys);
    // inputs and nodes are read apart from the options below, so the schema's "known keys" would
    // name output alone: a typo is answered with every key a block takes.
    const std::vector<std::string> block_keys = {"inputs", "nodes", "output"};
    for (const auto& r : raw)
      if (std::find(block_keys.begin(), block_keys.end(), r.key) == block_keys.end()) {
        const auto near = sdk::closest_match(r.key, block_keys);
        throw sdk::ConfigError(r.where, table + "." + r.key, "unknown key",
                               (near.empty() ? "" : "did you mean '" + near + "'? ") +
                                   "known keys: " + join_names(block_keys));
      }
    auto o =
        sdk::Options::resolve(table,
                              {sdk::OptionSpec::string("output", "",
                                                       "the node whose output the block returns "
                                                       "(default: its last node)")},
                              raw, b.where, {});
    b.inputs = config.string_array(table + ".inputs");
    if (b.inputs.empty())
      throw sdk::ConfigError(b.where, table + ".inputs", "block '" + name + "' has no inputs",
                             "name what its nodes read: inputs = [\"x\"]");
    const auto entries = config.table_array(table + ".nodes", kArrayKeys);
    if (entries.empty())
      throw sdk::ConfigError(b.where, table + ".nodes", "block '" + name + "' has no nodes",
                             "nodes = [ { name = \"fc\", type = \"linear\", inputs = [\"x\"], "
                             "out = 64 } ]");
    std::set<std::string> names(b.inputs.begin(), b.inputs.end());
    for (std::size_t i = 0; i < entries.size(); ++i) {
      RawNode n = read_node(config, entries[i], table + ".nodes", i);
      if (n.name.empty() || n.name.find('.') != std::string::npos)
        throw sdk::ConfigError(n.where, n.table + ".name",
                               n.name.empty() ? "a block node needs a name"
                                              : "block node name '" + n.name + "' has a '.'",
                               "instances name it <instance>.<node>: name = \"fc1\"");
      if (n.inputs.empty())
        throw sdk::ConfigError(n.where, n.table + ".inputs", "a node needs its inputs",
                               "block nodes read the block's inputs (" + join_names(b.inputs) +
                                   ") or its other nodes");
      if (!names.insert(n.name).second)
        throw sdk::ConfigError(n.where, n.table + ".name",
                               "name '" + n.name + "' is used twice in block '" + name + "'",
                               "names in a block are unique, its inputs included");
      b.nodes.push_back(std::move(n));
    }
    b.output = o.get_string("output");
    if (b.output.empty()) b.output = b.nodes.back().name;
    const bool known = std::any_of(b.nodes.begin(), b.nodes.end(),
                                   [&](const RawNode& n) { return n.name == b.output; });
    if (!known)
      throw sdk::ConfigError(o.where("output"), table + ".output",
                             "block '" + name + "' has no node '" + b.output + "'",
                             "output names one of the block's nodes");
    blocks.emplace(name, std::move(b));
  }
  return blocks;
}

// Far above any real network (ResNet-152 has ~500 nodes, GPT-3's graph ~1,200), far below what
// exhausts memory.
constexpr std::size_t kMaxModelNodes = 1'000'000;

// Expands block instances into op nodes with global names; inputs are resolved at the end, when
// every instance's output is known (graph nodes may read nodes declared after them).
class ModelExpansion {
 public:
  explicit ModelExpansion(const std::map<std::string, BlockDef>& blocks) : blocks_(blocks) {}

  // `input_of` maps a name the node reads to its global name; `prefix` is prepended to its own.
  void add(const RawNode& n, const std::string& prefix,
           const std::function<std::string(const std::string&)>& input_of,
           const std::vector<sdk::RawOption>* changes) {
    std::vector<std::string> inputs;
    for (const auto& in : n.inputs) inputs.push_back(input_of(in));
    const std::string global = prefix + n.name;
    if (n.block.empty()) {
      add_op(n, global, std::move(inputs), changes);
      return;
    }
    const BlockDef& b = block_of(n);
    check_instance(n, b, inputs);
    add_instance(n, b, global, inputs);
  }

  // The expanded nodes, inputs naming instances replaced by the instances' outputs.
  std::vector<LayerSpec> finish() {
    for (auto& l : nodes_)
      for (auto& in : l.inputs)
        for (auto it = aliases_.find(in); it != aliases_.end(); it = aliases_.find(in))
          in = it->second;
    return std::move(nodes_);
  }

 private:
  // An op node; `changes` (an instance's `set` for it) replace or add options.
  void add_op(const RawNode& n, const std::string& global, std::vector<std::string> inputs,
              const std::vector<sdk::RawOption>* changes) {
    // Repeats multiply through nested blocks: a typo's 1e9 nodes must be an error here, not
    // a machine out of memory later.
    if (nodes_.size() >= kMaxModelNodes) {
      const RawNode& outer = instances_.empty() ? n : *instances_.front();
      throw sdk::ConfigError(
          outer.repeat_where.file.empty() ? outer.where : outer.repeat_where, outer.table,
          "the model expands to more than " + std::to_string(kMaxModelNodes) +
              " nodes (the limit) at " + global,
          "check the repeat counts of block instances, nested blocks multiply them");
    }
    LayerSpec l;
    l.type = n.type;
    l.name = global;
    l.where = n.where;
    l.inputs = std::move(inputs);
    l.shape = n.shape;
    l.options = n.options;
    if (changes != nullptr)
      for (const auto& c : *changes) {
        auto it = std::find_if(l.options.begin(), l.options.end(),
                               [&](const sdk::RawOption& r) { return r.key == c.key; });
        if (it != l.options.end())
          *it = c;
        else
          l.options.push_back(c);
      }
    l.table = n.table;
    nodes_.push_back(std::move(l));
  }

  const BlockDef& block_of(const RawNode& n) const {
    const auto found = blocks_.find(n.block);
    if (found == blocks_.end()) {
      std::vector<std::string> names;
      for (const auto& [name, b] : blocks_) names.push_back(name);
      const auto near = sdk::closest_match(n.block, names);
      throw sdk::ConfigError(n.block_where, n.table + ".block", "unknown block '" + n.block + "'",
                             (near.empty() ? "" : "did you mean '" + near + "'? ") +
                                 (names.empty() ? "define it as [model.blocks." + n.block + "]"
                                                : "blocks: " + join_names(names)));
    }
    return found->second;
  }

  // An instance that can expand: not recursive, its inputs the block's, one when repeated, and
  // its `set` naming the block's nodes.
  void check_instance(const RawNode& n, const BlockDef& b,
                      const std::vector<std::string>& inputs) const {
    if (std::find(stack_.begin(), stack_.end(), b.name) != stack_.end())
      throw sdk::ConfigError(
          n.block_where, n.table + ".block",
          "block '" + b.name + "' uses itself (" + join_names(stack_) + ", " + b.name + ")",
          "a block cannot contain an instance of itself");
    if (inputs.size() != b.inputs.size())
      throw sdk::ConfigError(n.inputs_where, n.table + ".inputs",
                             "block '" + b.name + "' takes " + std::to_string(b.inputs.size()) +
                                 " inputs (" + join_names(b.inputs) + "), got " +
                                 std::to_string(inputs.size()),
                             "give the instance inputs = [...] in the block's order");
    if (n.repeat > 1 && b.inputs.size() != 1)
      throw sdk::ConfigError(n.repeat_where, n.table + ".repeat",
                             "block '" + b.name + "' has " + std::to_string(b.inputs.size()) +
                                 " inputs; a repeated block has one (each repetition reads the "
                                 "one before)",
                             "instantiate it once per use instead");
    std::vector<std::string> block_nodes;
    for (const auto& m : b.nodes) block_nodes.push_back(m.name);
    for (const auto& change : n.set) {
      const std::string& node = change.first;  // not a structured binding: clang 14 lambdas
      if (std::find(block_nodes.begin(), block_nodes.end(), node) == block_nodes.end())
        throw sdk::ConfigError(n.set_where, n.table + ".set." + node,
                               "block '" + b.name + "' has no node '" + node + "'",
                               "its nodes: " + join_names(block_nodes));
    }
  }

  // The block's nodes, once per repetition, each repetition reading the one before.
  void add_instance(const RawNode& n, const BlockDef& b, const std::string& global,
                    const std::vector<std::string>& inputs) {
    stack_.push_back(b.name);
    instances_.push_back(&n);
    std::vector<std::string> actual = inputs;
    std::string output;
    for (std::int64_t r = 0; r < n.repeat; ++r) {
      const std::string inner = global + "." + (n.repeat > 1 ? std::to_string(r) + "." : "");
      auto inner_input = [&](const std::string& name) {
        for (std::size_t k = 0; k < b.inputs.size(); ++k)
          if (b.inputs[k] == name) return actual[k];
        return inner + name;  // a node of this repetition (checked when the graph is built)
      };
      for (const auto& m : b.nodes) {
        const auto change = n.set.find(m.name);
        add(m, inner, inner_input, change == n.set.end() ? nullptr : &change->second);
      }
      output = inner + b.output;
      actual = {output};
    }
    stack_.pop_back();
    instances_.pop_back();
    aliases_[global] = output;
  }

  const std::map<std::string, BlockDef>& blocks_;
  std::vector<LayerSpec> nodes_;
  std::map<std::string, std::string> aliases_;  // instance -> its output node
  std::vector<std::string> stack_;              // blocks being expanded
  std::vector<const RawNode*> instances_;       // their instances, outermost first
};

}  // namespace

namespace {

// A preset builds every node: its table has no nested tables, and the model no layers/nodes list.
// `what` names what chose the preset ("preset = \"gpt\"").
void reject_preset_with_nodes(const Config& config, const std::string& preset,
                              const std::string& what) {
  reject_nested(config, "model." + preset);
  for (const char* list : {"model.layers", "model.nodes"})
    if (!config.table_array(list, kArrayKeys).empty())
      throw sdk::ConfigError(config.location(list), list,
                             "the model has both " + what + " and " + std::string(list),
                             "remove one: the preset builds every node");
}

// The gpt preset of resolved [model.gpt] options; what they leave at 0 comes from the data.
GptPreset gpt_preset_of(const sdk::Options& o, const sdk::SourceLocation& where,
                        const Experiment& e) {
  GptPreset p;
  p.n_layer = o.get_int("n_layer");
  p.n_head = o.get_int("n_head");
  p.n_embd = o.get_int("n_embd");
  p.vocab_size = o.get_int("vocab_size");
  p.block_size = o.get_int("block_size");
  p.bias = o.get_bool("bias");
  p.fused_attention = o.get_bool("fused_attention");
  p.where = where;
  for (const char* key : {"n_layer", "n_head", "n_embd", "vocab_size", "block_size"})
    if (o.was_set(key)) p.key_where[key] = o.where(key);
  if (p.n_embd % p.n_head != 0)
    throw sdk::ConfigError(o.where("n_head"), "model.gpt.n_head",
                           "n_embd = " + std::to_string(p.n_embd) +
                               " is not divisible by n_head = " + std::to_string(p.n_head),
                           "choose n_head so that it divides n_embd (each head is n_embd / n_head "
                           "wide)");
  if (p.vocab_size == 0) p.vocab_size = e.data.vocab_size;
  if (p.vocab_size <= 0)
    throw sdk::ConfigError(where, "model.gpt.vocab_size",
                           "the gpt preset needs a vocabulary size and the data gives none",
                           "use a token data source (data.source = \"tokens\" or \"text\") or set "
                           "vocab_size in [model.gpt]");
  for (const char* key : {"bos_token_id", "eos_token_id"})
    if (o.get_int(key) >= p.vocab_size)
      o.fail(key,
             "is " + std::to_string(o.get_int(key)) + ", not a token of the model's " +
                 std::to_string(p.vocab_size),
             "give an id below vocab_size, or -1 for none");
  return p;
}

// [model] preset = "gpt": the nodes come from [model.gpt]; the resolved config keeps the preset.
void read_gpt_preset(const Config& config, Experiment& e, const sdk::Options& model) {
  reject_preset_with_nodes(config, "gpt", "preset = \"gpt\"");
  const auto raw = config.table_options("model.gpt");
  const sdk::SourceLocation where = raw.empty() ? e.model.where : config.location("model.gpt");
  const auto o = sdk::Options::resolve("model.gpt", gpt_preset_schema(), raw, where, {});
  e.model.layers = gpt_preset(gpt_preset_of(o, where, e));
  e.model.graph = true;
  e.core_sections.push_back(model_section_of(model, e.model));
  e.core_sections.push_back(section_of("model.gpt", {}, o));
}

// The folder from_pretrained names, opened; its errors point at the key too.
HfGpt2Pretrained open_pretrained(const std::filesystem::path& folder,
                                 const sdk::SourceLocation& at) {
  try {
    return open_hf_gpt2_folder(folder);
  } catch (const sdk::UserError& err) {
    throw sdk::ConfigError(at, "model.from_pretrained", err.what(), err.hint());
  }
}

// [model.gpt]'s options with config.json's sizes in: a size the table also gives must agree.
// `sources` gets, per size, where its value came from (for the resolved config's comments).
std::vector<sdk::RawOption> sizes_with_pretrained(const Config& config,
                                                  const HfGpt2Pretrained& pretrained,
                                                  std::vector<std::string>& sources) {
  auto raw = config.table_options("model.gpt");
  const std::string file = pretrained.config_file.string();
  for (const auto& size : pretrained.config.sizes) {
    const std::string taken =
        size.key + " = " + std::to_string(size.value) + " (its " + size.field + ")";
    const auto given = std::find_if(raw.begin(), raw.end(),
                                    [&](const sdk::RawOption& r) { return r.key == size.key; });
    if (given == raw.end()) {
      raw.push_back({size.key, size.value, {file, 0, 0}});
      sources.push_back(taken);
      continue;
    }
    if (given->value != sdk::OptionValue{size.value})
      throw sdk::ConfigError(
          given->where, "model.gpt." + size.key,
          size.key + " = " + sdk::option_value_to_string(given->value) + " disagrees with " + file +
              "'s " + size.field + " = " + std::to_string(size.value),
          "from_pretrained takes the sizes from config.json: remove " + size.key +
              " from [model.gpt] (or set it to " + std::to_string(size.value) + ")");
    sources.push_back(taken + ", also given at " + given->where.to_string());
  }
  // The token ids do not shape the model: the table's own win.
  for (const auto& id : pretrained.config.token_ids)
    if (std::none_of(raw.begin(), raw.end(),
                     [&](const sdk::RawOption& r) { return r.key == id.key; })) {
      raw.push_back({id.key, id.value, {file, 0, 0}});
      sources.push_back(id.key + " = " + std::to_string(id.value) + " (its " + id.field + ")");
    }
  return raw;
}

// [model] from_pretrained = "DIR": the gpt preset sized by DIR/config.json, starting from
// DIR/model.safetensors (read_checkpoint makes it checkpoint.init_from). The resolved config
// writes what it became, preset = "gpt" with every size, so a run's config.toml (and a resume
// of it) no longer reads the folder.
void read_pretrained_gpt(const Config& config, Experiment& e, const sdk::Options& model) {
  const sdk::SourceLocation at = model.where("from_pretrained");
  if (parse_choice(model, "preset", kModelPresets) == ModelPreset::resnet)
    throw sdk::ConfigError(model.where("preset"), "model.preset",
                           "preset = \"resnet\" beside from_pretrained, which builds the gpt "
                           "preset (a GPT-2 folder)",
                           "remove one of them (from_pretrained implies preset = \"gpt\")");
  reject_preset_with_nodes(config, "gpt", "from_pretrained");
  const auto folder =
      config_path(config, "model.from_pretrained", model.get_string("from_pretrained"));
  const auto pretrained = open_pretrained(folder, at);
  std::vector<std::string> sources;
  const auto raw = sizes_with_pretrained(config, pretrained, sources);
  const sdk::SourceLocation where =
      config.has_table("model.gpt") ? config.location("model.gpt") : at;
  const auto o = sdk::Options::resolve("model.gpt", gpt_preset_schema(), raw, where, {});
  if (!o.get_bool("bias"))
    o.fail("bias", "is false, but a GPT-2 folder's linears have biases",
           "remove bias from [model.gpt]: from_pretrained builds GPT-2's biases (" +
               pretrained.weights_file.string() + " holds them)");
  // The nodes point at the key that sized them.
  const GptPreset p = gpt_preset_of(o, at, e);
  // A byte-level BPE vocabulary does not put byte b at id b (GPT-2's id 0 is "!"), so a folder
  // with a tokenizer holds a model whose embeddings trained on the text source's bytes would
  // learn under other tokens' names, whatever the two vocabulary sizes. A folder without one (a
  // byte-level model's export) reads bytes.
  const auto has = [&](const char* name) { return std::filesystem::exists(folder / name); };
  if (e.data.source == DataSource::text &&
      (has("tokenizer.json") || (has("vocab.json") && has("merges.txt"))))
    throw sdk::ConfigError(at, "model.from_pretrained",
                           "data.source = \"text\" feeds the model bytes, but " +
                               pretrained.config_file.string() +
                               "'s model reads the ids of the tokenizer beside it, which are not "
                               "bytes",
                           "tokenize the text with the folder's tokenizer "
                           "(samples/data_tools/make_token_file.py --tokenizer) and train on "
                           "data.source = \"tokens\"");
  if (e.data.vocab_size > 0 && e.data.vocab_size != p.vocab_size)
    throw sdk::ConfigError(at, "model.from_pretrained",
                           pretrained.config_file.string() +
                               "'s vocab_size = " + std::to_string(p.vocab_size) +
                               " but the data's vocab_size is " + std::to_string(e.data.vocab_size),
                           "the model predicts the folder's tokens: train on token data in its "
                           "vocabulary (data.source = \"tokens\" with vocab_size = " +
                               std::to_string(p.vocab_size) + ")");
  if (e.data.block_size > p.block_size)
    throw sdk::ConfigError(at, "model.from_pretrained",
                           "the data's block_size = " + std::to_string(e.data.block_size) +
                               " is longer than " + pretrained.config_file.string() +
                               "'s n_positions = " + std::to_string(p.block_size) +
                               ", the positions the model has learned",
                           "set data.block_size to at most " + std::to_string(p.block_size));
  e.model.layers = gpt_preset(p);
  e.model.graph = true;
  e.from_pretrained = {folder, pretrained.weights_file, at};
  for (const auto& note : pretrained.config.notes) e.config_warnings.push_back(note);

  ResolvedSection m = model_section_of(model, e.model);
  show_resolved(m, "preset", "gpt");
  show_resolved(m, "from_pretrained", "");
  m.comments.push_back("from_pretrained = " + sdk::option_value_to_string(folder.string()) + " (" +
                       at.to_string() +
                       ") is written out: the gpt preset sized by its config.json, starting "
                       "from its model.safetensors ([checkpoint] init_from, init_layout = "
                       "\"gpt2\")");
  e.core_sections.push_back(std::move(m));
  ResolvedSection g = section_of("model.gpt", {}, o);
  g.comments.push_back("sizes from " + pretrained.config_file.string() + ":");
  for (const auto& source : sources) g.comments.push_back("  " + source);
  e.core_sections.push_back(std::move(g));
}

// An unknown key of [model.resnet], named against every key the table takes: its lists (blocks,
// widths) are read beside the schema, which alone would leave them out of the did-you-mean and
// of the known keys.
void refuse_unknown_resnet_keys(const std::vector<sdk::RawOption>& raw) {
  std::vector<std::string> known = {"blocks", "widths"};
  for (const auto& spec : resnet_preset_schema()) known.push_back(spec.name);
  for (const auto& o : raw) {
    if (std::find(known.begin(), known.end(), o.key) != known.end()) continue;
    const auto near = sdk::closest_match(o.key, known);
    throw sdk::ConfigError(
        o.where, "model.resnet." + o.key, "unknown key",
        (near.empty() ? "" : "did you mean '" + near + "'? ") + "known keys: " + join_names(known));
  }
}

// [model] preset = "resnet": the nodes come from [model.resnet].
void read_resnet_preset(const Config& config, Experiment& e, const sdk::Options& model) {
  reject_preset_with_nodes(config, "resnet", "preset = \"resnet\"");
  const std::vector<std::string> arrays = {"blocks", "widths"};
  const auto raw = config.table_options("model.resnet", arrays);
  refuse_unknown_resnet_keys(raw);
  const sdk::SourceLocation where = config.is_array("model.resnet.blocks") || !raw.empty()
                                        ? config.location("model.resnet")
                                        : e.model.where;
  const auto o = sdk::Options::resolve("model.resnet", resnet_preset_schema(), raw, where, {});
  ResNetPreset p;
  p.blocks = config.integer_array("model.resnet.blocks");
  p.widths = config.integer_array("model.resnet.widths");
  p.block = parse_choice(o, "block", kResNetBlocks);
  p.stem = parse_choice(o, "stem", kResNetStems);
  p.stem_width = o.get_int("stem_width");
  p.classes = o.get_int("classes");
  p.where = where;
  const std::string example =
      "e.g. ResNet-20: blocks = [3, 3, 3], widths = [16, 32, 64]; ResNet-18: blocks = [2, 2, 2, "
      "2], widths = [64, 128, 256, 512], stem = \"imagenet\"; ResNet-50: blocks = [3, 4, 6, 3], "
      "the same widths and stem, block = \"bottleneck\"";
  for (const char* key : {"blocks", "widths"}) {
    const std::string dotted = "model.resnet." + std::string(key);
    const auto& v = std::string(key) == "blocks" ? p.blocks : p.widths;
    const sdk::SourceLocation at = config.location(dotted);
    if (v.empty())
      throw sdk::ConfigError(
          config.is_array(dotted) ? at : where, dotted,
          "the resnet preset needs " + std::string(key) + " (one entry per stage)", example);
    for (std::int64_t x : v)
      if (x < 1 || x > 65536)
        throw sdk::ConfigError(
            at, dotted,
            std::string(key) + " entries must be in [1, 65536], got " + std::to_string(x), example);
  }
  if (p.blocks.size() != p.widths.size())
    throw sdk::ConfigError(config.location("model.resnet.widths"), "model.resnet.widths",
                           "blocks has " + std::to_string(p.blocks.size()) +
                               " stages but widths has " + std::to_string(p.widths.size()),
                           "give one width per stage: " + example);
  e.model.layers = resnet_preset(p);
  e.model.graph = true;
  e.core_sections.push_back(model_section_of(model, e.model));
  ResolvedSection s = section_of("model.resnet", {}, o);
  s.raw_values.emplace_back("blocks", toml_list(p.blocks));
  s.raw_values.emplace_back("widths", toml_list(p.widths));
  e.core_sections.push_back(s);
}

}  // namespace

namespace {

// Checks each entry's inputs against the form and names the unnamed ones; returns whether any
// entry is a block instance.
bool name_entries(const Config& config, std::vector<RawNode>& nodes, bool graph_form) {
  // Unnamed layers are numbered per type, in order (relu1, relu2, ...), skipping names the
  // config gives explicitly, so the names in logs and checkpoints read as a sequence.
  std::set<std::string> explicit_names;
  for (const auto& n : nodes)
    if (!n.name.empty()) explicit_names.insert(n.name);
  std::map<std::string, int> unnamed_count;
  const bool uses_blocks =
      std::any_of(nodes.begin(), nodes.end(), [](const RawNode& n) { return !n.block.empty(); });
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    RawNode& n = nodes[i];
    if (!graph_form && !n.inputs.empty())
      throw sdk::ConfigError(config.location(n.dotted + ".inputs"), n.table + ".inputs",
                             "a layer of model.layers reads the layer before it",
                             "write the model as [[model.nodes]] to name each node's inputs");
    if (graph_form && n.inputs.empty())
      throw sdk::ConfigError(n.where, n.table + ".inputs", "a node needs its inputs",
                             "inputs = [\"input\"] reads the batch; inputs = [\"fc1\"] a node");
    if (graph_form && n.name.empty())
      throw sdk::ConfigError(n.where, n.table + ".name", "a node needs a name",
                             "other nodes name it in their inputs: name = \"fc1\"");
    const std::string kind = n.block.empty() ? n.type : n.block;
    while (n.name.empty()) {
      auto candidate = kind + std::to_string(++unnamed_count[kind]);
      if (explicit_names.count(candidate) == 0) n.name = std::move(candidate);
    }
    // The sequential form with blocks becomes a graph: each entry reads the one before.
    if (!graph_form && uses_blocks)
      n.inputs = {i == 0 ? std::string(kGraphInput) : nodes[i - 1].name};
  }
  return uses_blocks;
}

// The expanded layers as the resolved config writes them: [[model.layers]] or [[model.nodes]].
void push_resolved_layers(Experiment& e, bool has_blocks) {
  const std::string out_list = e.model.graph ? "model.nodes" : "model.layers";
  for (const LayerSpec& l : e.model.layers) {
    require_op(l, l.table, !has_blocks ? "" : "; or block = \"<block>\" for an instance");
    auto o = sdk::Options::resolve(l.table, layer_schema(l.type), l.options, l.where);
    ResolvedSection s = section_of(out_list, {{"type", l.type}}, o);
    for (auto& [k, v] : s.values)
      if (k == "name") v = l.name;
    if (e.model.graph) s.raw_values.emplace_back("inputs", toml_list(l.inputs));
    if (!l.shape.empty()) s.raw_values.emplace_back("shape", toml_list(l.shape));
    s.array = true;
    e.core_sections.push_back(s);
  }
}

}  // namespace

void read_model_config(const Config& config, Experiment& e) {
  reject_nested(config, "model", {"layers", "nodes", "blocks", "gpt", "resnet", "lora"});
  // The sequential form (`layers`, each reads the one before) or the graph form (`nodes`, each
  // names its inputs); a node's inputs and a reshape's shape are arrays.
  auto node_entries = config.table_array("model.nodes", kArrayKeys);
  auto sequential = config.table_array("model.layers", kArrayKeys);
  const bool graph_form = !node_entries.empty();
  if (graph_form && !sequential.empty())
    throw sdk::ConfigError(config.location("model.nodes"), "model.nodes",
                           "the model has both layers and nodes",
                           "write the model as one list: layers (each reads the one before) or "
                           "nodes (each names its inputs)");
  const std::string layer_list = graph_form ? "model.nodes" : "model.layers";
  const auto entries = graph_form ? std::move(node_entries) : std::move(sequential);

  // layers is read as an array of tables; an empty one (layers = []) is no table array to TOML,
  // so it is skipped here and reported below as a model without layers.
  auto raw = config.table_options("model", model_list_keys());
  e.model.where = config.location("model");
  read_recompute(config, e.model);
  auto model = sdk::Options::resolve("model", model_schema(), raw, e.model.where, {});
  e.model.loss = model.get_string("loss");
  e.model.fuse_epilogues = model.get_bool("fuse_epilogues");
  e.model.fp32_gradient_sums = model.get_bool("fp32_gradient_sums");
  e.model.label_smoothing = model.get_double("label_smoothing");
  if (model.was_set("loss_chunk_rows")) e.model.loss_chunk_rows = model.get_int("loss_chunk_rows");
  if (model.was_set("loss_pad_classes"))
    e.model.loss_pad_classes = model.get_int("loss_pad_classes");
  if (!model.get_string("from_pretrained").empty()) return read_pretrained_gpt(config, e, model);
  const ModelPreset preset = parse_choice(model, "preset", kModelPresets);
  // A preset's table under another preset is checked as an unselected plugin's table is, so a
  // typo or a wrong type there is an error rather than dropped without a word.
  if (preset != ModelPreset::gpt && config.has_table("model.gpt"))
    check_unselected_table("model.gpt", gpt_preset_schema(), config.table_options("model.gpt"),
                           config.location("model.gpt"));
  if (preset != ModelPreset::resnet && config.has_table("model.resnet"))
    refuse_unknown_resnet_keys(config.table_options("model.resnet", {"blocks", "widths"}));
  if (preset != ModelPreset::resnet && config.has_table("model.resnet"))
    check_unselected_table("model.resnet", resnet_preset_schema(),
                           config.table_options("model.resnet", {"blocks", "widths"}),
                           config.location("model.resnet"));
  // The other preset's table builds nothing under this one: said, as an unused key is.
  if (preset != ModelPreset::none)
    for (const char* name : {"gpt", "resnet"})
      if (const std::string table = std::string("model.") + name;
          name != choice_name(preset, kModelPresets) && config.has_table(table))
        e.config_warnings.push_back(
            "[" + table + "] (" + config.location(table).to_string() +
            ") is ignored: [model] preset = \"" + std::string(choice_name(preset, kModelPresets)) +
            "\" (" + config.location("model.preset").to_string() + ") builds [model." +
            std::string(choice_name(preset, kModelPresets)) + "]; preset = \"" + name +
            "\" selects that table");
  switch (preset) {
    case ModelPreset::gpt:
      return read_gpt_preset(config, e, model);
    case ModelPreset::resnet:
      return read_resnet_preset(config, e, model);
    case ModelPreset::none:
      break;
  }
  std::vector<RawNode> nodes;
  for (std::size_t i = 0; i < entries.size(); ++i)
    nodes.push_back(read_node(config, entries[i], layer_list, i));
  const auto blocks = read_blocks(config);
  if (nodes.empty()) {
    for (const char* name : {"gpt", "resnet"})
      if (config.has_table(std::string("model.") + name))
        throw sdk::ConfigError(e.model.where, layer_list,
                               "the model has no layers, and [model." + std::string(name) +
                                   "] is given but [model] selects no preset",
                               "add preset = \"" + std::string(name) +
                                   "\" to [model] to build the model [model." + name +
                                   "] describes");
    throw sdk::ConfigError(e.model.where, layer_list, "the model has no layers",
                           "under a [model] header, add layers = [ { type = \"linear\", out = "
                           "64 }, { type = \"relu\" }, { type = \"linear\", out = 10 } ]");
  }
  // A preset's table beside a layers or nodes list builds nothing: the list is the model, and
  // preset = "<name>" (which selects the table) cannot sit beside a list either. Validated above
  // as an unselected table; said here, as an unused key is, rather than dropped without a word.
  for (const char* name : {"gpt", "resnet"})
    if (config.has_table(std::string("model.") + name))
      e.config_warnings.push_back("[model." + std::string(name) + "] (" +
                                  config.location(std::string("model.") + name).to_string() +
                                  ") is ignored: [model] selects no preset and builds its " +
                                  layer_list + " list; preset = \"" + name +
                                  "\" selects that table (in place of the list)");
  e.core_sections.push_back(model_section_of(model, e.model));

  const bool uses_blocks = name_entries(config, nodes, graph_form);
  ModelExpansion expansion(blocks);
  for (const auto& n : nodes)
    expansion.add(
        n, "", [](const std::string& in) { return in; }, nullptr);
  e.model.layers = expansion.finish();
  e.model.graph = graph_form || uses_blocks;
  push_resolved_layers(e, !blocks.empty());
}

}  // namespace mixtrain::core

#include "data_config.h"

#include <algorithm>

#include "config_reading.h"
#include "mixtrain/core/host_schemas.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;

// The files a path option of a token source names: one string, or (text) a list of them;
// relative paths resolve as resolve_path() does. Empty when not given or "".
std::vector<fs::path> path_list(const Config& config, const ResolvedComponentSection& r,
                                const std::string& key) {
  auto origin = r.origin.find(key);
  if (origin == r.origin.end() || r.component.get_string(key).empty()) return {};
  std::vector<fs::path> out;
  for (const auto& entry : config.string_array(origin->second)) {
    if (entry.empty())
      r.component.fail(key, "entry " + std::to_string(out.size()) + " is an empty path",
                       "list the files, e.g. path = [\"a.txt\", \"b.txt\"]");
    out.push_back(config_path(config, origin->second, entry));
  }
  return out;
}

std::string toml_list(const std::vector<fs::path>& paths) {
  std::string out = "[";
  for (const auto& p : paths)
    out += (out.size() > 1 ? ", " : "") + sdk::option_value_to_string(p.string());
  return out + "]";
}

void read_token_source(const Config& config, const ResolvedComponentSection& r, Experiment& e) {
  const auto& common = r.host;
  const auto& src = r.component;
  // Token sources have a vocabulary, not classes: a classes value would be silently unused.
  // (0, the default, is what resolved configs write.)
  if (common.get_int("classes") != 0)
    common.fail("classes", "data.classes does not apply to source '" + e.data.source + "'",
                "set data." + e.data.source + ".vocab_size, the number of outputs");
  const std::string files_key = e.data.source == "tokens" ? "train" : "path";
  e.data.token_paths = path_list(config, r, files_key);
  if (e.data.token_paths.empty())
    src.fail(files_key, "names no file",
             e.data.source == "tokens" ? "set it to an llm.c token file (.bin)"
                                       : "set it to a text file or a list of text files");
  e.data.eval_token_paths = path_list(config, r, "eval");
  e.data.block_size = src.get_int("block_size");
  e.data.vocab_size = static_cast<std::int32_t>(src.get_int("vocab_size"));
}

std::vector<std::string> list_options_of(const std::string& source) {
  std::vector<std::string> out;
  for (const auto& o : data_source_schema(source))
    if (is_path_list_option(source, o.name)) out.push_back(o.name);
  return out;
}

}  // namespace

// The source is a component of the host's own: [data] source = "npy" with [data.npy] options.
void read_data_config(const Config& config, Experiment& e) {
  const auto& sources = data_sources();
  std::vector<std::string> lists;  // text's path and eval may be arrays of file names
  for (const auto& s : sources)
    for (auto& key : list_options_of(s)) lists.push_back(std::move(key));
  e.data.source = section_selector(config, "data", "source", "synthetic", lists);
  if (std::find(sources.begin(), sources.end(), e.data.source) == sources.end()) {
    auto near = sdk::closest_match(e.data.source, sources);
    throw sdk::ConfigError(
        config.location("data.source"), "data.source",
        "unknown data source '" + e.data.source + "'",
        (near.empty() ? "" : "did you mean '" + near + "'? ") + "one of: " + join_names(sources));
  }
  ComponentSection section{"data", "source", "data source", e.data.source, data_common_schema(),
                           {},     {}};
  for (const auto& s : sources)
    section.components.push_back({s, data_source_schema(s), list_options_of(s)});
  auto r = resolve_component_section(config, section);
  const auto& common = r.host;
  const auto& src = r.component;
  e.data.batch_size = common.get_int("batch_size");
  e.data.eval_batch_size = common.get_int("eval_batch_size");
  if (e.data.eval_batch_size == 0) e.data.eval_batch_size = e.data.batch_size;
  e.data.shuffle = common.get_bool("shuffle");
  e.data.eval_fraction = common.get_double("eval_fraction");
  e.data.classes = static_cast<std::int32_t>(common.get_int("classes"));
  if (e.data.source == "synthetic") {
    e.data.synthetic.kind = src.get_string("kind");
    e.data.synthetic.rows = src.get_int("rows");
    e.data.synthetic.features = src.get_int("features");
    e.data.synthetic.classes = static_cast<std::int32_t>(src.get_int("num_classes"));
    e.data.synthetic.noise = src.get_double("noise");
    e.data.synthetic.seed = e.run.seed;
  } else if (e.data.source == "npy") {
    e.data.features_path = resolve_path(config, r, "features");
    e.data.labels_path = resolve_path(config, r, "labels");
  } else if (e.data.source == "idx") {
    e.data.images_path = resolve_path(config, r, "images");
    e.data.labels_path = resolve_path(config, r, "labels");
  } else {
    read_token_source(config, r, e);
  }
  e.core_sections.push_back(section_of("data", {{"source", e.data.source}}, common));
  ResolvedSection s = section_of("data." + e.data.source, {}, src);
  // Paths as the run uses them (absolute); text's file lists as TOML arrays.
  std::vector<std::pair<std::string, sdk::OptionValue>> values;
  for (auto& [k, v] : s.values) {
    if (!is_path_option(e.data.source, k) || src.get_string(k).empty()) {
      values.emplace_back(k, v);
    } else if (is_path_list_option(e.data.source, k)) {
      s.raw_values.emplace_back(k, toml_list(path_list(config, r, k)));
    } else {
      values.emplace_back(k, resolve_path(config, r, k).string());
    }
  }
  s.values = std::move(values);
  e.core_sections.push_back(s);
}

}  // namespace mixtrain::core

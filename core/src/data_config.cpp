#include "data_config.h"

#include <algorithm>

#include "config_reading.h"
#include "mixtrain/core/host_schemas.h"

namespace mixtrain::core {

// The source is a component of the host's own: [data] source = "npy" with [data.npy] options.
void read_data_config(const Config& config, Experiment& e) {
  e.data.source = section_selector(config, "data", "source", "synthetic");
  const auto& sources = data_sources();
  if (std::find(sources.begin(), sources.end(), e.data.source) == sources.end()) {
    auto near = sdk::closest_match(e.data.source, sources);
    throw sdk::ConfigError(
        config.location("data.source"), "data.source",
        "unknown data source '" + e.data.source + "'",
        (near.empty() ? "" : "did you mean '" + near + "'? ") + "one of: synthetic, npy, idx");
  }
  ComponentSection section{"data", "source", "data source", e.data.source, data_common_schema(),
                           {},     {}};
  for (const auto& s : sources) section.components.push_back({s, data_source_schema(s)});
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
  } else {
    e.data.images_path = resolve_path(config, r, "images");
    e.data.labels_path = resolve_path(config, r, "labels");
  }
  e.core_sections.push_back(section_of("data", {{"source", e.data.source}}, common));
  ResolvedSection s = section_of("data." + e.data.source, {}, src);
  for (auto& [k, v] : s.values)
    if (is_path_option(e.data.source, k)) v = resolve_path(config, r, k).string();
  e.core_sections.push_back(s);
}

}  // namespace mixtrain::core

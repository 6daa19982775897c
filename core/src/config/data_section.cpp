#include "config/data_section.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "config/reading.h"
#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/core/data/dataset.h"

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

// Records the files a path option names (DataSettings::named_files).
void name_files(const ResolvedComponentSection& r, const std::string& key,
                const std::vector<fs::path>& paths, Experiment& e) {
  const auto origin = r.origin.find(key);
  const std::string dotted = origin != r.origin.end() ? origin->second : "data." + key;
  for (const auto& p : paths)
    if (!p.empty()) e.data.named_files.push_back({p, dotted, r.component.where(key)});
}

std::string toml_list(const std::vector<fs::path>& paths) {
  std::string out = "[";
  for (const auto& p : paths)
    out += (out.size() > 1 ? ", " : "") + sdk::option_value_to_string(p.string());
  return out + "]";
}

std::string source_name(const DataSettings& d) {
  return std::string(choice_name(d.source, kDataSources));
}

void read_token_source(const Config& config, const ResolvedComponentSection& r, Experiment& e) {
  const auto& common = r.host;
  const auto& src = r.component;
  // Token sources have a vocabulary, not classes: a classes value would be silently unused.
  // (0, the default, is what resolved configs write.)
  if (common.get_int("classes") != 0)
    common.fail("classes", "data.classes does not apply to source '" + source_name(e.data) + "'",
                "set data." + source_name(e.data) + ".vocab_size, the number of outputs");
  const bool tokens = e.data.source == DataSource::tokens;
  const std::string files_key = tokens ? "train" : "path";
  e.data.token_paths = path_list(config, r, files_key);
  if (e.data.token_paths.empty())
    src.fail(files_key, "names no file",
             tokens ? "set it to an llm.c token file (.bin)"
                    : "set it to a text file or a list of text files");
  e.data.eval_token_paths = path_list(config, r, "eval");
  name_files(r, files_key, e.data.token_paths, e);
  name_files(r, "eval", e.data.eval_token_paths, e);
  e.data.block_size = src.get_int("block_size");
  e.data.vocab_size = static_cast<std::int32_t>(src.get_int("vocab_size"));
}

std::string number_list(const std::vector<double>& values) {
  std::string out = "[";
  for (const double v : values) {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", v);
    out += (out.size() > 1 ? ", " : "") + std::string(text);
  }
  return out + "]";
}

// Why [data.normalize] / [data.augment] cannot apply, when the config alone shows it ("" when
// only the loaded data can tell: npy and idx files may or may not hold images).
std::string not_images(const DataSettings& d) {
  if (is_token_source(d.source))
    return "data.source = \"" + source_name(d) + "\" gives token windows, not images";
  if (d.source == DataSource::synthetic && d.synthetic.kind != "images")
    return "data.synthetic.kind = \"" + d.synthetic.kind + "\" gives plain features, not images";
  return {};
}

// The options of an image-only sub-table of [data]: scalars through its schema; `numbers` (lists
// of numbers) checked to be arrays and joined as text for the schema's string entries.
sdk::Options image_table(const Config& config, const std::string& table,
                         const sdk::OptionSchema& schema, const std::vector<std::string>& numbers) {
  reject_nested(config, table);
  std::vector<std::string> arrays;
  for (const auto& key : numbers)
    if (config.is_array(table + "." + key)) arrays.push_back(key);
  auto raw = config.table_options(table, arrays);
  for (const auto& r : raw)
    if (std::find(numbers.begin(), numbers.end(), r.key) != numbers.end())
      throw sdk::ConfigError(r.where, table + "." + r.key,
                             "expected a list of numbers, one per channel",
                             "write it as " + r.key + " = [0.5] (one channel) or " + r.key +
                                 " = [0.49, 0.48, 0.45] (RGB)");
  for (const auto& key : arrays)
    raw.push_back({key, number_list(config.number_array(table + "." + key)),
                   config.location(table + "." + key)});
  return sdk::Options::resolve(table, schema, raw, config.location(table), {});
}

void read_normalize(const Config& config, Experiment& e) {
  const std::string table = "data.normalize";
  if (!config.has_table(table)) return;
  auto o = image_table(config, table, data_normalize_schema(), {"mean", "std"});
  auto& n = e.data.normalize;
  n.where = config.location(table);
  n.mean = config.number_array(table + ".mean");
  n.std = config.number_array(table + ".std");
  n.from_training = o.get_bool("from_training");
  n.mean_where = o.where("mean");
  n.std_where = o.where("std");
  if (n.from_training && (o.was_set("mean") || o.was_set("std")))
    o.fail(o.was_set("mean") ? "mean" : "std", "is given together with from_training = true",
           "either give mean and std, or compute them with from_training = true, not both");
  if (!n.from_training) {
    if (!o.was_set("mean") || !o.was_set("std"))
      o.fail(o.was_set("mean") ? "std" : "mean", "is missing",
             "give both mean and std (one number per channel), or set from_training = true");
    if (n.mean.empty()) o.fail("mean", "is empty", "give one mean per channel, e.g. mean = [0.5]");
    if (n.mean.size() != n.std.size())
      o.fail("std",
             "has " + std::to_string(n.std.size()) + " values but mean has " +
                 std::to_string(n.mean.size()),
             "give one mean and one std per channel");
    for (std::size_t i = 0; i < n.std.size(); ++i)
      if (!(n.std[i] > 0.0) || !std::isfinite(n.std[i]))
        o.fail("std",
               "entry " + std::to_string(i) + " is " + number_list({n.std[i]}) +
                   ", expected a finite number > 0",
               "a standard deviation divides the pixels; give the channel's spread");
    for (std::size_t i = 0; i < n.mean.size(); ++i)
      if (!std::isfinite(n.mean[i]))
        o.fail("mean", "entry " + std::to_string(i) + " is not finite",
               "give each channel's mean pixel value");
    // Applied in float32, as torchvision does: values finite in double can still overflow there.
    for (std::size_t i = 0; i < n.mean.size(); ++i) {
      const auto s = static_cast<float>(n.std[i]);
      if (!(s > 0.0f) || !std::isfinite(s))
        o.fail("std",
               "entry " + std::to_string(i) + " is " + sdk::option_value_to_string(n.std[i]) +
                   ", which is 0 or infinite as the float32 the pixels are divided by",
               "give the channel's spread, a number a float32 holds (1e-38 to 3e38)");
      if (!std::isfinite(normalized_pixel(0.0f, n.mean[i], n.std[i])) ||
          !std::isfinite(normalized_pixel(1.0f, n.mean[i], n.std[i])))
        o.fail(std::isfinite(static_cast<float>(n.mean[i])) ? "std" : "mean",
               "entry " + std::to_string(i) + " normalises pixels in [0, 1] to values a float32 "
                   "cannot hold (mean " + sdk::option_value_to_string(n.mean[i]) + ", std " +
                   sdk::option_value_to_string(n.std[i]) + ")",
               "give the channel's mean and spread of pixels in [0, 1]");
    }
  }
  if (const auto why = not_images(e.data); !why.empty())
    throw sdk::ConfigError(n.where, table, "normalisation needs image data, but " + why,
                           "remove [data.normalize], or use an image source (idx, cifar10, npy "
                           "[N, C, H, W], synthetic kind = \"images\")");
  ResolvedSection s = section_of(table, {{"from_training", n.from_training}}, sdk::Options{});
  if (!n.from_training) {
    s.raw_values.emplace_back("mean", number_list(n.mean));
    s.raw_values.emplace_back("std", number_list(n.std));
  }
  e.core_sections.push_back(std::move(s));
}

void read_augment(const Config& config, Experiment& e) {
  const std::string table = "data.augment";
  if (!config.has_table(table)) return;
  auto o = image_table(config, table, data_augment_schema(), {});
  auto& a = e.data.augment;
  a.where = config.location(table);
  a.spec.crop_padding = o.get_int("crop_padding");
  a.crop_padding_where = config.key_location(table + ".crop_padding");
  a.spec.horizontal_flip = o.get_bool("horizontal_flip");
  if (e.data.source == DataSource::image_folder && a.spec.crop_padding > 0)
    o.fail("crop_padding",
           "pads fixed-size images before a random crop, but image folders are cropped by "
           "RandomResizedCrop ([data.image_folder] scale_min, scale_max, ratio_min, ratio_max)",
           "remove data.augment.crop_padding; horizontal_flip applies to image folders");
  if (const auto why = not_images(e.data); !why.empty() && a.spec.enabled())
    throw sdk::ConfigError(a.where, table, "augmentation needs image data, but " + why,
                           "remove [data.augment], or use an image source (idx, cifar10, npy "
                           "[N, C, H, W], synthetic kind = \"images\")");
  e.core_sections.push_back(section_of(table, {}, o));
}

void read_cifar10(const Config& config, const ResolvedComponentSection& r, Experiment& e) {
  const auto& src = r.component;
  std::filesystem::path dir;
  if (!src.get_string("path").empty()) dir = resolve_path(config, r, "path");
  auto train = path_list(config, r, "train");
  auto eval = path_list(config, r, "eval");
  if (dir.empty() && train.empty())
    src.fail("train", "names no file, and no path (folder) is given",
             "set data.cifar10.path to the cifar-10-batches-bin folder, or list the batch files "
             "in data.cifar10.train");
  name_files(r, "path", {dir}, e);
  name_files(r, "train", train, e);
  name_files(r, "eval", eval, e);
  // The folder fills in, when the data are loaded, what the lists do not give.
  e.data.cifar_dir = std::move(dir);
  e.data.cifar_train_paths = std::move(train);
  e.data.cifar_eval_paths = std::move(eval);
}

void read_image_folder(const Config& config, const ResolvedComponentSection& r, Experiment& e) {
  const auto& src = r.component;
  auto& d = e.data;
  d.image_train_dir = resolve_path(config, r, "train");
  if (!src.get_string("eval").empty()) d.image_eval_dir = resolve_path(config, r, "eval");
  name_files(r, "train", {d.image_train_dir}, e);
  name_files(r, "eval", {d.image_eval_dir}, e);
  d.crop_size = src.get_int("size");
  auto& spec = d.image_spec;
  spec.resize = src.get_int("resize");
  // torchvision's ImageNet recipe: Resize(256) before CenterCrop(224).
  if (spec.resize == 0)
    spec.resize =
        std::max<std::int64_t>(1, std::llround(static_cast<double>(d.crop_size) * 8.0 / 7.0));
  spec.scale_min = src.get_double("scale_min");
  spec.scale_max = src.get_double("scale_max");
  spec.ratio_min = src.get_double("ratio_min");
  spec.ratio_max = src.get_double("ratio_max");
  if (spec.scale_min > spec.scale_max)
    src.fail("scale_max",
             "is " + sdk::option_value_to_string(spec.scale_max) +
                 ", below scale_min = " + sdk::option_value_to_string(spec.scale_min),
             "give scale_min <= scale_max (torchvision's default is 0.08 to 1.0)");
  if (spec.ratio_min > spec.ratio_max)
    src.fail("ratio_max",
             "is " + sdk::option_value_to_string(spec.ratio_max) +
                 ", below ratio_min = " + sdk::option_value_to_string(spec.ratio_min),
             "give ratio_min <= ratio_max (torchvision's default is 3/4 to 4/3)");
  const std::int64_t threads = src.get_int("threads");
  spec.threads = threads > 0 ? static_cast<unsigned>(threads)
                             : std::max(1u, std::thread::hardware_concurrency());
  d.check_image_files = src.get_bool("check_files");
}

std::vector<std::string> list_options_of(DataSource source) {
  std::vector<std::string> out;
  for (const auto& o : data_source_schema(source))
    if (is_path_list_option(source, o.name)) out.push_back(o.name);
  return out;
}

// data.source, with the list keys of every source (text's path and eval may be arrays of file
// names) read beside the schemas.
DataSource read_data_source(const Config& config) {
  std::vector<std::string> lists;
  for (const auto& [name, source] : kDataSources)
    for (auto& key : list_options_of(source)) lists.push_back(std::move(key));
  const auto name = section_selector(config, "data", "source", "synthetic", lists);
  if (const DataSource* source = find_choice(name, kDataSources)) return *source;
  const auto& names = data_sources();
  auto near = sdk::closest_match(name, names);
  throw sdk::ConfigError(
      config.location("data.source"), "data.source", "unknown data source '" + name + "'",
      (near.empty() ? "" : "did you mean '" + near + "'? ") + "one of: " + join_names(names));
}

// data.classes below what a source is known to hold was widened to it without a word (the
// resolved config showing the smaller number); the npy and idx readers refuse a label past it.
void check_declared_classes(const sdk::Options& common, const DataSettings& d) {
  if (d.classes == 0) return;
  std::int64_t held = 0;
  std::string what;
  if (d.source == DataSource::synthetic) {
    held = d.synthetic.classes;
    what = "data.synthetic.num_classes";
  } else if (d.source == DataSource::cifar10) {
    held = 10;
    what = "CIFAR-10's";
  }
  if (d.classes < held)
    common.fail("classes",
                "is " + std::to_string(d.classes) + ", below the " + std::to_string(held) +
                    " classes the data holds (" + what + ")",
                "give at least " + std::to_string(held) +
                    " (more pads the head), or 0 to take "
                    "the data's");
}

// Keys given that this source leaves unread: listed with the schedule's (Experiment::unused_keys),
// so the run warns instead of showing them in the resolved config as if they applied.
void note_unread_data_keys(const ResolvedComponentSection& r, Experiment& e) {
  const auto& d = e.data;
  const auto& src = r.component;
  auto unused = [&](const sdk::Options& o, const sdk::OptionSchema& schema, const std::string& key,
                    const std::string& why) {
    if (!set_away_from_default(o, schema, key)) return;
    const auto from = r.origin.find(key);  // data.synthetic.features or data.features
    e.unused_keys.push_back((from == r.origin.end() ? "data." + key : from->second) + " (" +
                            o.where(key).to_string() + ") " + why);
  };
  if (d.source == DataSource::synthetic) {
    const bool images = d.synthetic.kind == "images";
    const auto schema = data_source_schema(DataSource::synthetic);
    if (images)
      unused(src, schema, "features",
             "is not read by kind = \"images\" (channels x height x width)");
    for (const char* key : {"channels", "height", "width", "max_shift"})
      if (!images) unused(src, schema, key, "is read only by kind = \"images\"");
  }
  const bool eval_given = !d.eval_token_paths.empty() || !d.cifar_eval_paths.empty() ||
                          (d.source == DataSource::cifar10 && !d.cifar_dir.empty()) ||
                          !d.image_eval_dir.empty();
  if (eval_given)
    unused(r.host, data_common_schema(), "eval_fraction",
           "is not read: the held-out rows come from the eval file");
}

void read_synthetic(const sdk::Options& src, Experiment& e) {
  auto& spec = e.data.synthetic;
  spec.kind = src.get_string("kind");
  spec.rows = src.get_int("rows");
  spec.features = src.get_int("features");
  spec.classes = static_cast<std::int32_t>(src.get_int("num_classes"));
  spec.noise = src.get_double("noise");
  spec.feature_scale = src.get_double("feature_scale");
  spec.channels = src.get_int("channels");
  spec.height = src.get_int("height");
  spec.width = src.get_int("width");
  spec.max_shift = src.get_int("max_shift");
  spec.seed = e.run.seed;
  if (spec.kind == "images" && 2 * spec.max_shift >= std::min(spec.height, spec.width))
    src.fail("max_shift",
             "must be below min(height, width) / 2 = " +
                 std::to_string(std::min(spec.height, spec.width)) + " / 2, found " +
                 std::to_string(spec.max_shift),
             "a shift must leave most of the template inside the image");
}

// The chosen source's own keys ([data.<source>]).
void read_source_options(const Config& config, const ResolvedComponentSection& r, Experiment& e) {
  const auto& src = r.component;
  switch (e.data.source) {
    case DataSource::synthetic:
      read_synthetic(src, e);
      break;
    case DataSource::npy:
      e.data.features_path = resolve_path(config, r, "features");
      e.data.labels_path = resolve_path(config, r, "labels");
      name_files(r, "features", {e.data.features_path}, e);
      name_files(r, "labels", {e.data.labels_path}, e);
      // The layout's two names are read into a flag here, once.
      e.data.npy_channels_last = src.get_string("layout") == "nhwc";
      e.data.npy_layout_where = src.where("layout");
      break;
    case DataSource::idx:
      e.data.images_path = resolve_path(config, r, "images");
      e.data.labels_path = resolve_path(config, r, "labels");
      name_files(r, "images", {e.data.images_path}, e);
      name_files(r, "labels", {e.data.labels_path}, e);
      break;
    case DataSource::cifar10:
      read_cifar10(config, r, e);
      break;
    case DataSource::image_folder:
      read_image_folder(config, r, e);
      break;
    case DataSource::tokens:
    case DataSource::text:
      read_token_source(config, r, e);
      break;
  }
}

// data.pixels = "uint8" where the config alone shows there are no images to hold as bytes; a
// file that holds float pixels is refused when loaded (load_data).
void read_pixels(const sdk::Options& common, Experiment& e) {
  if (e.data.source == DataSource::image_folder && e.data.pixels == "float32")
    common.fail("pixels",
                "is \"float32\", which decodes images to floats when they are loaded; an image "
                "folder's images stay in their files and are cut into byte batches as each batch "
                "is drawn",
                "remove data.pixels, or set it to \"auto\" (a backend without byte input gets "
                "the batches as floats anyway)");
  if (e.data.pixels != "uint8") return;
  if (const std::string why = not_images(e.data); !why.empty())
    common.fail("pixels", "= \"uint8\" keeps image pixels as bytes, but " + why,
                "remove data.pixels");
  if (e.data.source == DataSource::synthetic) {
    if (e.data.synthetic.feature_scale != 1.0)
      common.fail("pixels",
                  "= \"uint8\" rounds synthetic images to bytes of [0, 1], which "
                  "data.synthetic.feature_scale would scale",
                  "remove data.synthetic.feature_scale, or data.pixels");
    e.data.synthetic.byte_pixels = true;
  }
}

// [data] and [data.<source>] as the run uses them: paths absolute, text's file lists as TOML
// arrays.
void push_resolved_data(const Config& config, const ResolvedComponentSection& r, Experiment& e) {
  const auto& src = r.component;
  const std::string name = source_name(e.data);
  e.core_sections.push_back(section_of("data", {{"source", name}}, r.host));
  ResolvedSection s = section_of("data." + name, {}, src);
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

}  // namespace

// The source is a component of the host's own: [data] source = "npy" with [data.npy] options.
void read_data_config(const Config& config, Experiment& e) {
  e.data.source = read_data_source(config);
  ComponentSection section{"data",
                           "source",
                           "data source",
                           source_name(e.data),
                           data_common_schema(),
                           {},
                           {"normalize", "augment"}};
  for (const auto& [name, source] : kDataSources)
    section.components.push_back(
        {std::string(name), data_source_schema(source), list_options_of(source)});
  auto r = resolve_component_section(config, section);
  const auto& common = r.host;
  e.data.batch_size = common.get_int("batch_size");
  e.data.eval_batch_size = common.get_int("eval_batch_size");
  if (e.data.eval_batch_size == 0) e.data.eval_batch_size = e.data.batch_size;
  e.data.shuffle = common.get_bool("shuffle");
  e.data.prefetch = common.get_bool("prefetch");
  e.data.pin_memory = common.get_bool("pin_memory");
  e.data.pixels = common.get_string("pixels");
  e.data.pixels_where = common.where("pixels");
  e.data.eval_fraction = common.get_double("eval_fraction");
  e.data.classes = static_cast<std::int32_t>(common.get_int("classes"));
  read_source_options(config, r, e);
  check_declared_classes(common, e.data);
  note_unread_data_keys(r, e);
  e.unused_keys.insert(e.unused_keys.end(), r.unused.begin(), r.unused.end());
  read_pixels(common, e);
  push_resolved_data(config, r, e);
  read_normalize(config, e);
  read_augment(config, e);
}

}  // namespace mixtrain::core

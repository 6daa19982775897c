// load_data / load_train_and_eval: the [data] section's source turned into the training and
// held-out sets, normalised per channel when [data.normalize] asks.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include "data/image_folder/image_folder.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

// "token file 'a.bin'", "text 'a.txt' + 2 more files": how messages name a stream.
std::string stream_origin(const std::string& kind,
                          const std::vector<std::filesystem::path>& files) {
  std::string out = kind + " '" + (files.empty() ? std::string() : files.front().string()) + "'";
  if (files.size() > 1) out += " + " + std::to_string(files.size() - 1) + " more files";
  return out;
}

// Named held-out files skip the row-level split, which is what keeps training rows out of
// evaluation: a file named on both sides (a copy-paste, or a folder's test batch also listed for
// training) makes the held-out metrics measure rows the model trains on. Said, not refused: an
// overfitting check may mean it.
void warn_of_files_on_both_sides(const std::vector<std::filesystem::path>& train,
                                 const std::vector<std::filesystem::path>& eval) {
  for (const auto& e : eval)
    for (const auto& t : train) {
      std::error_code ec;
      if (std::filesystem::equivalent(e, t, ec) && !ec) {
        core_logger("data").warn("held-out file '" + e.string() + "' is also a training file ('" +
                                 t.string() +
                                 "'): the evaluation measures rows the model trains on");
        break;
      }
    }
}

std::vector<std::int32_t> read_stream(const DataSettings& settings,
                                      const std::vector<std::filesystem::path>& files) {
  if (settings.source == DataSource::text) return load_text_tokens(files);
  if (files.size() != 1)
    throw sdk::DataError(
        "token data: expected one llm.c token file, got " + std::to_string(files.size()),
        "set data.tokens.train (and optionally data.tokens.eval) to one .bin file each");
  return load_token_file(files.front(), settings.vocab_size);
}

std::pair<Dataset, Dataset> load_token_splits(const DataSettings& settings) {
  const std::string kind = settings.source == DataSource::text ? "text" : "token file";
  const auto T = settings.block_size;
  const auto V = settings.vocab_size;
  auto stream = read_stream(settings, settings.token_paths);
  const auto origin = stream_origin(kind, settings.token_paths);
  if (settings.eval_token_paths.empty())
    return split_token_tail(std::move(stream), T, V, settings.eval_fraction, origin);
  // A separate held-out stream: the whole training stream trains, eval_fraction is unused.
  warn_of_files_on_both_sides(settings.token_paths, settings.eval_token_paths);
  Dataset train = make_token_dataset(std::move(stream), T, V, 1, origin);
  Dataset eval = make_token_dataset(read_stream(settings, settings.eval_token_paths), T, V, T,
                                    stream_origin(kind, settings.eval_token_paths));
  return {std::move(train), std::move(eval)};
}

std::pair<Dataset, Dataset> load_cifar10_splits(const DataSettings& settings, std::uint64_t seed) {
  auto train_files = settings.cifar_train_paths;
  auto eval_files = settings.cifar_eval_paths;
  bool from_folder = false;
  if (!settings.cifar_dir.empty() && (train_files.empty() || eval_files.empty())) {
    auto [dir_train, dir_eval] = cifar10_files(settings.cifar_dir);
    from_folder = train_files.empty();
    if (train_files.empty()) train_files = std::move(dir_train);
    if (eval_files.empty()) eval_files = std::move(dir_eval);
  }
  Dataset train = load_cifar10(train_files, settings.keep_bytes());
  // The folder trains on the batches present: fewer than the five (a partial download or
  // unpack) is allowed, but said with what was read, so it is not mistaken for the full set.
  if (from_folder && train_files.size() < 5) {
    std::string present;
    for (const auto& f : train_files) present += (present.empty() ? "" : ", ") + f.filename().string();
    core_logger("data").warn("CIFAR-10 folder '" + settings.cifar_dir.string() + "' holds " +
                             std::to_string(train_files.size()) +
                             " of the 5 training batches (" + present + "): training on " +
                             std::to_string(train.rows) +
                             " records, not 50000. Unpack cifar-10-binary.tar.gz whole for all");
  }
  if (settings.classes > 0) train.classes = std::max(train.classes, settings.classes);
  if (eval_files.empty()) return split_holdout(std::move(train), settings.eval_fraction, seed);
  // A separate held-out file: every training record trains, eval_fraction is unused.
  warn_of_files_on_both_sides(train_files, eval_files);
  Dataset eval = load_cifar10(eval_files, settings.keep_bytes());
  eval.classes = train.classes;
  return {std::move(train), std::move(eval)};
}

// An image folder's splits: the held-out folder when given (numbered by the training folder's
// classes), else eval_fraction of the training images.
// `training`: the training images will be read, so their headers are worth checking (a session
// that only evaluates reads the held-out folder's alone).
std::pair<Dataset, Dataset> load_image_folder_splits(const DataSettings& settings,
                                                     std::uint64_t seed, bool training) {
  const ImageFolderOptions options{settings.crop_size, settings.image_spec,
                                   settings.check_image_files};
  const auto started = std::chrono::steady_clock::now();
  const auto listing = list_image_folder(settings.image_train_dir);
  ImageFolderOptions train_options = options;
  train_options.check_files &= training || settings.image_eval_dir.empty();
  Dataset train = load_image_folder(listing, train_options);
  if (settings.classes > 0) train.classes = std::max(train.classes, settings.classes);
  const auto said = [&](const ImageFolderListing& l, const char* split, bool checked) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    char took[32];
    std::snprintf(took, sizeof took, "%.1f s", seconds);
    core_logger("data").info(
        std::string(split) + " image folder '" + l.root.string() +
        "': " + std::to_string(l.files.size()) + " images of " + std::to_string(l.classes.size()) +
        " classes" +
        (l.skipped > 0 ? ", " + std::to_string(l.skipped) + " other files left out" : "") +
        (checked ? "; every header read in " + std::string(took) : ""));
  };
  said(listing, "training", train_options.check_files);
  // Resize's shorter side below the crop leaves a held-out crop black at its borders (torchvision
  // pads the same way): allowed, but not what an ImageNet recipe means.
  if (settings.image_spec.resize < settings.crop_size)
    core_logger("data").warn(
        "data.image_folder.resize = " + std::to_string(settings.image_spec.resize) +
        " is below size = " + std::to_string(settings.crop_size) +
        ": every held-out crop is padded with black where the resized image ends; a resize of "
        "at least the size (0: round(size * 8 / 7)) fills it");
  if (settings.image_eval_dir.empty())
    return split_holdout(std::move(train), settings.eval_fraction, seed);
  std::error_code same_error;
  if (std::filesystem::equivalent(settings.image_train_dir, settings.image_eval_dir, same_error))
    core_logger("data").warn("held-out image folder '" + settings.image_eval_dir.string() +
                             "' is the training folder: the evaluation measures images the model "
                             "trains on");
  const auto held = list_image_folder(settings.image_eval_dir, &listing.classes);
  if (!held.missing_classes.empty())
    core_logger("data").warn("held-out image folder '" + held.root.string() +
                             "' has no folder for " + std::to_string(held.missing_classes.size()) +
                             " of the " + std::to_string(held.classes.size()) +
                             " training classes (e.g. '" + held.missing_classes.front() +
                             "'): the evaluation measures the others");
  Dataset eval = load_image_folder(held, options);
  eval.classes = train.classes;
  said(held, "held-out", options.check_files);
  return {std::move(train), std::move(eval)};
}

std::string number_list(const std::vector<double>& values) {
  std::string out = "[";
  for (const double v : values) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", v);
    out += (out.size() > 1 ? ", " : "") + std::string(text);
  }
  return out + "]";
}

std::string shape_text(const Dataset& d) {
  if (d.sample_shape.empty()) return "[" + std::to_string(d.features) + "] (plain features)";
  std::string out = "[";
  for (const auto v : d.sample_shape) out += (out.size() > 1 ? ", " : "") + std::to_string(v);
  return out + "]";
}

// [data.normalize] on the loaded splits: the statistics (given, or from the training split in
// double), applied to both. Settings that need images, on other data, point at the config.
// check_data_settings_fit() has passed.
ChannelStats normalize_splits(const DataSettings& settings, Dataset& train, Dataset& eval) {
  const auto& n = settings.normalize;
  ChannelStats stats;
  if (n.from_training) {
    stats = channel_statistics(train);
    if (train.is_image_files())
      core_logger("data").info(
          "data.normalize.from_training: measured on " +
          std::to_string(std::min(train.rows, kImageStatisticsSample)) + " of the " +
          std::to_string(train.rows) +
          " training images, evenly spaced, cut as held-out images are (Resize, CenterCrop)");
    for (std::size_t c = 0; c < stats.std.size(); ++c)
      if (!(stats.std[c] > 0.0))
        throw sdk::ConfigError(n.where, "data.normalize.from_training",
                               "channel " + std::to_string(c) +
                                   " of the training split is constant (std 0), so it cannot be "
                                   "normalised",
                               "give mean and std explicitly instead of from_training");
  } else {
    stats.mean = n.mean;
    stats.std = n.std;
  }
  normalize_channels(train, stats);
  if (eval.rows > 0) normalize_channels(eval, stats);
  return stats;
}

}  // namespace

std::string describe_normalization(const ChannelStats& stats) {
  return "mean " + number_list(stats.mean) + ", std " + number_list(stats.std);
}

namespace {

// A table source's rows (synthetic, npy, idx), before the held-out split.
Dataset load_table(const DataSettings& settings) {
  switch (settings.source) {
    case DataSource::synthetic:
      return make_synthetic(settings.synthetic);
    case DataSource::npy: {
      Dataset all = load_npy(settings.features_path, settings.labels_path, settings.classes,
                             settings.npy_channels_last, settings.keep_bytes());
      check_image_plausible(all, settings.features_path.string(), settings.npy_channels_last,
                            settings.npy_layout_where, "data.npy.layout");
      return all;
    }
    case DataSource::idx: {
      Dataset all = load_idx(settings.images_path, settings.labels_path, settings.classes,
                             settings.keep_bytes());
      // A rank-4 IDX file is read as [N, H, W, C], as the format stores images; one written
      // channels-first reads as many channels of a few pixels. IDX has no layout key to set.
      if (implausible_image_layout(all))
        throw sdk::DataError(
            settings.images_path.string() + ": images read as [N, H, W, C] are " +
                std::to_string(all.channels()) + " channels of " + std::to_string(all.height()) +
                "×" + std::to_string(all.width()) +
                " pixels, which looks like a channels-first array",
            "write the IDX file channels-last ([N, H, W, C], as MNIST-style tools do), or save "
            "the images with numpy.save and read them with data.source = \"npy\", which "
            "takes either layout");
      return all;
    }
    case DataSource::cifar10:
    case DataSource::image_folder:
    case DataSource::tokens:
    case DataSource::text:
      break;
  }
  throw std::logic_error("load_table: not a table source");
}

// A named file that does not exist is the config's mistake: said at its key and line, with the
// rule relative paths follow.
// `key_suffix`: only the keys ending so (".eval": a session that reads the held-out files alone).
void check_named_files_exist(const DataSettings& settings, std::string_view key_suffix = {}) {
  for (const auto& f : settings.named_files) {
    if (!f.key.ends_with(key_suffix)) continue;
    std::error_code ec;
    const bool exists = std::filesystem::exists(f.path, ec);
    if (ec == std::errc::too_many_symbolic_link_levels)
      throw sdk::ConfigError(
          f.where, f.key,
          "names " + sdk::option_value_to_string(f.path.string()) + ", a loop of symbolic links",
          "point it at the file itself");
    if (!exists)
      throw sdk::ConfigError(f.where, f.key,
                             "names " + sdk::option_value_to_string(f.path.string()) +
                                 ", which does not exist",
                             "correct the path (a relative one is read from the folder of the "
                             "file that sets it, or from the current folder when given with "
                             "--set)");
  }
}

// The crop window shifts up to p pixels each way, so a crop keeps as little as (side - p) of each
// side: from p = side / 2 on, a crop may be three quarters black and is nearly half black on
// average (torchvision's CIFAR pipeline pads 4 of 32). Said, not refused: it may be meant.
void warn_of_a_wide_crop(const DataSettings& settings, const Dataset& train) {
  const std::int64_t p = settings.augment.spec.crop_padding;
  if (p <= 0 || !train.is_image()) return;
  const std::int64_t h = train.sample_shape[1], w = train.sample_shape[2];
  if (2 * p < std::min(h, w)) return;
  const auto kept = [p](std::int64_t side) {
    return std::to_string(std::max<std::int64_t>(side - p, 0));
  };
  core_logger("data").warn(
      "data.augment.crop_padding = " + std::to_string(p) + " (" +
      settings.augment.crop_padding_where.to_string() + ") on " + std::to_string(h) + "x" +
      std::to_string(w) + " images: a crop keeps as little as " + kept(h) + "x" + kept(w) +
      " of the image's pixels, the rest black padding; a padding under half the side keeps most "
      "of each image (torchvision's CIFAR pipeline pads 4 of 32)");
}

}  // namespace

void check_data_settings_fit(const DataSettings& settings, const Dataset& train) {
  if (settings.pixels == "uint8" && !train.is_bytes())
    throw sdk::ConfigError(
        settings.pixels_where, "data.pixels",
        "= \"uint8\" keeps image pixels as bytes, but the data " +
            (train.is_image() ? std::string("hold float pixels")
                              : "are not images (sample shape " + shape_text(train) + ")"),
        "remove data.pixels (or save the images as uint8)");
  const auto& n = settings.normalize;
  if (n.enabled() && !train.is_image())
    throw sdk::ConfigError(n.where, "data.normalize",
                           "per-channel normalisation needs images, but the data have sample "
                           "shape " +
                               shape_text(train),
                           "remove [data.normalize]; image sources: idx [N, H, W], cifar10, npy "
                           "[N, H, W] or [N, C, H, W], synthetic kind = \"images\"");
  if (n.enabled() && !n.from_training) {
    const auto channels = static_cast<std::size_t>(train.channels());
    const auto one_per_channel = [&](const std::vector<double>& values,
                                     const sdk::SourceLocation& where, const char* key) {
      if (values.size() != channels)
        throw sdk::ConfigError(where, key,
                               "has " + std::to_string(values.size()) + " values, but the images " +
                                   shape_text(train) + " have " + std::to_string(channels) +
                                   " channels",
                               "give one mean and one std per channel");
    };
    one_per_channel(n.mean, n.mean_where, "data.normalize.mean");
    one_per_channel(n.std, n.std_where, "data.normalize.std");
  }
  if (settings.augment.spec.enabled() && !train.is_image())
    throw sdk::ConfigError(
        settings.augment.where, "data.augment",
        "augmentation needs images, but the data have sample shape " + shape_text(train),
        "remove [data.augment]; image sources: idx [N, H, W], cifar10, npy "
        "[N, H, W] or [N, C, H, W], synthetic kind = \"images\"");
}

namespace {

// load_data(); `training`: the batches will be augmented, so an augmentation is worth a warning.
LoadedData load_splits(const DataSettings& settings, std::uint64_t seed, bool training) {
  check_named_files_exist(settings);
  LoadedData out;
  if (is_token_source(settings.source)) {
    std::tie(out.train, out.eval) = load_token_splits(settings);
  } else if (settings.source == DataSource::cifar10) {
    std::tie(out.train, out.eval) = load_cifar10_splits(settings, seed);
  } else if (settings.source == DataSource::image_folder) {
    std::tie(out.train, out.eval) = load_image_folder_splits(settings, seed, training);
  } else {
    Dataset all = load_table(settings);
    if (settings.classes > 0) all.classes = std::max(all.classes, settings.classes);
    std::tie(out.train, out.eval) = split_holdout(std::move(all), settings.eval_fraction, seed);
  }
  check_data_settings_fit(settings, out.train);
  if (training) warn_of_a_wide_crop(settings, out.train);
  if (settings.normalize.enabled())
    out.normalization = normalize_splits(settings, out.train, out.eval);
  if (out.train.is_image()) {
    // What a raw 0 pixel becomes: the value crop padding fills in (torchvision pads, then
    // normalises). Computed as normalize_channels computes, so it is that value exactly.
    out.black.assign(static_cast<std::size_t>(out.train.channels()), 0.0f);
    for (std::size_t c = 0; c < out.normalization.mean.size(); ++c)
      out.black[c] =
          normalized_pixel(0.0f, out.normalization.mean[c], out.normalization.std[c]);
  }
  return out;
}

}  // namespace

LoadedData load_data(const DataSettings& settings, std::uint64_t seed) {
  return load_splits(settings, seed, /*training=*/true);
}

LoadedData load_held_out_data(const DataSettings& settings, std::uint64_t seed) {
  if (!is_token_source(settings.source) || settings.eval_token_paths.empty())
    return load_splits(settings, seed, /*training=*/false);
  // The held-out key's files alone (data.tokens.eval, data.text.eval), named at that key.
  check_named_files_exist(settings, ".eval");
  warn_of_files_on_both_sides(settings.token_paths, settings.eval_token_paths);
  const std::string kind = settings.source == DataSource::text ? "text" : "token file";
  LoadedData out;
  out.train = token_data_shape(settings.block_size, settings.vocab_size);
  out.eval = make_token_dataset(read_stream(settings, settings.eval_token_paths),
                                settings.block_size, settings.vocab_size, settings.block_size,
                                stream_origin(kind, settings.eval_token_paths));
  return out;
}

Dataset load_cifar10_held_out(const DataSettings& settings, const Dataset& model_input,
                              const std::string& origin, const ChannelStats& normalization) {
  // The held-out list when given (then the folder is not needed), else the folder: only the keys
  // this session reads are checked to exist.
  const bool listed = !settings.cifar_eval_paths.empty();
  check_named_files_exist(settings, listed ? ".eval" : ".path");
  const auto files =
      listed ? settings.cifar_eval_paths : cifar10_held_out_files(settings.cifar_dir);
  Dataset eval = load_cifar10(files, settings.keep_bytes());
  if (eval.sample_shape != model_input.sample_shape)
    throw sdk::DataError(origin + " records a model of input " + shape_text(model_input) +
                             ", but the held-out CIFAR-10 images are " + shape_text(eval),
                         "evaluate the checkpoint on the data it was trained for (its run's "
                         "config.toml)");
  eval.classes = model_input.classes;
  check_dataset(eval, "CIFAR-10 file '" + files.front().string() + "' against the checkpoint's " +
                          std::to_string(eval.classes) + " classes");
  if (!normalization.mean.empty()) normalize_channels(eval, normalization);
  return eval;
}

Dataset load_image_folder_held_out(const DataSettings& settings, const Dataset& model_input,
                                   const std::string& origin, const ChannelStats& normalization) {
  check_named_files_exist(settings, ".eval");
  const std::vector<std::int64_t> crops = {3, settings.crop_size, settings.crop_size};
  if (model_input.sample_shape != crops)
    throw sdk::DataError(
        origin + " records a model of input " + shape_text(model_input) +
            ", but data.image_folder.size = " + std::to_string(settings.crop_size) +
            " cuts crops of [3, " + std::to_string(settings.crop_size) + ", " +
            std::to_string(settings.crop_size) + "]",
        "evaluate the checkpoint with the config it was trained with (its run's config.toml)" +
            (model_input.sample_shape.size() == 3 ? ", or --set data.image_folder.size=" +
                                                        std::to_string(model_input.sample_shape[1])
                                                  : std::string()));
  const std::vector<std::string> classes = model_input.class_names.empty()
                                               ? image_folder_classes(settings.image_train_dir)
                                               : model_input.class_names;
  const auto listing = list_image_folder(settings.image_eval_dir, &classes);
  Dataset eval = load_image_folder(
      listing, {settings.crop_size, settings.image_spec, settings.check_image_files});
  eval.classes = model_input.classes;
  if (!normalization.mean.empty()) normalize_channels(eval, normalization);
  core_logger("data").info(
      "held-out image folder '" + listing.root.string() +
      "': " + std::to_string(listing.files.size()) + " images, labelled by the " +
      std::to_string(classes.size()) + " class names " +
      (model_input.class_names.empty() ? "of the training folder" : origin + " records"));
  return eval;
}

std::pair<Dataset, Dataset> load_train_and_eval(const DataSettings& settings, std::uint64_t seed) {
  auto loaded = load_data(settings, seed);
  return {std::move(loaded.train), std::move(loaded.eval)};
}

}  // namespace mixtrain::core

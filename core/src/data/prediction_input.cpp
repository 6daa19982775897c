// load_prediction_input: a file of new inputs for `mixtrain predict`, read, shaped and normalised
// as the run's training data were (data/prediction_input.h).
#include "mixtrain/core/data/prediction_input.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "data/file_support.h"
#include "data/image_folder/image_folder.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;

enum class TableFile { npy, idx, cifar10 };

constexpr std::uint64_t kCifarRecord = 1 + 3 * 32 * 32;

// What kind of table file `file` is, by its first bytes (and, for CIFAR-10, its size).
TableFile sniff_table_file(const fs::path& file) {
  data_files::FileReader in(file);
  unsigned char magic[6] = {};
  const auto head = std::min<std::uint64_t>(in.size(), sizeof magic);
  in.read(magic, head, "the file's first bytes");
  static constexpr unsigned char kNpy[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (head == 6 && std::memcmp(magic, kNpy, 6) == 0) return TableFile::npy;
  if (head >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) return TableFile::idx;  // gzip: IDX
  if (head >= 3 && magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08) return TableFile::idx;
  if (in.size() > 0 && in.size() % kCifarRecord == 0) return TableFile::cifar10;
  throw sdk::DataError(
      file.string() + ": not a .npy, IDX or CIFAR-10 batch file (" + std::to_string(in.size()) +
          " bytes, starting neither with \"\\x93NUMPY\" nor an IDX magic, and not a whole "
          "number of 3073-byte CIFAR-10 records)",
      "save the inputs with numpy.save(); an image model also reads IDX (MNIST) and CIFAR-10 "
      "binary batches");
}

std::string dims_text(const std::vector<std::int64_t>& dims) {
  std::string out = "[";
  for (const auto d : dims) out += (out.size() > 1 ? ", " : "") + std::to_string(d);
  return out + "]";
}

// Gives `data` (read as-is by a loader) the model's image shape, or says why it cannot.
void shape_as_images(Dataset& data, const Dataset& trained, ImageLayout layout,
                     const fs::path& file, std::string& how) {
  const auto& want = trained.sample_shape;  // {C, H, W}
  const std::string expected = "the model's images are " + dims_text(want) +
                               " (channels, height, width), as the run's training data were";
  if (data.sample_shape.empty()) {
    if (data.features != trained.features)
      throw sdk::DataError(file.string() + ": rows of " + std::to_string(data.features) +
                               " values, but " + expected + ": " +
                               std::to_string(trained.features) + " values",
                           "give images of the training data's size");
    if (layout != ImageLayout::nhwc) {
      data.sample_shape = want;  // flat rows: channels-first, as flatten() reads them
      how = "flat rows read as channels-first";
      return;
    }
    // Flat rows named channels-last: each row is an [H, W, C] image, permuted below.
    data.sample_shape = {want[1], want[2], want[0]};
  }
  const auto found = data.sample_shape;  // as the file stores each sample
  const std::vector<std::int64_t> as_nhwc = {found[2], found[0], found[1]};
  const bool nchw_fits = found == want, nhwc_fits = as_nhwc == want;
  bool nhwc = false;
  switch (layout) {
    case ImageLayout::nchw:
      if (!nchw_fits)
        throw sdk::DataError(file.string() + ": samples " + dims_text(found) +
                                 " read channels-first (--image-layout nchw), but " + expected,
                             nhwc_fits
                                 ? "the file is channels-last: pass --image-layout nhwc (or auto)"
                                 : "give images of the training data's size and channels");
      break;
    case ImageLayout::nhwc:
      if (!nhwc_fits)
        throw sdk::DataError(file.string() + ": samples " + dims_text(found) +
                                 " read channels-last (--image-layout nhwc) are " +
                                 dims_text(as_nhwc) + " channels-first, but " + expected,
                             nchw_fits
                                 ? "the file is channels-first: pass --image-layout nchw (or auto)"
                                 : "give images of the training data's size and channels");
      nhwc = true;
      break;
    case ImageLayout::automatic:
      // Both fit only when C = H = W, and then the two read the pixels differently.
      if (nchw_fits && nhwc_fits && data.features > 1)
        throw sdk::DataError(
            file.string() + ": samples " + dims_text(found) +
                " fit the model's images both channels-first and channels-last (C = H = W)",
            "say which with --image-layout nchw or --image-layout nhwc");
      if (!nchw_fits && !nhwc_fits)
        throw sdk::DataError(
            file.string() + ": samples " + dims_text(found) +
                " are neither [C, H, W] = " + dims_text(want) +
                " nor [H, W, C] = " + dims_text({want[1], want[2], want[0]}) + "; " + expected,
            "give images of the training data's size and channels, channels-first or "
            "channels-last");
      nhwc = nhwc_fits;
      break;
  }
  if (nhwc) {
    channels_last_to_first(data);
    how = "channels-last, permuted to channels-first";
  } else {
    how = "channels-first";
  }
}

PredictionInput load_table(const PredictionInputSpec& spec, const Dataset& trained,
                           const ChannelStats& normalization) {
  const auto& file = spec.input;
  const TableFile kind = sniff_table_file(file);
  PredictionInput out;
  Dataset& data = out.data;
  const bool labelled = !spec.labels.empty();
  // The pair is read by one loader (a .npy pair, an IDX pair): labels of the other format would
  // fail its magic check with a message about the wrong file's format.
  if (labelled && kind != TableFile::cifar10) {
    const TableFile label_kind = sniff_table_file(spec.labels);
    if (label_kind != kind) {
      const auto name = [](TableFile k) {
        return k == TableFile::npy   ? "a .npy file"
               : k == TableFile::idx ? "an IDX file"
                                     : "a CIFAR-10 batch";
      };
      throw sdk::DataError("--labels " + spec.labels.string() + " is " + name(label_kind) +
                               " but --input " + file.string() + " is " + name(kind),
                           "give the labels in the inputs' format: numpy.save() them beside "
                           "a .npy input, an IDX label file beside IDX images");
    }
  }
  // Byte images stay bytes where the run kept its own so: a quarter of the float form's memory
  // (a uint8 input held as floats peaked at six times its size), decoded batch by batch through
  // the same table, so the predictions are the same bits.
  const bool bytes = trained.is_bytes();
  // The loaders infer the classes from the labels (0): their own check would say to raise the
  // config's classes, but the model's are the checkpoint's, checked below.
  switch (kind) {
    case TableFile::npy:
      data = labelled ? load_npy(file, spec.labels, /*classes=*/0, /*channels_last=*/false, bytes)
                      : load_npy_features(file, bytes);
      break;
    case TableFile::idx:
      data = labelled ? load_idx(file, spec.labels, /*classes=*/0, bytes)
                      : load_idx_images(file, bytes);
      break;
    case TableFile::cifar10:
      if (labelled)
        throw sdk::DataError(file.string() +
                                 " is a CIFAR-10 batch, whose records carry their "
                                 "labels, but --labels " +
                                 spec.labels.string() + " was given too",
                             "leave out --labels");
      data = load_cifar10(std::span<const fs::path>(&file, 1), bytes);
      break;
  }
  const auto max_label = std::max_element(data.y.begin(), data.y.end());
  if (max_label != data.y.end() && *max_label >= trained.classes) {
    const fs::path& labels = kind == TableFile::cifar10 ? file : spec.labels;
    throw sdk::DataError(labels.string() + ": label " + std::to_string(*max_label) + " (row " +
                             std::to_string(max_label - data.y.begin()) +
                             ") does not fit the checkpoint's " + std::to_string(trained.classes) +
                             " classes",
                         "the model predicts the classes it was trained on: give labels 0 to " +
                             std::to_string(trained.classes - 1) +
                             (kind == TableFile::cifar10 ? "" : " (or leave out --labels)"));
  }
  out.labelled_rows = data.y.empty() ? 0 : data.rows;
  if (data.y.empty()) data.y.assign(static_cast<std::size_t>(data.rows), 0);
  data.classes = trained.classes;

  std::string how;
  if (trained.is_image()) {
    shape_as_images(data, trained, spec.layout, file, how);
    if (!normalization.mean.empty()) normalize_channels(data, normalization);
  } else {
    if (data.features != trained.features)
      throw sdk::DataError(
          file.string() + ": rows of " + std::to_string(data.features) +
              " features, but the model reads " + std::to_string(trained.features) +
              " (the training data's width)",
          "give one row of " + std::to_string(trained.features) + " features per sample");
    data.sample_shape.clear();  // the model reads plain rows, whatever their original rank
  }
  check_dataset(data, file.string());
  out.description =
      std::to_string(data.rows) +
      (trained.is_image() ? " images " + dims_text(data.sample_shape) + " (" + how + ")"
                          : " rows of " + std::to_string(data.features) + " features") +
      " from " + file.string() + (out.labelled_rows > 0 ? ", labelled" : ", unlabelled");
  return out;
}

// Image files for a model trained on an image folder: one image, a folder of images (unlabelled,
// in name order), or a folder of class folders (labelled by the training folder's class names,
// in torchvision's ImageFolder order), each cut as the run's held-out images are (Resize, then
// CenterCrop) when its batch is drawn.
PredictionInput load_image_files(const PredictionInputSpec& spec, const DataSettings& settings,
                                 const Dataset& trained, const ChannelStats& normalization) {
  const auto& input = spec.input;
  if (settings.source != DataSource::image_folder)
    throw sdk::DataError(
        "--input " + input.string() +
            " is image files, but this model was trained on data.source "
            "= \"" +
            std::string(choice_name(settings.source, kDataSources)) +
            "\", which does not say how to crop and scale an image of any size to its " +
            dims_text(trained.sample_shape),
        "save the images at that size with numpy.save() (uint8, [N, H, W, C] with "
        "--image-layout nhwc)");
  if (!spec.labels.empty())
    throw sdk::DataError("--labels " + spec.labels.string() + " was given with image files",
                         "a folder of class folders labels its images by their folder; leave "
                         "out --labels");
  if (trained.height() != settings.crop_size || trained.width() != settings.crop_size)
    throw sdk::DataError("the model reads " + dims_text(trained.sample_shape) +
                             " images, but data.image_folder.size is " +
                             std::to_string(settings.crop_size),
                         "predict with the config the model was trained with (its run's "
                         "config.toml)");
  std::error_code ec;
  ImageFolderListing listing;
  listing.root = input;
  bool labelled = false;
  if (!fs::is_directory(input, ec)) {
    listing.files = {input};
  } else {
    bool has_folders = false;
    std::int64_t others = 0;
    fs::path undecoded;  // a format torchvision reads and mixtrain does not decode
    for (const auto& entry : fs::directory_iterator(input, ec)) {
      if (entry.is_directory()) {
        has_folders = true;
      } else if (is_image_file_name(entry.path())) {
        listing.files.push_back(entry.path());
      } else {
        ++others;
        if (undecoded.empty() && is_undecoded_image_name(entry.path())) undecoded = entry.path();
      }
    }
    std::sort(listing.files.begin(), listing.files.end());
    if (has_folders && !listing.files.empty())
      throw sdk::DataError(
          "--input " + input.string() +
              " holds both images and folders: neither a folder of "
              "images nor one of class folders",
          "give a folder of the images alone (predicted unlabelled), or one of class folders "
          "(labelled by them)");
    if (!has_folders) {
      // As a training folder's: a format torchvision reads but mixtrain does not decode is said,
      // not dropped from the rows; other files are left out, counted.
      if (!undecoded.empty())
        throw sdk::DataError("--input " + input.string() + " holds " +
                                 undecoded.filename().string() +
                                 ", an image format mixtrain does not decode",
                             "convert it to PNG or JPEG, or move it out of the folder");
      listing.skipped = others;
    }
    if (has_folders) {
      // Class folders, labelled by the names the model was trained on (its checkpoint's
      // record; a record without them leaves the training folder's).
      std::vector<std::string> classes = trained.class_names;
      if (classes.empty()) try {
          classes = image_folder_classes(settings.image_train_dir);
        } catch (const sdk::DataError& e) {
          throw sdk::DataError("--input " + input.string() +
                                   " is a folder of class folders, labelled by the training "
                                   "folder's class names, which cannot be read: " +
                                   e.what(),
                               "predict where data.image_folder.train is, or give a folder of "
                               "the images themselves (predicted unlabelled)");
        }
      listing = list_image_folder(input, &classes);
      labelled = true;
    } else if (listing.files.empty()) {
      throw sdk::DataError("--input " + input.string() + " holds no .jpg, .jpeg or .png file",
                           "give an image, a folder of images, or a folder of class folders");
    }
  }
  // Unlabelled rows get class 0, a valid one, so the Dataset keeps its contract.
  if (!labelled) listing.labels.assign(listing.files.size(), 0);
  ImageFolderOptions options{settings.crop_size, settings.image_spec, /*check_files=*/true};
  PredictionInput out;
  out.data = load_image_folder(listing, options);
  out.data.classes = trained.classes;
  if (!normalization.mean.empty()) normalize_channels(out.data, normalization);
  out.labelled_rows = labelled ? out.data.rows : 0;
  for (const auto& f : listing.files)
    out.row_names.push_back(fs::is_directory(input, ec) ? fs::relative(f, input, ec).string()
                                                        : f.filename().string());
  out.description =
      std::to_string(out.data.rows) + " image" + (out.data.rows == 1 ? "" : "s") + " from " +
      input.string() + ", each resized to " + std::to_string(settings.image_spec.resize) +
      " on its shorter side and cut to " + dims_text(trained.sample_shape) + " at its centre" +
      (labelled ? ", labelled by class folder (rows in torchvision's ImageFolder order)"
                : ", unlabelled (rows in file-name order)") +
      (listing.skipped > 0 ? "; " + std::to_string(listing.skipped) + " other files left out"
                           : std::string());
  return out;
}

PredictionInput load_windows(const PredictionInputSpec& spec, const DataSettings& settings,
                             const Dataset& trained) {
  const auto& file = spec.input;
  if (!spec.labels.empty())
    throw sdk::DataError("--labels " + spec.labels.string() +
                             " was given for a language model, whose targets are the input's "
                             "own next tokens",
                         "leave out --labels");
  const std::int64_t T = trained.features;
  const std::int64_t stride = spec.stride == 0 ? T : spec.stride;
  if (stride < 1)
    throw sdk::DataError("--stride " + std::to_string(spec.stride) + " is negative",
                         "give the tokens between window starts (0: the block size)");
  const bool text = settings.source == DataSource::text;
  // Token ids saved with numpy.save() are a likely input; neither stream format reads them, and
  // the text reader's own refusal would offer the npy source, which a language model cannot read.
  bool npy = false;
  try {
    npy = sniff_table_file(file) == TableFile::npy;
  } catch (const sdk::UserError&) {
    // Not a table file: the stream's own reader says what it is.
  }
  if (npy)
    throw sdk::DataError(
        "--input " + file.string() +
            " is a NumPy .npy file, but a language model predicts from a token stream: " +
            (text ? "this one (data.source = \"text\") reads a plain text file, each byte a token"
                  : "this one (data.source = \"tokens\") reads an llm.c token file"),
        text ? "pass the text itself as --input (it is cut into windows of the model's block "
               "size); ids in an .npy are no text"
             : "write the ids as an llm.c token file: a header of 256 int32 (20240520, 1, the "
               "count, then zeros) and the ids as uint16, e.g. np.concatenate([np.array([20240520, "
               "1, ids.size] + [0] * 253, '<i4').view('<u2'), ids.ravel().astype('<u2')])"
               ".tofile('in.bin')");
  std::vector<std::int32_t> tokens = text ? load_text_tokens(std::span<const fs::path>(&file, 1))
                                          : load_token_file(file, trained.classes);
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n < T)
    throw sdk::DataError(file.string() + " holds " + std::to_string(n) +
                             " tokens, fewer than one window of the model's block size " +
                             std::to_string(T),
                         "give at least " + std::to_string(T) +
                             " tokens (`mixtrain sample` continues a shorter prompt)");
  PredictionInput out;
  const std::int64_t windows = (n - T) / stride + 1;
  // The last window's final target is the token after the file: a placeholder (id 0) keeps the
  // Dataset whole, and that window is left out of the loss.
  const bool last_unlabelled = (windows - 1) * stride + T == n;
  if (last_unlabelled) tokens.push_back(0);
  out.data = make_token_dataset(std::move(tokens), T, trained.classes, stride,
                                (text ? "text '" : "token file '") + file.string() + "'");
  out.labelled_rows = windows - (last_unlabelled ? 1 : 0);
  out.description = std::to_string(windows) + " windows of " + std::to_string(T) +
                    " tokens every " + std::to_string(stride) + " from " + file.string() + " (" +
                    std::to_string(n) + " tokens)";
  return out;
}

}  // namespace

ImageLayout parse_image_layout(const std::string& name) {
  if (name == "auto") return ImageLayout::automatic;
  if (name == "nchw") return ImageLayout::nchw;
  if (name == "nhwc") return ImageLayout::nhwc;
  throw std::invalid_argument("unknown image layout '" + name + "'");
}

PredictionInput load_prediction_input(const PredictionInputSpec& spec, const DataSettings& settings,
                                      const Dataset& trained, const ChannelStats& normalization) {
  if (trained.is_tokens()) return load_windows(spec, settings, trained);
  std::error_code ec;
  if (trained.is_image() && (is_image_file_name(spec.input) || fs::is_directory(spec.input, ec)))
    return load_image_files(spec, settings, trained, normalization);
  return load_table(spec, trained, normalization);
}

}  // namespace mixtrain::core

// The data `mixtrain predict` runs a trained model on: one file, in a form the model's data
// source reads, shaped and normalised as the training data were.
//
// Contract
// - Table models (the training data are feature rows or images) read, recognised by content:
//     a NumPy .npy file (magic "\x93NUMPY"): load_npy's dtypes and shapes (uint8 scaled by /255,
//       as torchvision's ToTensor scales);
//     an IDX image file (gzip or plain; magic 0x0803 after decompression): load_idx's shapes;
//     a CIFAR-10 binary batch (any other file whose size is a whole number of 3073-byte records;
//       its labels come with it).
//   `labels` (optional; .npy with a .npy input, IDX with an IDX input) gives each row a class
//   below the model's; without it no row is labelled.
// - Image files, for a model trained on an image folder: --input names one .jpg, .jpeg or .png
//   file, a folder of them (unlabelled, rows in file-name order) or a folder of class folders
//   (labelled by the training folder's class names, rows in torchvision's ImageFolder order); each
//   cut as the run's held-out images are (data.image_folder: Resize, then CenterCrop) when its
//   batch is drawn. A folder of both images and folders, or a plain folder holding a format
//   torchvision reads and mixtrain does not decode, is an sdk::DataError; other files are left
//   out, counted in the description. row_names lists each row's file.
// - Images: the model expects the training data's {C, H, W}. An input of samples [d1, d2, d3] is
//   read per `layout`: nchw takes it as {C, H, W}, nhwc as {H, W, C} (then permuted to
//   channels-first), auto as whichever of the two is the model's shape; when both are (C = H =
//   W) auto is refused as ambiguous. [N, H, W] is one channel, and flat [N, C·H·W] rows are taken
//   as channels-first. Then the run's normalisation (`normalization`, possibly computed from its
//   training split) is applied, exactly as to the training data.
// - Plain features: the input's features per row (its trailing dimensions' product) must be the
//   model's.
// - Token models: the config's source says the file's form: tokens = an llm.c token file, text =
//   the file's bytes. Window r is the T tokens from r·stride (stride 0: T, non-overlapping, as
//   evaluation cuts them), for every r whose window fits; its targets are the next tokens, so
//   every window is labelled except the last when the stream ends with it (its last target
//   would be the token after the file). With stride T those labelled windows are exactly the
//   ones `eval` cuts from the same file.
// - labelled_rows: the labelled rows are rows [0, labelled_rows); an unlabelled row has label 0
//   (a valid class) so the Dataset keeps its contract.
// - Errors are sdk::DataError naming the file, what was found and what the model expects, with
//   the option (`--image-layout`, `--labels`, `--stride`) that fixes it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "mixtrain/core/data/dataset.h"

namespace mixtrain::core {

struct DataSettings;  // config/experiment.h

enum class ImageLayout { automatic, nchw, nhwc };
// "auto", "nchw", "nhwc"; std::invalid_argument on anything else (callers validate user input).
ImageLayout parse_image_layout(const std::string& name);

struct PredictionInputSpec {
  std::filesystem::path input;
  std::filesystem::path labels;  // empty: none
  ImageLayout layout = ImageLayout::automatic;
  std::int64_t stride = 0;  // token models: tokens between window starts; 0: the block size
};

struct PredictionInput {
  Dataset data;  // the training data's form, sample shape and classes
  std::int64_t labelled_rows = 0;
  std::string description;  // "512 images [3, 32, 32] from x.npy (channels-last)" for the log
  // Image files: each row's file, relative to the input folder (predict writes them beside its
  // output); empty for other inputs, whose rows are the file's own.
  std::vector<std::string> row_names;
};

// `trained` is the run's training split (its form, shape and classes); `settings` its [data].
PredictionInput load_prediction_input(const PredictionInputSpec& spec, const DataSettings& settings,
                                      const Dataset& trained, const ChannelStats& normalization);

}  // namespace mixtrain::core

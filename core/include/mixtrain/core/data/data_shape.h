// What a model of a table or image source takes from its data, recorded in every checkpoint it
// writes (metadata "data_shape", and its exports'), so `predict` builds the model from a
// checkpoint without the training files that first gave the shape.
//
// Contract
// - DataShape describes a table Dataset (dataset.h) without its rows: features per row, the
//   sample shape ({} plain features, {C, H, W} an image), the class count, and whether the images
//   are kept as bytes (the byte-image form), and the classes' names where the data give them (an
//   image folder's class folders, in label order), so that a session without the training folder
//   labels held-out images by the names the model learned. Token data are not described: their
//   shape is the config's (block_size, vocab_size).
// - data_shape_of(): std::logic_error for a token dataset (a caller bug).
// - dataset_of_shape(): a Dataset of that form with rows = 0: x, y and pixels empty; byte images
//   get the pixel table a loader writes (b / 255 per channel) with `normalization` applied as
//   normalize_channels() applies it, so a batch loaded from a file and normalised the same way
//   has an equal table. `normalization` empty: none; otherwise one mean and std > 0 per channel
//   of an image (std::invalid_argument, as normalize_channels()).
// - data_shape_json() / parse_data_shape() round-trip the record:
//   {"features": N, "sample_shape": [...], "classes": K, "pixels": "uint8" | "float32"} and, when
//   there are names, "class_names": [at most K distinct non-empty strings].
//   parse_data_shape() throws sdk::CheckpointError naming `origin` (the checkpoint) and the entry
//   when the text is not that object or a value is out of range (features in [1, 2^40], classes in
//   [1, 2^31), sample_shape {} or three dimensions >= 1 whose product is features, uint8 only for
//   images, class names as above).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/core/data/dataset.h"

namespace mixtrain::core {

struct DataShape {
  std::int64_t features = 0;
  std::vector<std::int64_t> sample_shape;  // {} or {C, H, W}
  std::int32_t classes = 0;
  bool bytes = false;  // images kept as bytes (Dataset::is_bytes())
  std::vector<std::string> class_names;  // Dataset::class_names

  bool operator==(const DataShape&) const = default;
};

DataShape data_shape_of(const Dataset& data);
Dataset dataset_of_shape(const DataShape& shape, const ChannelStats& normalization);

std::string data_shape_json(const DataShape& shape);
DataShape parse_data_shape(std::string_view text, const std::string& origin);

}  // namespace mixtrain::core

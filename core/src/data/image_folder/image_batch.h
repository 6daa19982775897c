// Batches cut from an image-file split (core/data/dataset.h's image-file form): each row's file
// decoded (image_file.h) and cropped as torchvision's ImageNet transforms crop it
// (image_resample.h), into the byte-image batch [rows, 3, H, W] the rest of the pipeline
// carries: a training batch by RandomResizedCrop then RandomHorizontalFlip, any other batch by
// Resize then CenterCrop.
//
// Contract:
// - Sample i of a training batch draws from DataRng(seed, augment_stream(batch, first_row + i))
//   alone (the box's draws, then the flip's uniform() < 0.5 when `flip`), so a batch is the same
//   whatever the thread count, the number of ranks sharing it (first_row, as augment_batch
//   takes it) or what was drawn before: a resumed run cuts the same crops.
// - Rows are decoded on up to data.image_spec.threads threads of the caller's; the first failure
//   in row order is rethrown after every thread has stopped: an sdk::DataError naming the file
//   (its message is image_file.h's), with the row.
// - std::logic_error unless data.is_image_files(); std::out_of_range on a row outside the split.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "mixtrain/core/data/dataset.h"

namespace mixtrain::core {

void decode_image_rows(const Dataset& data, std::span<const std::int64_t> rows,
                       std::optional<std::uint64_t> training_batch, std::uint64_t seed,
                       std::uint64_t first_row, bool flip, std::uint8_t* pixels_out,
                       std::int32_t* y_out);

// The same batch decoded through the split's table into floats, x_out [rows, 3, H, W]: for a
// backend that takes no byte input (the values the device's decode gives).
void decode_image_rows_as_floats(const Dataset& data, std::span<const std::int64_t> rows,
                                 std::optional<std::uint64_t> training_batch, std::uint64_t seed,
                                 std::uint64_t first_row, bool flip, float* x_out,
                                 std::int32_t* y_out);

// At most `most` rows of an image-file split, evenly spaced (row ⌊k · rows / n⌋ for k < n), cut by
// the held-out transform into an in-memory byte-image Dataset with the same table: what
// channel_statistics() measures of a folder too large to decode whole.
Dataset decoded_sample(const Dataset& data, std::int64_t most);

}  // namespace mixtrain::core

// The byte-image form's helpers that the loaders share (internal to the core): the table a freshly
// loaded image's bytes decode through. dataset.h describes the form.
#pragma once

#include <cstdint>
#include <vector>

#include "mixtrain/core/data/dataset.h"

namespace mixtrain::core {

// fp32 [channels, 256]: byte b of every channel stands for b / 255, in float, exactly what the
// loaders write for a byte when they decode it at load.
std::vector<float> unit_byte_values(std::int64_t channels);

// `rows` byte images [rows, width] (width = channels · plane, channels-first) decoded through
// their table [channels, 256] into out [rows, width]: each byte of channel c is table[c][byte].
void decode_bytes(const std::vector<float>& table, std::int64_t channels, std::size_t width,
                  std::size_t rows, const std::uint8_t* bytes, float* out);

// Turns `data` (rows, features, sample_shape set; x sized) into byte images holding `bytes`
// ([rows, features], channels-first), or, without `keep_bytes`, decodes them into x as b / 255.
void store_image_bytes(Dataset& data, std::vector<std::uint8_t> bytes, bool keep_bytes);

}  // namespace mixtrain::core

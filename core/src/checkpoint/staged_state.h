// A training state staged for a checkpoint: each tensor's name, dtype and shape, and how to read
// its bytes, which stay where training keeps them (the backend's memory) until a checkpoint
// format asks for them. A format with the streamed_write facet (sdk/format_streamed_write.h)
// reads them one at a time, so a save holds about one tensor on the host beyond what training
// holds; any other format gets the whole state read first (materialise), as write() takes it.
//
// Contract
// - StagedTensor::read(buffer) returns the tensor's bytes (shape × dtype size long): written into
//   `buffer` (that long, or empty when the tensor is held, below) or bytes it holds, valid until
//   its next call. Each call gives the same bytes while the training state does not change.
//   `held` marks a tensor whose bytes are already on the host (a data-parallel gather's), which
//   read hands out without a copy, whatever buffer it is given.
// - write_staged() writes through the facet where the format offers it, else materialises and
//   calls write(); what a read throws propagates unchanged either way, and the file is then not
//   written (the formats' contract).
// - Single-threaded: reads run on the caller's thread, between steps.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/format_streamed_write.h"

namespace mixtrain::core {

struct StagedTensor {
  sdk::StreamedTensor info;
  std::function<std::span<const std::byte>(std::span<std::byte> buffer)> read;
  bool held = false;
};

struct StagedState {
  std::vector<StagedTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// The tensor's size in bytes, from its shape and dtype.
std::size_t staged_bytes(const sdk::StreamedTensor& t);

// Every tensor read onto the host: the TrainingState CheckpointFormat::write() takes.
sdk::TrainingState materialise(const StagedState& state);

void write_staged(const sdk::CheckpointFormat& format, const std::filesystem::path& path,
                  const StagedState& state);

}  // namespace mixtrain::core
